"""An analysis in llama-server: one greedy generation per prompt from a plain server, llama-server's
drafting rules replayed on it for every drafter setting, step costs with the context in them fitted from the
servers' own ``timings`` on calibration prompts chosen to span the workload, the machine's own noise measured,
the predicted speedup of every setting per prompt and per task, the best setting per task (or off), and,
when asked, validation through the servers themselves.

Calibration: the prompts that fit the cost are chosen after the replay, to span the workload's context
lengths and draft rates (:func:`analyzer.measuring.calibration_choice.spanning_choice`), not the first N.
Each calibration and validation pass runs a prompt on the plain server, on every setting's server, and on the
plain server again: the two plain runs bracket the settings' (each setting's measured speedup is over their
mean) and are a pair of identical runs, from which :func:`analyzer.measuring.noise.noise_floor` measures the
machine's run-to-run noise. The fit (:mod:`analyzer.pricing.context_cost`) is checked on prompts it was not
fitted on; a fit whose held-out error exceeds its bound is measured again once, and if it still fails, or the
machine is too noisy, the analysis is kept but its advice is withheld (every task off) and ``withheld`` says
why, with the numbers.

Validation repeats the passes over the held-out prompts, interleaved, until each setting's time-weighted
speedup has a 95% interval from run noise of at most :data:`VALIDATION_HALF_WIDTH` (at most the repeats
asked). It reports predicted against measured speedup (from ``timings``), and whether the server's own
``draft_n`` / ``draft_n_accepted`` equal the replay's: that must hold wherever the speculative output equals
plain greedy output (the exactness test). Every server request also records how much CPU other processes took
meanwhile, and the hypervisor's steal; a request over
:data:`analyzer.measuring.interference.MAX_OTHERS_CPU` is marked disturbed and left out of the error figures.
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
from analyzer.measuring.calibration_choice import spanning_choice
from analyzer.measuring.interference import MAX_OTHERS_CPU, machine_reading, others_busy_s
from analyzer.measuring.noise import (
    NoiseFloor,
    machine_sample,
    noise_floor,
    repeats_for_aggregate,
    steal_share,
)
from analyzer.measuring.request_work import plain_work
from analyzer.measuring.server_drafting import (
    DRAFT_SIMPLE,
    NGRAM_MOD,
    DraftOracle,
    NgramModTable,
    ServerDrafter,
    ServerReplay,
    replay_request,
)
from analyzer.pricing.context_cost import fit_error_bound, fit_problem
from analyzer.pricing.server_cost import Sample, ServerCost, fit_server_cost
from analyzer.run_params import DEFAULT_MARGIN


class ServerAnalysisError(SpecrouteError, ValueError):
    """An analysis in llama-server that cannot go on as asked; the message says what to change."""

    status, code = 400, "server_analysis_failed"


class PromptTooLong(ServerAnalysisError):
    """A prompt whose tokens and new tokens do not fit the servers' context."""

    code = "prompt_too_long"


# what a resumed analysis keeps of an earlier attempt: per prompt key, its ids and plain generation
Generated = Mapping[str, tuple[list[int], "TimedCompletion"]]


MIN_SPEEDUP = 1 + DEFAULT_MARGIN  # a setting is advised for a task only where it predicts more than this
VALIDATION_HALF_WIDTH = 0.015  # validation repeats until run noise leaves each setting's speedup this close
DEFAULT_VALIDATE_REPEATS = 3  # ... or this many passes over the validated prompts
FALLBACK_RUN_ERROR = 0.05  # one run's relative noise assumed where the calibration pairs could not tell


@dataclass(frozen=True)
class ServerPrompt:
    """One prompt of the workload: an id, its task and its chat messages."""

    key: str
    task: str
    messages: list[dict[str, str]]


@dataclass(frozen=True)
class TimedCompletion:
    """A server's completion with the share of the machine's CPU other processes took meanwhile, the share
    the hypervisor stole (None: not known) and the CPUs' mean clock at its end (MHz, None: not readable)."""

    completion: Completion
    others_cpu: float | None
    steal: float | None = None
    mhz: float | None = None

    @property
    def disturbed(self) -> bool:
        return self.others_cpu is not None and self.others_cpu > MAX_OTHERS_CPU

    @property
    def steps(self) -> int:
        """Decoding steps ``predicted_ms`` covers: every output token but the first."""
        return max(int(self.completion.timings["predicted_n"]) - 1, 1)

    @property
    def step_ms(self) -> float:
        """Time per decoding step."""
        return self.completion.predicted_ms / self.steps


