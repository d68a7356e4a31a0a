"""The llama-server entry of the registry: llama.cpp's own C++ server. Its analyses are not runs
(``specroute analyze --engine llama-server``: analyzer/analysis/server_analysis.py measures acceptance by
replaying the server's own drafting rules and prices from the server's own ``timings``), so it is no
:class:`analyzer.engine.engine_base.MeasuringEngine`: it serves (:class:`ServingEngine`: a policy set
published from such an analysis decides per task a drafter setting, and this entry turns a decision into the
pool that runs it and that pool's command-line flags) and its step costs are fitted from the servers' timings
(:class:`CostSource`)."""

from __future__ import annotations

import functools
from typing import Any, Mapping

from analyzer.measuring.server_drafting import parse_drafter
from analyzer.names import LLAMA_SERVER


class LlamaServerEngine:
    """llama-server: a serving engine whose analyses compare its own settings, and the source of step costs
    fitted from its servers' timings (``measures`` False: no run measures in it)."""

    name = LLAMA_SERVER
    analyzes_settings = True
    measures = False

    def profile_note(self, profile: dict[str, Any]) -> str | None:
        """Its step costs are fitted from its servers' timings in its own analyses (their fit errors are
        shown there), never a run's profile: no note."""
        return None

    def settings_in(self, decision: Mapping[str, Any]) -> Mapping[str, Any] | None:
        return decision["engine"].get(self.name)

    def decision_settings(
        self,
        speculate: bool,
        gamma: int,
        draft_kind: str,
        ngram_max: int,
        pool: str,
        setting: str | None = None,
    ) -> dict[str, Any] | None:
        """The pool and its server's flags: the drafter ``setting`` the task's policy names (flags as
        ``llama-server`` takes them; draft-simple also needs ``-md`` with the draft model), or a plain
        pool. None for a policy set published from an analysis run (``draft_kind`` is then the run's
        draft, not "llama-server"): a run's gamma is no llama-server drafter setting."""
        if draft_kind != LLAMA_SERVER:
            return None
        if not speculate:
            return {"pool": pool, "setting": "off", "flags": []}
        if setting is None:
            return None
        return {"pool": pool, "setting": setting, "flags": list(_flags(setting))}


@functools.lru_cache(maxsize=256)
def _flags(setting: str) -> tuple[str, ...]:
    """A setting's server flags, parsed once per label (the decision path asks for them per request)."""
    return tuple(parse_drafter(setting).server_flags())
