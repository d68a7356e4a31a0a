"""An analysis in llama-server: one greedy generation per prompt from a plain server, llama-server's
drafting rules replayed on it for every drafter setting, step costs fitted from the servers' own
``timings`` on a few calibration prompts, the predicted speedup of every setting per prompt and per task,
the best setting per task (or off), and, when asked, validation through the servers themselves.

Validation runs each held-out prompt on the plain server and on one server per setting, interleaved per
prompt. It reports predicted against measured speedup (from ``timings``), and whether the server's own
``draft_n`` / ``draft_n_accepted`` equal the replay's: that must hold wherever the speculative output
equals plain greedy output (the exactness test). Every server request also records how much CPU other
processes took meanwhile; a request over :data:`analyzer.measuring.interference.MAX_OTHERS_CPU` is
marked disturbed and left out of the error figures.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from analyzer.engine.llama_server_draft import DraftModel
from analyzer.engine.llama_server_process import Completion, LlamaServerProcess, RemoteServer, Server
from analyzer.errors import SpecrouteError
from analyzer.measuring.interference import MAX_OTHERS_CPU, machine_reading, others_busy_s
from analyzer.measuring.server_drafting import (
    NGRAM_MOD,
    DraftOracle,
    NgramModTable,
    ServerDrafter,
    ServerReplay,
    replay_request,
)
from analyzer.pricing.server_cost import ServerCost, fit_server_cost, plain_step_ms
from analyzer.run_params import DEFAULT_MARGIN


class ServerAnalysisError(SpecrouteError, ValueError):
    """An analysis in llama-server that cannot go on as asked; the message says what to change."""

    status, code = 400, "server_analysis_failed"


MIN_SPEEDUP = 1 + DEFAULT_MARGIN  # a setting is advised for a task only where it predicts more than this


@dataclass(frozen=True)
class ServerPrompt:
    """One prompt of the workload: an id, its task and its chat messages."""

    key: str
    task: str
    messages: list[dict[str, str]]


@dataclass(frozen=True)
class TimedCompletion:
    """A server's completion with the share of the machine's CPU other processes took meanwhile."""

    completion: Completion
    others_cpu: float | None

    @property
    def disturbed(self) -> bool:
        return self.others_cpu is not None and self.others_cpu > MAX_OTHERS_CPU

    @property
    def steps(self) -> int:
        """Decoding steps ``predicted_ms`` covers: every output token but the first."""
        return max(int(self.completion.timings["predicted_n"]) - 1, 1)


@dataclass
class SettingOutcome:
    """One prompt under one drafter setting: the replay and its prediction, and the server's own run
    where it was validated (or calibrated)."""

    drafter: ServerDrafter
    replay: ServerReplay
    predicted_speedup: float = 0.0
    measured: TimedCompletion | None = None
    plain: TimedCompletion | None = None  # the plain run interleaved with ``measured``
    calibration: bool = False

    @property
    def measured_speedup(self) -> float | None:
        """Plain over speculative time per step (per output token after the first), so that a run whose
        output left plain greedy and ended sooner or later is compared token for token."""
        if self.measured is None or self.plain is None:
            return None
        plain = self.plain.completion.predicted_ms / self.plain.steps
        return plain / (self.measured.completion.predicted_ms / self.measured.steps)

    @property
    def output_equal(self) -> bool:
        """Whether the server's speculative output equals its paired plain run's."""
        return bool(
            self.measured and self.plain and self.measured.completion.tokens == self.plain.completion.tokens
        )

    @property
    def counts_equal(self) -> bool | None:
        """Whether the server's draft counts equal the replay's (None: not run on a server)."""
        if self.measured is None:
            return None
        timings = self.measured.completion.timings
        # a server that drafted nothing leaves both fields out of its timings
        return (timings.get("draft_n", 0), timings.get("draft_n_accepted", 0)) == (
            self.replay.draft_n,
            self.replay.draft_n_accepted,
        )


@dataclass
class PromptOutcome:
    """One prompt: its ids as the server tokenized its chat template, the plain greedy completion and
    every setting's outcome."""

    prompt: ServerPrompt
    prompt_ids: list[int]
    plain: TimedCompletion
    settings: list[SettingOutcome] = field(default_factory=list)


