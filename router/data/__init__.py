"""Package data of the router: the bundled labelled corpus (corpus.jsonl, with its license table) and
its precomputed sentence embeddings."""
