"""The bundled sample workload (sample_prompts.jsonl) and its license table (LICENSES.md), read as package data."""
