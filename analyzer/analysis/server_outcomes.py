"""What an analysis in llama-server is made of and what it ends with: its prompts, a server's timed completion,
each setting's runs of a prompt (:class:`Trial`) and outcome, each prompt's outcome, the whole analysis, and the
errors that stop one. Every other part of the analysis (analyzer/analysis/server_analysis.py) reads and fills
these.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from analyzer.engine.llama_server_process import Completion
from analyzer.errors import SpecrouteError
from analyzer.measuring.interference import MAX_OTHERS_CPU
from analyzer.measuring.noise import NoiseFloor, sampled_half_width
from analyzer.measuring.server_drafting import NGRAM_MOD, ServerDrafter, ServerReplay
from analyzer.pricing.server_cost import ServerCost


class ServerAnalysisError(SpecrouteError, ValueError):
    """An analysis in llama-server that cannot go on as asked; the message says what to change."""

    status, code = 400, "server_analysis_failed"


class PromptTooLong(ServerAnalysisError):
    """A prompt whose tokens and new tokens do not fit the servers' context."""

    code = "prompt_too_long"


# what a resumed analysis keeps of an earlier attempt: per prompt key, its ids and plain generation
Generated = Mapping[str, tuple[list[int], "TimedCompletion"]]


Progress = Callable[[str], None]


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
        return all(served_counts(t.measured) == replay_counts(self.trial_replay(t)) for t in served)


def _geometric_speedup(trials: Sequence[Trial]) -> float | None:
    return float(np.exp(np.mean([np.log(t.speedup) for t in trials]))) if trials else None


def aggregate_noise(cost: ServerCost, settings: Sequence[SettingOutcome], run_error: float) -> float | None:
    """The 95% half-width run noise (one run's relative error ``run_error``) leaves on the time-weighted
    measured speedup over ``settings``' undisturbed trials: each prompt weighted by its plain time, with its
    own number of passes (None: no undisturbed trial)."""
    quiet = [s for s in settings if s.quiet_trials]
    if not quiet:
        return None
    return sampled_half_width(
        run_error, [cost.plain_ms(s.replay) for s in quiet], [len(s.quiet_trials) for s in quiet]
    )


def served_counts(run: TimedCompletion) -> tuple[int, int]:
    """A server run's (draft_n, draft_n_accepted): a server that drafted nothing leaves both out of timings."""
    timings = run.completion.timings
    return int(timings.get("draft_n", 0)), int(timings.get("draft_n_accepted", 0))


def replay_counts(replay: ServerReplay) -> tuple[int, int]:
    """A replay's (draft_n, draft_n_accepted), as a server's timings would give them."""
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
    ``withheld`` says why the advice may not be used (None: it may); ``validation_repeats`` is the most
    passes validation made over a prompt; ``left_out_settings`` and ``left_out_prompts`` what the analysis could
    not take, and why; ``validation_plan`` the prompts validation took, its budget and what stopped it;
    ``calibration_why`` what stopped calibration where it did; ``pass_order`` the passes in the order the
    servers got them (``calibration 1 <key>``, ``validation 2 <key>``)."""

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
    fit_bound: float | None = None
    # settings left out because their servers disagreed with their replays (label: why), and prompts left out
    # because the context cannot hold them ({"prompt_id", "task", "tokens", "why"})
    left_out_settings: dict[str, str] = field(default_factory=dict)
    left_out_prompts: list[dict[str, Any]] = field(default_factory=list)
    # which held-out prompts validation took and why (analyzer/measuring/validation_plan.py; None: none)
    validation_plan: dict[str, Any] | None = None
    calibration_why: str | None = None
    # every pass through the servers in the order they ran (analyzer/analysis/server_passes.py pass_key)
    pass_order: list[str] = field(default_factory=list)
    # the earlier analysis whose fit calibration reused (None: fitted on this workload)
    fit_from: int | None = None

    def cost_of(self, drafter: ServerDrafter) -> ServerCost:
        """The step costs that price ``drafter``: its family's."""
        return self.costs[drafter.family]
