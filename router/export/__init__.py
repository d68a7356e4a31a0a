"""router/export/: each engine's config of a policy set's decisions, and the serving engines' registry."""