@dataclass
class ServerAnalysis:
    """The whole analysis: per prompt outcomes, the fitted cost, and its wall time: ``seconds`` up to the
    predictions (servers started, generation, calibration), ``validation_seconds`` after, against
    ``plain_generation_seconds``, the plain generation of the same prompts alone."""

    drafters: list[ServerDrafter]
    prompts: list[PromptOutcome]
    costs: dict[str, ServerCost]  # per drafter family (ServerDrafter.family)
    n_predict: int
    threads: int
    seconds: float
    plain_generation_seconds: float
    calibration_prompts: int
    validation_seconds: float = 0.0
    n_ctx: int = 0

    def cost_of(self, drafter: ServerDrafter) -> ServerCost:
        """The step costs that price ``drafter``: its family's."""
        return self.costs[drafter.family]


def timed_complete(server: Server, prompt_ids: list[int], n_predict: int) -> TimedCompletion:
    """One greedy completion, with the CPU share other processes (not this one, not the server) took."""
    before, server_before, wall = machine_reading(), server.cpu_seconds(), time.perf_counter()
    completion = server.client.complete(prompt_ids, n_predict)
    after, server_after, wall = machine_reading(), server.cpu_seconds(), time.perf_counter() - wall
    busy = others_busy_s(before, after)
    if busy is None or server_before is None or server_after is None or wall <= 0:
        return TimedCompletion(completion, None)
    others = max(0.0, busy - (server_after - server_before))
    return TimedCompletion(completion, others / (wall * (os.cpu_count() or 1)))


def replay_all(
    drafter: ServerDrafter,
    outcomes: Sequence[PromptOutcome],
    *,
    n_predict: int,
    n_ctx: int,
    oracles: Sequence[DraftOracle] | None = None,
) -> list[ServerReplay]:
    """The drafter replayed on every prompt's plain output in order, as one server that serves them in
    that order sees them (ngram-mod's table carried from request to request); ``oracles``, one per prompt,
    are the draft model's view for draft-simple."""
    table = NgramModTable(drafter.n_match) if drafter.kind == NGRAM_MOD else None
    replays = []
    for index, outcome in enumerate(outcomes):
        completion = outcome.plain.completion
        eog = frozenset(completion.tokens[-1:]) if completion.stopped_at_eos else frozenset()
        replays.append(
            replay_request(
                drafter,
                outcome.prompt_ids,
                completion.tokens,
                n_predict=n_predict,
                n_ctx=n_ctx,
                eog_ids=eog,
                table=table,
                oracle=oracles[index] if oracles is not None and drafter.needs_draft_model else None,
            )
        )
    return replays


@dataclass(frozen=True)
class ServerSetup:
    """What every server of one analysis shares: the binary, the GGUF model, threads and context, and the
    draft model's GGUF where a draft-simple setting is compared."""

    binary: Path | None
    model: Path
    threads: int
    n_ctx: int
    draft_model: Path | None = None
    # servers the user runs, by "off" (the plain one) and drafter label; None: start our own
    urls: Mapping[str, str] | None = None

    def server(self, drafter: ServerDrafter | None) -> Server:
        if self.urls is not None:
            return RemoteServer(self.urls["off" if drafter is None else drafter.label])
        assert self.binary is not None  # a setup without urls names the binary (the CLI finds it)
        flags = drafter.server_flags() if drafter is not None else []
        if drafter is not None and drafter.needs_draft_model:
            assert self.draft_model is not None  # analyze_in_llama_server checks it first
            flags = ["-md", str(self.draft_model), *flags]
        return LlamaServerProcess(
            self.binary, self.model, threads=self.threads, n_ctx=self.n_ctx, flags=flags
        )


