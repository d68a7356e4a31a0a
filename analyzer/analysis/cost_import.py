"""Cost profiles from an engine's own benchmarks (``specroute costs import FILE``, the web UI's cost
profiles page): the step times vLLM, SGLang, TensorRT-LLM or llama.cpp measure with CUDA graphs and
fused kernels, stored beside the profiles analyses measure, to price stored acceptance with
(:mod:`analyzer.analysis.repricing`). The acceptance side of speculative decoding is engine-independent (the
same greedy tokens); the cost side must come from the engine that serves.

A file is JSON (one profile object, a list of them, or ``{"profiles": [...]}``) or CSV (a header,
then one profile per row). Each profile gives the engine (and its version), the device, the dtype,
the batch size, optionally the pair (``target`` and ``draft`` model specs; else the pair of the run
named on import) and its step times in milliseconds, in one of two shapes:

- **forwards**: ``target_step_ms`` = T_t(1..K), one target forward over k new tokens with a warm
  cache, and ``draft_step_ms`` (one draft step: a model's single-token forward, or one n-gram
  lookup), with optional ``round_overhead_ms`` / ``decode_overhead_ms`` (the engine's own time per
  speculative round and per plain step);
- **rounds**: ``plain_step_ms`` (one plain decoding step) and ``round_ms`` = the whole speculative
  round at num_speculative_tokens = 1..K (drafting, verifying and bookkeeping), what an engine's
  latency benchmark gives at several num_speculative_tokens. It is stored as T_t(1) = plain step,
  T_t(k+1) = round at k, with no separate draft cost or overhead.

In CSV the list columns are ``t1_ms, t2_ms, ...`` (forwards) or ``round1_ms, round2_ms, ...``
(rounds). The whole file is checked before anything is stored: every problem is reported with its
line and field, and nothing is stored if there is one. Refused like a bad value:

- an implausible magnitude: a step time (``target_step_ms``, ``plain_step_ms``, ``round_ms``) under
  MIN_STEP_MS (times in seconds, most likely) or any time over MAX_STEP_MS (in microseconds, or a
  whole generation), a batch size over MAX_BATCH_SIZE, more than MAX_K step times; a draft step of 0
  stays allowed (an n-gram lookup);
- a physically implausible shape (T(k)/T(1) below 0.9, or above 1.5 k; a round above 3 (g + 1) plain
  steps);
- a profile already stored (:func:`analyzer.analysis.cost_import_store.store_imported_profiles`: the
  same engine, engine_version, device, dtype, batch size, pair and times), or one the file gives twice;
- a ``target`` or ``draft`` that no stored run or model spec knows (a typo, most likely), unless the
  import is told it is a new pair (``new_pair``: ``--new-pair``, the web form's "new pair" box).

The import is three modules: :mod:`analyzer.analysis.cost_import_parse` reads a file
(:func:`~analyzer.analysis.cost_import_parse.parse_cost_file`), :mod:`analyzer.analysis.cost_import_checks`
checks each profile (the limits above are there), :mod:`analyzer.analysis.cost_import_store` stores them
(:func:`~analyzer.analysis.cost_import_store.store_imported_profiles`). This module holds what they share:
the checked profile (:class:`ImportedProfile`) and the error that lists a file's problems
(:class:`CostFileError`).
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field as dataclass_field

from analyzer.errors import SpecrouteError

MAX_LISTED = 50  # problems listed in a rejection (the total is always given)
SAME_FIELDS = "engine, engine_version, device, dtype, batch_size, target, draft and times"


class CostFileError(SpecrouteError, ValueError):
    """A cost profile file was rejected: ``problems`` (the first MAX_LISTED, in file order, each
    naming its line and field) and ``total``; nothing was stored."""

    status, code = 400, "invalid_cost_file"

    def __init__(self, filename: str, problems: list[str]):
        self.filename, self.problems, self.total = filename, problems[:MAX_LISTED], len(problems)
        noun = "problem" if self.total == 1 else "problems"
        super().__init__(
            f"{filename}: {self.total} {noun}; nothing was imported", problems=self.problems, total=self.total
        )

    def report(self) -> str:
        """The summary, then one line per listed problem."""
        lines = [str(self)] + [f"  {p}" for p in self.problems]
        if self.total > len(self.problems):
            lines.append(f"  ... and {self.total - len(self.problems)} more")
        return "\n".join(lines)


@dataclass(frozen=True)
class ImportedProfile:
    """One checked profile of a file, in seconds as profiles store them; ``line`` is where it starts."""

    line: int
    engine: str
    engine_version: str | None
    device: str
    dtype: str
    batch_size: int
    target: str | None
    draft: str | None
    target_forward_s: list[float]
    draft_step_s: float
    round_overhead_s: float | None
    decode_overhead_s: float | None
    shape: str  # forwards | rounds
    # the line of each field the row gave (a JSON object's fields may each have their own line)
    field_lines: dict[str, int] = dataclass_field(default_factory=dict, compare=False)

    def line_of(self, name: str) -> int:
        """The line of field ``name``, else the line where the profile starts."""
        return self.field_lines.get(name, self.line)

    def times_s(self) -> tuple:
        """Every time of the profile, in seconds (None for an overhead not given): what makes two
        profiles of one engine, device, dtype, batch size and pair the same."""
        return (
            tuple(self.target_forward_s),
            self.draft_step_s,
            self.round_overhead_s,
            self.decode_overhead_s,
        )
