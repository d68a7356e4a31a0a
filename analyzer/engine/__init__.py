"""Engines: the protocol and the registry, and each engine's way to load a pair, measure and price in its
own runtime (transformers and its cost modes, llama.cpp, imported profiles)."""