Progress = Callable[[str], None]


def analyze_in_llama_server(
    setup: ServerSetup,
    prompts: Sequence[ServerPrompt],
    drafters: Sequence[ServerDrafter],
    *,
    n_predict: int,
    calibration_prompts: int,
    validate: bool,
    say: Progress = lambda line: None,
) -> ServerAnalysis:
    """Generate, replay, calibrate, predict and (when ``validate``) validate; see the module docstring.
    The first ``calibration_prompts`` prompts fit the cost and are not validated."""
    if not prompts or not drafters:
        raise ServerAnalysisError("an analysis needs at least one prompt and one drafter")
    if setup.draft_model is None and any(d.needs_draft_model for d in drafters):
        raise ServerAnalysisError("a draft-simple setting needs the draft model (its GGUF file)")
    started = time.perf_counter()
    calibration_prompts = max(1, min(calibration_prompts, len(prompts)))
    servers = [setup.server(None)] + [setup.server(d) for d in drafters]
    try:
        for server in servers:
            server.start()
        outcomes, plain_seconds = _generate(servers[0], prompts, n_predict, say)
        _replay_settings(setup, outcomes, drafters, n_predict, say)
        costs = _calibrate(servers, outcomes[:calibration_prompts], n_predict, say)
        _check_settings(servers, outcomes[:calibration_prompts])
        for outcome in outcomes:
            for setting in outcome.settings:
                setting.predicted_speedup = costs[setting.drafter.family].speedup(setting.replay)
        analysed = time.perf_counter()
        if validate:
            _validate(servers, outcomes[calibration_prompts:], n_predict, say)
    finally:
        for server in servers:
            server.stop()
    return ServerAnalysis(
        list(drafters), outcomes, costs, n_predict, setup.threads, analysed - started, plain_seconds,
        calibration_prompts, time.perf_counter() - analysed, setup.n_ctx,
    )  # fmt: skip


def _generate(
    plain: Server, prompts: Sequence[ServerPrompt], n_predict: int, say: Progress
) -> tuple[list[PromptOutcome], float]:
    """Each prompt's ids under the server's chat template and its plain greedy completion."""
    outcomes, seconds = [], 0.0
    for number, prompt in enumerate(prompts, 1):
        ids = plain.client.tokenize(plain.client.chat_prompt(prompt.messages))
        wall = time.perf_counter()
        outcomes.append(PromptOutcome(prompt, ids, timed_complete(plain, ids, n_predict)))
        seconds += time.perf_counter() - wall
        say(f"generated {number}/{len(prompts)} ({prompt.key})")
    return outcomes, seconds


def _replay_settings(
    setup: ServerSetup,
    outcomes: Sequence[PromptOutcome],
    drafters: Sequence[ServerDrafter],
    n_predict: int,
    say: Progress,
) -> None:
    """Every setting replayed on every prompt, into each prompt's ``settings``; where a draft-simple
    setting is compared, the draft model passes over each prompt first and stays loaded for the branches
    the replays ask for."""
    draft = None
    if setup.draft_model is not None and any(d.needs_draft_model for d in drafters):
        draft = DraftModel(setup.draft_model, n_ctx=setup.n_ctx, threads=setup.threads)
    try:
        oracles: list[DraftOracle] | None = None
        if draft is not None:
            oracles = []
            for number, outcome in enumerate(outcomes, 1):
                oracles.append(draft.oracle(outcome.prompt_ids, outcome.plain.completion.tokens))
                say(f"draft model passed over {number}/{len(outcomes)}")
        for drafter in drafters:
            replays = replay_all(drafter, outcomes, n_predict=n_predict, n_ctx=setup.n_ctx, oracles=oracles)
            for outcome, replay in zip(outcomes, replays, strict=True):
                outcome.settings.append(SettingOutcome(drafter, replay))
    finally:
        if draft is not None:
            draft.close()


