"""The GPU serving engines ``specroute export`` writes for (:mod:`router.export.export_engines` holds the registry),
with the field names and value ranges their current documentation gives (docs/export.md cites each page;
tests/data/engine_docs/ holds the documented fields):

- vLLM: ``--speculative-config`` (method, model, num_speculative_tokens, prompt_lookup_min/max and the
  per-batch ``num_speculative_tokens_per_batch_size`` table of inclusive [start, end, K] ranges; the
  older ``disable_by_batch_size`` was removed in 2026 and the table's K = 0 takes its place);
- SGLang: ``--speculative-algorithm`` STANDALONE or NGRAM with ``--speculative-num-steps``,
  ``--speculative-eagle-topk`` 1 and ``--speculative-num-draft-tokens`` (no per-batch knob: pools);
- TensorRT-LLM: the ``speculative_config`` of ``trtllm-serve --config FILE.yaml`` (decoding_type,
  max_draft_len, speculative_model, ``draft_len_schedule`` {upper batch size: K} or ``max_concurrency``)."""

from __future__ import annotations

import json
from typing import Any

from router.export.export_config import (
    Export,
    Exporter,
    Value,
    comment,
    gamma_source,
    header,
    model_draft,
    provenance_lines,
    render_json,
    rule_differs,
    served_target,
    yaml_lines,
)
from router.export.export_plan import ExportPlan, GroupPlan

# the largest batch size a per-batch table spans (vLLM's and SGLang's largest default max_num_seqs)
TABLE_END = 1024


class VllmExporter(Exporter):
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
        draft = model_draft(plan)
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
        line = ["vllm", "serve", served_target(plan), "--port", str(port)]
        if values:
            line += ["--speculative-config", json.dumps(self.config(values))]
        return line

    def notes(self, plan: ExportPlan) -> list[str]:
        notes = []
        if plan.draft_kind == "ngram":
            notes.append(
                rule_differs(
                    plan,
                    "vLLM",
                    "looks up the longest matching n-gram (prompt_lookup_max down to prompt_lookup_min) its own way",
                )
            )
        notes.append(
            "disable_by_batch_size was removed from vLLM (PR #35060); the per-batch table's K = 0 turns "
            "speculation off instead"
        )
        return notes


class SglangExporter(Exporter):
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
        draft, source = model_draft(plan), gamma_source(plan, gamma, group)
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
        line = [
            "python3",
            "-m",
            "sglang.launch_server",
            "--model-path",
            served_target(plan),
            "--port",
            str(port),
        ]
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
            notes.append(rule_differs(plan, "SGLang", "drafts NGRAM from a trie of earlier tokens (BFS)"))
        return notes


class TrtllmExporter(Exporter):
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
        draft = model_draft(plan)
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
        line = ["trtllm-serve", served_target(plan), "--port", str(port)]
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
                rule_differs(
                    plan, "TensorRT-LLM", "keeps a pool of n-grams for NGram (is_keep_all, is_use_oldest)"
                )
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
