"""Measuring on this machine, engine-neutral: exact acceptance from one target generation and one draft
pass, the cost of drafting and verifying, interference, and real speculative decoding to validate."""
