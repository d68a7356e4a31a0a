"""Prompts in: parse and check prompt files, store them as named sets."""
