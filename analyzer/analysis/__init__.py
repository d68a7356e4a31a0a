"""Analysis runs: bookkeeping, chunks spread over workers, execution, the validation step, re-pricing a run
and the engines' own benchmarks it can be priced with."""