@dataclass(frozen=True)
class Trial:
    """One setting's run of a prompt in one pass, with the pass's plain runs before and after it."""

    plain: TimedCompletion
    measured: TimedCompletion
    plain_after: TimedCompletion | None = None
    # the replay of what this server did with this request, where it differs from the setting's own replay:
    # ngram-mod's table carries every request the server saw before it (its history, repeats included)
    replay: ServerReplay | None = None

    @property
    def plain_step_ms(self) -> float:
        """The plain server's time per step: the mean of the runs bracketing this one."""
        runs = [self.plain] + ([self.plain_after] if self.plain_after is not None else [])
        return float(np.mean([run.step_ms for run in runs]))

    @property
    def disturbed(self) -> bool:
        return (
            self.measured.disturbed
            or self.plain.disturbed
            or bool(self.plain_after and self.plain_after.disturbed)
        )

    @property
    def speedup(self) -> float:
        """Plain over speculative time per step (per output token after the first), so that a run whose
        output left plain greedy and ended sooner or later is compared token for token."""
        return self.plain_step_ms / self.measured.step_ms


@dataclass
class SettingOutcome:
    """One prompt under one drafter setting: the replay and its prediction, and the server's own runs
    where it was validated (or calibrated), one :class:`Trial` per pass."""

    drafter: ServerDrafter
    replay: ServerReplay
    predicted_speedup: float = 0.0
    trials: list[Trial] = field(default_factory=list)
    calibration: bool = False

    @property
    def measured(self) -> TimedCompletion | None:
        """The first pass's speculative run (None: not run on a server)."""
        return self.trials[0].measured if self.trials else None

    @property
    def plain(self) -> TimedCompletion | None:
        """The plain run before the first pass's speculative run."""
        return self.trials[0].plain if self.trials else None

    @property
    def quiet_trials(self) -> list[Trial]:
        return [t for t in self.trials if not t.disturbed]

    def trial_replay(self, trial: Trial) -> ServerReplay:
        """What the server did with ``trial``'s request, replayed (the setting's replay unless the server's
        output or history changed it)."""
        return trial.replay if trial.replay is not None else self.replay

    def replayed_as_served(self, trial: Trial) -> bool:
        """Whether :meth:`trial_replay` is of the output the server served (not so only for a draft model's
        run that left plain greedy)."""
        return trial.replay is not None or trial.measured.completion.tokens == trial.plain.completion.tokens

    def validated_prediction(self, cost: ServerCost) -> float | None:
        """The prediction the undisturbed passes are compared with: the geometric mean of each pass's
        predicted speedup, from the replay of what the server did in it (None: no such pass)."""
        quiet = self.quiet_trials
        if not quiet:
            return None
        return float(np.exp(np.mean([np.log(cost.speedup(self.trial_replay(t))) for t in quiet])))

    @property
    def measured_speedup(self) -> float | None:
        """The geometric mean of the undisturbed passes' speedups (None: none)."""
        return _geometric_speedup(self.quiet_trials)

    @property
    def advice_trials(self) -> list[Trial]:
        """The undisturbed passes that measured what the advice predicts: every one for a stateless drafter;
        for ngram-mod only the first, where its server met the prompt for the first time (from the second
        pass on, its table holds this prompt's own earlier output and drafts it back: 1.80 measured against
        1.03 predicted, where the first pass measured 1.03; 38 prompts, a 2-core Xeon)."""
        if self.drafter.kind == NGRAM_MOD:
            return [t for t in self.trials[:1] if not t.disturbed]
        return self.quiet_trials

    @property
    def advised_speedup(self) -> float | None:
        """The geometric mean of :attr:`advice_trials`' speedups (None: none)."""
        return _geometric_speedup(self.advice_trials)

    @property
    def output_equal(self) -> bool:
        """Whether the server's speculative output equals its paired plain run's."""
        return bool(
            self.measured and self.plain and self.measured.completion.tokens == self.plain.completion.tokens
        )

    @property
    def counts_equal(self) -> bool | None:
        """Whether the server's draft counts equal the replay of its own output in every pass replayed as
        served (:meth:`replayed_as_served`; None: not run on a server, or no such pass)."""
        served = [t for t in self.trials if self.replayed_as_served(t)]
        if not served:
            return None
        return all(_counts(t.measured) == _counts_of(self.trial_replay(t)) for t in served)


