"""The engines ``specroute export`` writes for: the registry (:data:`EXPORTERS`), and the two engines that run
on one machine or per call, with the field names their documentation gives (docs/export.md cites each):

- llama-server: ``--spec-type`` and its drafter's flags (one setting per server: pools);
- transformers: the assistant's generation_config (``num_assistant_tokens``, its schedule, the confidence
  threshold; or nothing, where its defaults were priced faster) or ``prompt_lookup_num_tokens`` /
  ``max_matching_ngram_size``, per generate() call.

The GPU serving engines (vLLM, SGLang, TensorRT-LLM) are in :mod:`router.export.export_gpu`; what every export
shares is in :mod:`router.export.export_config`."""

from __future__ import annotations

import json
from typing import Any

from analyzer.engine.llama_server_pools import pool_flags
from analyzer.pricing.policy_curve import decision_rule
from router.export.export_config import (
    Export,
    Exporter,
    Value,
    comment,
    gamma_source,
    header,
    model_draft,
    numbers,
    provenance_lines,
    render_json,
    served_target,
)
from router.export.export_plan import ExportError, ExportPlan, GroupPlan


class LlamaServerExporter(Exporter):
    name, title = "llama-server", "llama-server"
    aliases = ("llama-server", "llamaserver")
    formats = ("flags", "json")
    doc_url = "https://github.com/ggml-org/llama.cpp/blob/master/tools/server/README.md"
    default_port = 8081
    runs_settings = True

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
                f"{'workload' if g.task == '*' else g.task}: {numbers(g)}" for g in tasks
            )
            return [Value(flags[i], flags[i + 1], source) for i in range(0, len(flags), 2)]
        draft, source = model_draft(plan, gguf=True), gamma_source(plan, gamma, group)
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
        model = plan.server["model"] if plan.server else served_target(plan, gguf=True)
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


class TransformersExporter(Exporter):
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
        if model_draft(plan) is None:
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
        if defaults is not None and model_draft(plan) is not None:
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
                        model_draft(plan),
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
        if model_draft(plan) is not None:
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
        draft = model_draft(plan)
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
            why = entry["values"][0]["from"] if entry["uses"] == "defaults" else numbers(group)
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
