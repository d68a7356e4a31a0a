"""Models: spec strings, loading them offline on a device in a dtype, and whether a target and a draft
tokenize alike."""