def _geometric_speedup(trials: Sequence[Trial]) -> float | None:
    return float(np.exp(np.mean([np.log(t.speedup) for t in trials]))) if trials else None


def _counts(run: TimedCompletion) -> tuple[int, int]:
    """A server run's (draft_n, draft_n_accepted): a server that drafted nothing leaves both out of timings."""
    timings = run.completion.timings
    return int(timings.get("draft_n", 0)), int(timings.get("draft_n_accepted", 0))


def _counts_of(replay: ServerReplay) -> tuple[int, int]:
    return replay.draft_n, replay.draft_n_accepted


@dataclass
class PromptOutcome:
    """One prompt: its ids as the server tokenized its chat template, the plain greedy completion and
    every setting's outcome."""

    prompt: ServerPrompt
    prompt_ids: list[int]
    plain: TimedCompletion
    settings: list[SettingOutcome] = field(default_factory=list)
    # each pass's two plain runs (before and after the settings'): a pair of identical runs
    plain_pairs: list[tuple[TimedCompletion, TimedCompletion]] = field(default_factory=list)
    calibration: bool = False


@dataclass
class ServerAnalysis:
    """The whole analysis: per prompt outcomes, the fitted cost, the machine's noise, and its wall time:
    ``seconds`` up to the predictions (servers started, generation, calibration), ``validation_seconds``
    after, against ``plain_generation_seconds``, the plain generation of the same prompts alone.
    ``withheld`` says why the advice may not be used (None: it may); ``validation_repeats`` is the passes
    validation made over its prompts; ``calibration_passes`` the passes calibration made (2: re-measured)."""

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
    noise: NoiseFloor | None = None
    withheld: str | None = None
    validation_repeats: int = 0
    calibration_passes: int = 1
    fit_bound: float | None = None

    def cost_of(self, drafter: ServerDrafter) -> ServerCost:
        """The step costs that price ``drafter``: its family's."""
        return self.costs[drafter.family]


def timed_complete(server: Server, prompt_ids: list[int], n_predict: int) -> TimedCompletion:
    """One greedy completion, with the CPU share other processes (not this one, not the server) took."""
    sample_before = machine_sample()
    before, server_before, wall = machine_reading(), server.cpu_seconds(), time.perf_counter()
    completion = server.client.complete(prompt_ids, n_predict)
    after, server_after, wall = machine_reading(), server.cpu_seconds(), time.perf_counter() - wall
    sample_after = machine_sample()
    steal = steal_share(sample_before, sample_after)
    mhz = float(np.mean(sample_after.mhz)) if sample_after.mhz else None
    busy = others_busy_s(before, after)
    if busy is None or server_before is None or server_after is None or wall <= 0:
        return TimedCompletion(completion, None, steal, mhz)
    others = max(0.0, busy - (server_after - server_before))
    return TimedCompletion(completion, others / (wall * (os.cpu_count() or 1)), steal, mhz)


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
    validate_repeats: int = DEFAULT_VALIDATE_REPEATS,
    validation_half_width: float = VALIDATION_HALF_WIDTH,
    say: Progress = lambda line: None,
    generated: Generated | None = None,
    on_generated: Callable[[ServerPrompt, list[int], TimedCompletion], None] | None = None,
) -> ServerAnalysis:
    """Generate, replay, calibrate, predict and (when ``validate``) validate; see the module docstring.
    ``calibration_prompts`` prompts, chosen to span the workload, fit the cost and are not validated;
    validation makes at most ``validate_repeats`` passes, fewer where run noise already leaves each
    setting's aggregate within ``validation_half_width`` (0: always ``validate_repeats``). ``generated``:
    plain generations an earlier attempt made (by prompt key), kept instead of generating again;
    ``on_generated`` is told each new one (a queued analysis stores them, so a resume keeps them).
    :class:`PromptTooLong` where a prompt and ``n_predict`` do not fit the context."""
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
        outcomes, plain_seconds = _generate(
            servers[0], prompts, n_predict, say, setup.n_ctx, generated or {}, on_generated
        )
        _replay_settings(setup, outcomes, drafters, n_predict, say)
        chosen = calibration_choice(outcomes, calibration_prompts)
        for outcome in chosen:
            outcome.calibration = True
        history = ServerHistory(n_predict, setup.n_ctx)
        calibration = _calibrate(servers, outcomes, chosen, history, say)
        for outcome in outcomes:
            for setting in outcome.settings:
                setting.predicted_speedup = calibration.costs[setting.drafter.family].speedup(setting.replay)
        analysed = time.perf_counter()
        held_out = [o for o in outcomes if not o.calibration]
        repeats = 0
        if validate and held_out:
            run_error = calibration.noise.run_error or FALLBACK_RUN_ERROR
            weights = [o.plain.completion.predicted_ms for o in held_out]
            repeats = repeats_for_aggregate(
                run_error, weights, validation_half_width, at_most=validate_repeats
            )
            _validate(servers, held_out, history, repeats, say)
    finally:
        for server in servers:
            server.stop()
    noise = measured_noise(outcomes)
    withheld = calibration.withheld or ("; ".join(noise.notes) if noise.verdict == "noisy" else None)
    return ServerAnalysis(
        list(drafters), outcomes, calibration.costs, n_predict, setup.threads, analysed - started, plain_seconds,
        len(chosen), time.perf_counter() - analysed, setup.n_ctx, noise, withheld, repeats, calibration.passes,
        calibration.bound,
    )  # fmt: skip


