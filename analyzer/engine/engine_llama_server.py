"""The llama-server entry of the registry: llama.cpp's own C++ server. Its analyses are not runs
(``specroute llama-server analyze``: analyzer/analysis/server_analysis.py measures acceptance by replaying
the server's own drafting rules and prices from the server's own ``timings``), so every run method
refuses and says which command analyzes in it. The entry routes: a policy set published from such an
analysis (router/server_policy.py) decides per task a drafter setting, and this entry turns a decision
into the pool that runs it and that pool's command-line flags."""

from __future__ import annotations

import functools
from typing import Any

from analyzer.engine.engine_base import LLAMA_SERVER
from analyzer.engine.engine_runless import RunlessEngine
from analyzer.measuring.server_drafting import parse_drafter


class LlamaServerEngine(RunlessEngine):
    """llama-server, as :class:`analyzer.engine.engine_base.Engine` describes an engine; it measures and
    prices in its own analyses, not in runs (so ``measures`` is False: no run names it)."""

    name = LLAMA_SERVER
    analyzes_settings = True
    refusal = (
        "llama-server is analyzed with 'specroute analyze --engine llama-server' (or 'specroute llama-server "
        "analyze'), not as an analysis run: runs measure in transformers or llama.cpp"
    )

    def require_installed(self) -> None:
        """Raise :class:`analyzer.engine.llama_server.LlamaServerMissing` (naming the build command) unless
        a llama-server binary is where specroute looks."""
        from analyzer.engine.llama_server import find_llama_server
        from analyzer.settings import load_settings

        settings = load_settings()
        find_llama_server(settings.llama_server, settings.resolved_data_dir() / "cache")

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