def _run_settings(
    servers: Sequence[Server], outcome: PromptOutcome, n_predict: int, *, calibration: bool
) -> None:
    """One prompt on the plain server, then on each setting's server, each setting paired with that
    plain run."""
    plain = timed_complete(servers[0], outcome.prompt_ids, n_predict)
    for server, setting in zip(servers[1:], outcome.settings, strict=True):
        setting.measured = timed_complete(server, outcome.prompt_ids, n_predict)
        setting.plain = plain
        setting.calibration = calibration


def _calibrate(
    servers: Sequence[Server], outcomes: Sequence[PromptOutcome], n_predict: int, say: Progress
) -> dict[str, ServerCost]:
    """The step costs per drafter family: the plain step from the plain runs, the rounds fitted on that
    family's settings' runs of the calibration prompts (their disturbed runs left out unless all are)."""
    for number, outcome in enumerate(outcomes, 1):
        _run_settings(servers, outcome, n_predict, calibration=True)
        say(f"calibrated {number}/{len(outcomes)} ({outcome.prompt.key})")
    runs = [s for o in outcomes for s in o.settings if s.measured is not None]
    quiet = [s for s in runs if not (s.measured and s.measured.disturbed)] or runs
    plain_timings = [o.plain.completion.timings for o in outcomes] + [
        s.plain.completion.timings for s in quiet if s.plain is not None
    ]
    plain_step = plain_step_ms(plain_timings)
    costs = {}
    for family in sorted({s.drafter.family for s in runs}):
        samples = [
            (s.replay, s.measured.completion.predicted_ms)
            for s in quiet
            if s.measured is not None and s.drafter.family == family
        ]
        try:
            costs[family] = fit_server_cost(plain_step, samples, fit_step=family == "draft model")
        except ValueError:
            labels = ", ".join(sorted({s.drafter.label for s in runs if s.drafter.family == family}))
            raise ServerAnalysisError(
                f"none of the first {len(outcomes)} prompts drafted anything with {labels}, so no round could be "
                "timed: raise --calibration, or put prompts that repeat their input (extraction, code edits) first"
            ) from None
    return costs


def _check_settings(servers: Sequence[Server], outcomes: Sequence[PromptOutcome]) -> None:
    """ServerAnalysisError where a server's own draft counts over the calibration prompts show it does not
    run the setting it stands for: a plain server that drafted, or a setting's server that drafted nothing
    where the replay drafted (a user's server started without the setting's flags, say)."""
    if any(o.plain.completion.timings.get("draft_n", 0) for o in outcomes):
        raise ServerAnalysisError(
            f"the plain server at {servers[0].client.url} drafted: start it without --spec-type"
        )
    for index, server in enumerate(servers[1:]):
        settings = [o.settings[index] for o in outcomes if o.settings[index].measured is not None]
        replayed = sum(s.replay.draft_n for s in settings)
        served = sum(s.measured.completion.timings.get("draft_n", 0) for s in settings if s.measured)
        if replayed > 0 and served == 0:
            drafter = settings[0].drafter
            raise ServerAnalysisError(
                f"the server at {server.client.url} for {drafter.label} drafted nothing on the calibration "
                f"prompts, where the replay drafted {replayed} tokens: start it with "
                f"{' '.join(drafter.server_flags())}"
            )


def _validate(
    servers: Sequence[Server], outcomes: Sequence[PromptOutcome], n_predict: int, say: Progress
) -> None:
    for number, outcome in enumerate(outcomes, 1):
        _run_settings(servers, outcome, n_predict, calibration=False)
        say(f"validated {number}/{len(outcomes)} ({outcome.prompt.key})")


@dataclass(frozen=True)
class TaskChoice:
    """One task: each setting's predicted and (where its prompts ran on the servers, calibration prompts
    included) measured speedup over its prompts, time-weighted, and the setting the task should use (None:
    off)."""

    task: str
    prompts: int
    predicted: dict[str, float]
    measured: dict[str, float | None]
    best: ServerDrafter | None