def calibration_choice(outcomes: Sequence[PromptOutcome], count: int) -> list[PromptOutcome]:
    """``count`` prompts that span the workload: by the log of their mean context (prompt plus half the
    output), the share of their output the settings draft and the share they accept (means over the
    settings' replays); in the workload's order."""
    features = []
    for outcome in outcomes:
        output = max(len(outcome.plain.completion.tokens), 1)
        context = len(outcome.prompt_ids) + output / 2
        drafted = np.mean([s.replay.draft_n / output for s in outcome.settings]) if outcome.settings else 0.0
        accepted = (
            np.mean([s.replay.draft_n_accepted / output for s in outcome.settings])
            if outcome.settings
            else 0.0
        )
        features.append([np.log(context), drafted, accepted])
    return [outcomes[i] for i in spanning_choice(np.asarray(features), count)]


def measured_noise(outcomes: Sequence[PromptOutcome]) -> NoiseFloor:
    """The machine's noise from every pass's pair of plain runs (undisturbed ones), with the hypervisor's
    steal and the clock's spread over every run of the analysis."""
    pairs = [(a, b) for o in outcomes for a, b in o.plain_pairs if not (a.disturbed or b.disturbed)]
    runs = [o.plain for o in outcomes] + [t.measured for o in outcomes for s in o.settings for t in s.trials]
    runs += [run for o in outcomes for pair in o.plain_pairs for run in pair]
    steals = [r.steal for r in runs if r.steal is not None]
    walls = [r.completion.predicted_ms for r in runs if r.steal is not None]
    steal = float(np.average(steals, weights=walls)) if steals and sum(walls) > 0 else None
    clocks = [r.mhz for r in runs if r.mhz is not None]
    spread = (max(clocks) - min(clocks)) / max(clocks) if clocks and max(clocks) > 0 else None
    return noise_floor(
        [a.step_ms for a, _ in pairs], [b.step_ms for _, b in pairs], steal=steal, mhz_spread=spread
    )


def _generate(
    plain: Server,
    prompts: Sequence[ServerPrompt],
    n_predict: int,
    say: Progress,
    n_ctx: int = 0,
    generated: Generated | None = None,
    on_generated: Callable[[ServerPrompt, list[int], TimedCompletion], None] | None = None,
) -> tuple[list[PromptOutcome], float]:
    """Each prompt's ids under the server's chat template and its plain greedy completion (``generated``'s
    where an earlier attempt made it); PromptTooLong where a prompt and ``n_predict`` exceed ``n_ctx`` (0: not
    checked)."""
    outcomes, seconds = [], 0.0
    generated = generated or {}
    kept = sum(1 for p in prompts if p.key in generated)
    if kept:
        say(f"kept {kept} plain generations of an earlier attempt")
    for number, prompt in enumerate(prompts, 1):
        if prompt.key in generated:
            ids, completion = generated[prompt.key]
            outcomes.append(PromptOutcome(prompt, list(ids), completion))
            continue
        ids = plain.client.tokenize(plain.client.chat_prompt(prompt.messages))
        if n_ctx and len(ids) + n_predict > n_ctx:
            raise PromptTooLong(
                f"prompt {prompt.key} ({prompt.task}) has {len(ids)} tokens: with {n_predict} new tokens it exceeds "
                f"the servers' context of {n_ctx}; give a larger --ctx or fewer new tokens, or leave the prompt out"
            )
        wall = time.perf_counter()
        completion = timed_complete(plain, ids, n_predict)
        outcomes.append(PromptOutcome(prompt, ids, completion))
        seconds += time.perf_counter() - wall
        if on_generated is not None:
            on_generated(prompt, ids, completion)
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


