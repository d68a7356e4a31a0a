"""router/policies/: policy sets: published from a run or a llama-server analysis, versioned, as JSON records."""
