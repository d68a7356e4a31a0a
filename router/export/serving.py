"""The serving engines, one entry each with the capabilities it has: its terms in a routing decision (the
``engine`` object of ``/v1/route``: :data:`analyzer.engine.engines.SERVING`'s entry), its export (``specroute
export --for``: router/export/export_engines.py, router/export/export_gpu.py, whose commands are also its pools' command
lines), and how it reports a generation's speculation in feedback (router/decide/feedback_formats.py). An engine has
only what it can: TensorRT-LLM exports but sends no per-request counts; llama-cpp-python (``llama.cpp``) is told
its terms in each decision but has no server to export. The export pages, ``specroute export`` and the
feedback path ask this registry; nothing outside an engine's own module reads a result by an engine's name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from analyzer.engine.engine_base import ServingEngine
from analyzer.engine.engines import SERVING
from analyzer.names import LLAMA_CPP, LLAMA_SERVER, TRANSFORMERS
from router.decide.feedback_formats import FEEDBACK_FORMATS, FeedbackFormat
from router.export.export_config import Exporter
from router.export.export_engines import LlamaServerExporter, TransformersExporter
from router.export.export_gpu import SglangExporter, TrtllmExporter, VllmExporter
from router.export.export_plan import ExportError, ExportPlan


@dataclass(frozen=True)
class ServingEntry:
    """One serving engine: its ``name`` (as ``--for`` and a decision's ``engine`` object name it), its terms in
    a routing decision (``decides``; None: a decision carries none), its export (``exporter``; None: nothing to
    export) and its feedback section (``feedback``; None: it reports plain counts, if anything)."""

    name: str
    decides: ServingEngine | None = None
    exporter: Exporter | None = None
    feedback: FeedbackFormat | None = None

    def settings_in(self, decision: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """This engine's settings in a routing decision as the router answered it (None: none for it, as for a
        llama-server setting in transformers)."""
        return self.decides.settings_in(decision) if self.decides is not None else None


SERVING_ENGINES: dict[str, ServingEntry] = {
    e.name: e
    for e in (
        ServingEntry("vllm", exporter=VllmExporter(), feedback=FEEDBACK_FORMATS["vllm"]),
        ServingEntry("sglang", exporter=SglangExporter(), feedback=FEEDBACK_FORMATS["sglang"]),
        ServingEntry("trtllm", exporter=TrtllmExporter()),
        ServingEntry(
            LLAMA_SERVER,
            SERVING[LLAMA_SERVER],
            exporter=LlamaServerExporter(),
            feedback=FEEDBACK_FORMATS[LLAMA_SERVER],
        ),
        ServingEntry(TRANSFORMERS, SERVING[TRANSFORMERS], exporter=TransformersExporter()),
        ServingEntry(LLAMA_CPP, SERVING[LLAMA_CPP]),
    )
}
# what exports, in the order ``--for`` offers it
EXPORTERS: dict[str, Exporter] = {
    name: e.exporter for name, e in SERVING_ENGINES.items() if e.exporter is not None
}


def exporter_named(name: str) -> Exporter:
    """The exporter for ``--for NAME``; ExportError naming the known ones otherwise."""
    try:
        return EXPORTERS[name]
    except KeyError:
        raise ExportError(f"unknown engine {name!r} for export; use one of: {', '.join(EXPORTERS)}") from None


def render_export(
    plan: ExportPlan,
    engine: str,
    fmt: str | None = None,
    *,
    strict: bool = False,
    first_port: int | None = None,
) -> str:
    """``plan`` exported for ``engine`` in ``fmt`` (None: the engine's first format)."""
    exporter = exporter_named(engine)
    chosen = fmt or exporter.formats[0]
    if chosen not in exporter.formats:
        raise ExportError(f"{exporter.title} exports as {', '.join(exporter.formats)}, not {chosen!r}")
    return exporter.render(exporter.export(plan, strict=strict, first_port=first_port), chosen)