@dataclass
class ServerHistory:
    """What each setting's server did, replayed: its drafting rule on the server's own output wherever that
    left plain greedy, and, for the drafters whose state carries from request to request (ngram-mod's table),
    a table per setting fed every request in the order the server gets it (a repeated prompt finds its own
    earlier output in the table)."""

    n_predict: int
    n_ctx: int
    tables: dict[int, NgramModTable] = field(default_factory=dict)

    def replay(
        self, index: int, setting: SettingOutcome, outcome: PromptOutcome, served: Completion
    ) -> ServerReplay | None:
        """The replay of this request on setting ``index``'s server, given the output it ``served`` and its
        history (None: the setting's own replay is what the server did, or a draft model's run left plain
        greedy and cannot be replayed: the draft model's view was taken of plain output only)."""
        drafter = setting.drafter
        table = (
            self.tables.setdefault(index, NgramModTable(drafter.n_match))
            if drafter.kind == NGRAM_MOD
            else None
        )
        if table is None and served.tokens == outcome.plain.completion.tokens:
            return None
        return served_replay(drafter, outcome.prompt_ids, served, self.n_predict, self.n_ctx, table)


def served_replay(
    drafter: ServerDrafter,
    prompt_ids: Sequence[int],
    served: Completion,
    n_predict: int,
    n_ctx: int,
    table: NgramModTable | None = None,
) -> ServerReplay | None:
    """``drafter``'s rule replayed on the output a server ``served`` (None for a draft model: its view of any
    output but plain greedy's was not taken). A model-free server's draft counts equal this replay even
    where its output left plain greedy (llama-server's batched verification can flip an argmax over long
    contexts: 45 such runs of 45 on 1,588-2,513-token prompts, a 2-core Xeon), so its time is priced from the
    work it did, not the work plain greedy output would have made it do."""
    if drafter.kind == DRAFT_SIMPLE:
        return None
    tokens = served.tokens
    return replay_request(
        drafter,
        prompt_ids,
        tokens,
        n_predict=n_predict,
        n_ctx=n_ctx,
        eog_ids=frozenset(tokens[-1:]) if served.stopped_at_eos else frozenset(),
        table=table,
    )


def _run_pass(servers: Sequence[Server], outcome: PromptOutcome, history: ServerHistory) -> None:
    """One pass of a prompt: the plain server, each setting's server, the plain server again; each setting
    gets a :class:`Trial` bracketed by the two plain runs (with the replay of its server's history where
    that matters), and the prompt the plain pair."""
    n_predict = history.n_predict
    plain = timed_complete(servers[0], outcome.prompt_ids, n_predict)
    measured = [timed_complete(server, outcome.prompt_ids, n_predict) for server in servers[1:]]
    plain_after = timed_complete(servers[0], outcome.prompt_ids, n_predict)
    for index, (setting, run) in enumerate(zip(outcome.settings, measured, strict=True)):
        setting.trials.append(
            Trial(plain, run, plain_after, history.replay(index, setting, outcome, run.completion))
        )
        setting.calibration = outcome.calibration
    outcome.plain_pairs.append((plain, plain_after))


@dataclass(frozen=True)
class Calibration:
    """What calibration found: the step costs per drafter family, the machine's noise over its passes, the
    bound the fits were checked against, how many passes it made, and why advice is withheld (None: it is
    not)."""

    costs: dict[str, ServerCost]
    noise: NoiseFloor
    bound: float
    passes: int
    withheld: str | None


