"""The analyzer: measure acceptance and cost on your prompts, price every gamma, store and report it (no Flask)."""