def task_choices(analysis: ServerAnalysis) -> list[TaskChoice]:
    """Per task, the best setting by predicted speedup; off unless it exceeds :data:`MIN_SPEEDUP` (the
    margin every analysis' advice clears, so a setting that predicts 1.01 is not worth a pool)."""
    tasks = sorted({o.prompt.task for o in analysis.prompts})
    choices = []
    for task in tasks:
        group = [o for o in analysis.prompts if o.prompt.task == task]
        predicted, measured = {}, {}
        for index, drafter in enumerate(analysis.drafters):
            settings = [o.settings[index] for o in group]
            cost = analysis.cost_of(drafter)
            plain = sum(cost.plain_ms(s.replay.output_tokens) for s in settings)
            spec = sum(cost.speculative_ms(s.replay) for s in settings)
            predicted[drafter.label] = plain / spec if spec > 0 else 1.0
            # every run on the servers, the calibration prompts' included, so both cover the same prompts
            measured[drafter.label] = _measured_ratio([s for s in settings if s.measured])
        best_label = max(predicted, key=lambda label: predicted[label])
        best = (
            next(d for d in analysis.drafters if d.label == best_label)
            if predicted[best_label] > MIN_SPEEDUP
            else None
        )
        choices.append(TaskChoice(task, len(group), predicted, measured, best))
    return choices


def _measured_ratio(settings: Sequence[SettingOutcome]) -> float | None:
    """Plain over speculative time per step, summed over the undisturbed runs (None when there is none)."""
    pairs = [
        (s.plain, s.measured)
        for s in settings
        if s.plain is not None and s.measured is not None and not (s.plain.disturbed or s.measured.disturbed)
    ]
    if not pairs:
        return None
    plain = sum(p.completion.predicted_ms for p, _ in pairs) / sum(p.steps for p, _ in pairs)
    spec = sum(m.completion.predicted_ms for _, m in pairs) / sum(m.steps for _, m in pairs)
    return plain / spec


@dataclass(frozen=True)
class ValidationFigures:
    """Predicted against measured over validated runs of one setting: ``runs`` and how many were
    ``disturbed``; the share whose output equals plain greedy (``output_equal``) and among those the share
    whose draft counts equal the replay's (``counts_equal``); the mean absolute relative error of the
    per-prompt speedup over undisturbed runs whose output equals plain (``mare``: the replay priced what the
    server did) and over all undisturbed runs (``mare_all``)."""

    setting: str
    runs: int
    disturbed: int
    output_equal: float | None
    counts_equal: float | None
    mare: float | None
    mare_all: float | None


def _mare(settings: Sequence[SettingOutcome]) -> float | None:
    errors = [abs(s.predicted_speedup - m) / m for s in settings if (m := s.measured_speedup)]
    return float(np.mean(errors)) if errors else None


def validation_figures(analysis: ServerAnalysis) -> list[ValidationFigures]:
    """:class:`ValidationFigures` per setting over the validated prompts."""
    figures = []
    for index, drafter in enumerate(analysis.drafters):
        runs = [o.settings[index] for o in analysis.prompts if not o.settings[index].calibration]
        runs = [s for s in runs if s.measured is not None and s.plain is not None]
        quiet = [
            s
            for s in runs
            if not (s.measured and s.measured.disturbed) and not (s.plain and s.plain.disturbed)
        ]
        equal = [s for s in runs if s.output_equal]
        figures.append(
            ValidationFigures(
                drafter.label,
                len(runs),
                len(runs) - len(quiet),
                len(equal) / len(runs) if runs else None,
                sum(1 for s in equal if s.counts_equal) / len(equal) if equal else None,
                _mare([s for s in quiet if s.output_equal]),
                _mare(quiet),
            )
        )
    return figures