def _calibrate(
    servers: Sequence[Server],
    outcomes: Sequence[PromptOutcome],
    chosen: Sequence[PromptOutcome],
    history: ServerHistory,
    say: Progress,
) -> Calibration:
    """Run the chosen prompts on every server (checking first that each server runs its setting,
    :func:`_check_settings`), fit each drafter family's costs and check them on prompts they were not fitted
    on (:func:`analyzer.pricing.context_cost.fit_error_bound`, from the noise the pass measured); a family
    that misses its bound is measured once more (every chosen prompt again) and refitted on both passes; one
    that still misses it withholds the advice."""
    for number, outcome in enumerate(chosen, 1):
        _run_pass(servers, outcome, history)
        say(f"calibrated {number}/{len(chosen)} ({outcome.prompt.key})")
    _check_settings(servers, chosen)
    noise = measured_noise(chosen)
    bound = fit_error_bound(noise.run_error if noise.run_error is not None else FALLBACK_RUN_ERROR)
    costs = fit_costs(chosen)
    failing = [family for family, cost in costs.items() if cost.checked_error > bound]
    passes = 1
    if failing:
        passes = 2
        for number, outcome in enumerate(chosen, 1):
            _run_pass(servers, outcome, history)
            say(
                f"re-measured {number}/{len(chosen)} ({outcome.prompt.key}): the {', '.join(failing)} fit missed"
            )
        noise = measured_noise(chosen)
        bound = fit_error_bound(noise.run_error if noise.run_error is not None else FALLBACK_RUN_ERROR)
        costs = fit_costs(chosen)
    problems = [
        f"{problem}, measured {passes} times"
        for family, cost in costs.items()
        if (problem := fit_problem(cost.checked_error, bound, family, heldout=cost.heldout_mare is not None))
    ]
    return Calibration(costs, noise, bound, passes, "; ".join(problems) or None)


def fit_costs(chosen: Sequence[PromptOutcome]) -> dict[str, ServerCost]:
    """The step costs per drafter family (what calibration fits, and what a benchmark re-prices a measured
    analysis with), all from the chosen prompts' calibration passes: the plain step and its context term
    from their plain runs, the rounds from that family's settings' runs (undisturbed ones, each priced from the
    replay of the output it served; a draft model's runs whose output left plain greedy only where there is
    nothing else). The generation pass is left out: its plain runs follow each
    other on one server, with its weights warm in the CPU's caches, and ran 7.5% faster per step than the
    same server's runs interleaved with the other servers' (52 prompts, a 2-core Xeon), which is how every
    speculating run is timed."""
    plain: list[Sample] = []
    for outcome in chosen:
        runs = [run for pair in outcome.plain_pairs for run in pair]
        plain += [
            (outcome.prompt.key, plain_work(len(outcome.prompt_ids), int(r.completion.timings["predicted_n"])),
             r.completion.predicted_ms)
            for r in runs
            if not r.disturbed
        ]  # fmt: skip
    costs = {}
    families = sorted({s.drafter.family for o in chosen for s in o.settings})
    for family in families:
        settings = [(o.prompt.key, s) for o in chosen for s in o.settings if s.drafter.family == family]
        trials = [(k, s, t) for k, s in settings for t in s.quiet_trials] or [
            (k, s, t) for k, s in settings for t in s.trials
        ]
        served = [(k, s, t) for k, s, t in trials if s.replayed_as_served(t)]
        samples: list[Sample] = [
            (key, s.trial_replay(t).work(), t.measured.completion.predicted_ms)
            for key, s, t in (served or trials)
        ]
        try:
            costs[family] = fit_server_cost(plain, samples, fit_step=family == "draft model")
        except ValueError:
            labels = ", ".join(sorted({s.drafter.label for _, s in settings}))
            raise ServerAnalysisError(
                f"none of the {len(chosen)} calibration prompts drafted anything with {labels}, so no round could "
                "be timed: raise --calibration, or add prompts that repeat their input (extraction, code edits)"
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
    servers: Sequence[Server],
    outcomes: Sequence[PromptOutcome],
    history: ServerHistory,
    repeats: int,
    say: Progress,
) -> None:
    """``repeats`` passes over the held-out prompts, interleaved (every prompt once per pass)."""
    for repeat in range(1, repeats + 1):
        for number, outcome in enumerate(outcomes, 1):
            _run_pass(servers, outcome, history)
            of = f", pass {repeat}/{repeats}" if repeats > 1 else ""
            say(f"validated {number}/{len(outcomes)} ({outcome.prompt.key}){of}")
