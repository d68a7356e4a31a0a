"""Does the advice hold on prompts the project does not ship? An analysis in llama-server of a
workload from sources the bundled corpus does not contain, validated through the servers, priced twice from
the same measurements:

- **before** (a simpler baseline): the first 6 prompts in set order calibrate, the
  plain step is their median time per step, and the rounds are a non-negative least squares over (rounds,
  drafted, accepted) with no context term and no bound on what an accepted token costs;
- **after**: the analysis' own model: calibration prompts chosen to span context lengths and draft rates, a
  context term, physical constraints, a held-out check against a bound from the machine's noise.

Both are judged on the same runs: the validated prompts that neither model calibrated on. Printed per model:
the fit; per setting the error of the time-weighted aggregate, the per-prompt error and the share of prompts
within the noise floor + 3 points, and the correlation of predicted and measured among prompts that draft;
per task the aggregate error; and the machine's noise floor beside them. Then the routing numbers (best static
setting, routing by task, per-prompt oracle) from the after model. Writes JSON to benchmarks/results/.

Workloads (none of them in analyzer/sample_data or the classifier's bundled corpus):

- ``unseen``: ../shared/data/prompts/dev-extra.jsonl (``--per-task`` per task of its 5 tasks) and
  benchmarks/data/written_prompts.jsonl (12 prompts written for this benchmark: code edits, translation,
  reformatting, extraction);
- ``long``: long documents with a question, 1,000-3,000 tokens: sections of the license texts Debian ships in
  /usr/share/common-licenses and of Python's standard library sources, asked to summarize, extract, answer,
  translate or change.

    python benchmarks/cost_transfer.py --workload unseen [--per-task 8] [--repeats 3]
    python benchmarks/cost_transfer.py --workload long

Run it with nothing else on the machine; every figure is for the CPU model and thread count it prints.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
from scipy.optimize import nnls

from analyzer.analysis.server_analysis import ValidationAsk, analyze_in_llama_server
from analyzer.analysis.server_calibration import fit_costs
from analyzer.analysis.server_figures import ceilings
from analyzer.analysis.server_generation import ServerSetup
from analyzer.analysis.server_outcomes import ServerAnalysis, ServerPrompt, SettingOutcome
from analyzer.analysis.server_passes import ServerHistory
from analyzer.analysis.server_text import cost_text, noise_text
from analyzer.engine.llama_server import find_llama_server
from analyzer.engine.llamacpp_engine import gguf_file
from analyzer.measuring.noise import PER_PROMPT_MARGIN
from analyzer.measuring.server_drafting import ServerReplay, parse_drafter
from analyzer.models.devices import cpu_model_name
from analyzer.models.specs import parse_spec
from analyzer.settings import load_settings

HERE = Path(__file__).resolve().parent
EXTRA = HERE.parents[1] / "shared" / "data" / "prompts" / "dev-extra.jsonl"
WRITTEN = HERE / "data" / "written_prompts.jsonl"
LICENSES = Path("/usr/share/common-licenses")
DRAFTERS = ("ngram-simple", "ngram-simple 3/8", "ngram-simple 2/4", "ngram-mod", "ngram-mod 16 8-32")
LONG_CONTEXT_TASKS = ("rag", "summarization", "extraction", "translation")
LEGACY_CALIBRATION = 6
RESULTS = HERE / "results"

Price = Callable[[ServerReplay], tuple[float, float]]  # a replay -> (plain ms, speculative ms)


def unseen_prompts(per_task: int) -> list[ServerPrompt]:
    rows = [json.loads(line) for line in EXTRA.read_text().splitlines()]
    counts: dict[str, int] = {}
    chosen = []
    for row in rows:
        if counts.get(row["task"], 0) < per_task:
            counts[row["task"]] = counts.get(row["task"], 0) + 1
            chosen.append(row)
    chosen += [json.loads(line) for line in WRITTEN.read_text().splitlines()]
    prompts = [ServerPrompt(r["id"], r["task"], [{"role": "user", "content": r["prompt"]}]) for r in chosen]
    # interleave the tasks, as a real upload would not be sorted by task
    rank = {p.key: [q.key for q in prompts if q.task == p.task].index(p.key) for p in prompts}
    return sorted(prompts, key=lambda p: rank[p.key])


def _sections(text: str, size: int, count: int) -> list[str]:
    """``count`` pieces of about ``size`` characters, cut at paragraph ends, spread over ``text``."""
    paragraphs = [p for p in text.split("\n\n") if p.strip()]
    pieces, current = [], ""
    for paragraph in paragraphs:
        current = f"{current}\n\n{paragraph}" if current else paragraph
        if len(current) >= size:
            pieces.append(current)
            current = ""
    step = max(len(pieces) // max(count, 1), 1)
    return pieces[::step][:count]


def long_prompts() -> list[ServerPrompt]:
    """Long documents with a question: license sections (summarize, extract, answer, translate) and standard
    library sources (change the code), about 4,500-11,000 characters each."""
    questions = [
        ("summarization", "Summarize the text above in five bullet points."),
        ("extraction", "List every obligation the text above places on the person who distributes the work."),
        ("rag", "Using only the text above, answer: under which conditions may the work be redistributed?"),
        ("translation", "Translate the first two paragraphs of the text above into French."),
    ]
    prompts: list[ServerPrompt] = []
    for name in ("GPL-3", "Apache-2.0", "GFDL-1.3", "MPL-2.0", "LGPL-2.1", "GPL-2", "MPL-1.1"):
        path = LICENSES / name
        if not path.exists():
            continue
        for index, section in enumerate(_sections(path.read_text(errors="replace"), 8000, 3)):
            task, question = questions[(len(prompts)) % len(questions)]
            prompts.append(
                ServerPrompt(
                    f"{name}:{index}", task, [{"role": "user", "content": f"{section}\n\n{question}"}]
                )
            )
    stdlib = Path(os.__file__).parent
    code_questions = (
        "Add type hints to every function above and return the changed code.",
        "Rewrite the first function above with a docstring and clearer variable names; return the code.",
    )
    for index, name in enumerate(
        ("textwrap.py", "shlex.py", "fractions.py", "calendar.py", "difflib.py", "statistics.py")
    ):
        source = (stdlib / name).read_text()
        start = min(i for i in (source.find("\ndef "), source.find("\nclass "), len(source)) if i >= 0)
        body = source[start : start + 8000] if start >= 0 else source[:8000]
        prompts.append(
            ServerPrompt(
                f"stdlib:{name}", "code",
                [{"role": "user", "content": f"```python\n{body}\n```\n\n{code_questions[index % 2]}"}],
            )
        )  # fmt: skip
    rank = {p.key: [q.key for q in prompts if q.task == p.task].index(p.key) for p in prompts}
    return sorted(prompts, key=lambda p: rank[p.key])


def legacy_price(analysis: ServerAnalysis) -> tuple[Price, dict[str, float], set[str]]:
    """The baseline cost model ("before"), fitted on the first LEGACY_CALIBRATION prompts' first passes (n-gram
    family): its price, its fit and the prompts it calibrated on."""
    first = analysis.prompts[:LEGACY_CALIBRATION]
    per_step = [
        t.plain.completion.predicted_ms / t.plain.steps
        for o in first
        for s in o.settings[:1]
        for t in s.trials[:1]
    ]
    plain_step = float(np.median(per_step))
    rows, target = [], []
    for outcome in first:
        for setting in outcome.settings:
            for trial in setting.trials[:1]:
                replay = setting.trial_replay(trial)
                if replay.rounds:
                    rows.append([len(replay.rounds), replay.draft_n, replay.draft_n_accepted])
                    target.append(trial.measured.completion.predicted_ms - plain_step * replay.plain_steps)
    coef = nnls(np.asarray(rows, dtype=float), np.asarray(target))[0] if rows else np.zeros(3)
    round_ms, per_draft, per_accepted = (float(c) for c in coef)

    def price(replay: ServerReplay) -> tuple[float, float]:
        plain = plain_step * max(replay.output_tokens - 1, 0)
        spec = (
            plain_step * replay.plain_steps
            + sum(round_ms + per_draft * k for k, _ in replay.rounds)
            + per_accepted * replay.draft_n_accepted
        )
        return plain, spec

    fit = {
        "plain_step_ms": plain_step,
        "round_ms": round_ms,
        "per_draft_ms": per_draft,
        "per_accepted_ms": per_accepted,
    }
    predicted = [price(r) for r in _first_pass_replays(first)]
    measured = [ms for ms in _first_pass_ms(first)]
    fit["fit_mare"] = float(np.mean([abs(p[1] - m) / m for p, m in zip(predicted, measured, strict=True)]))
    return price, fit, {o.prompt.key for o in first}


def _first_pass_replays(outcomes) -> list[ServerReplay]:
    return [
        s.trial_replay(t)
        for o in outcomes
        for s in o.settings
        for t in s.trials[:1]
        if s.trial_replay(t).rounds
    ]


def _first_pass_ms(outcomes) -> list[float]:
    return [
        t.measured.completion.predicted_ms
        for o in outcomes
        for s in o.settings
        for t in s.trials[:1]
        if s.trial_replay(t).rounds
    ]


def reprice(analysis: ServerAnalysis) -> None:
    """Fit the analysis' costs anew on its own measurements with this code's model, and predict again. Each
    run is first replayed as served, as the analysis now does while it measures: the servers' requests
    replayed in the order they got them (the calibration passes over the calibration prompts, then the
    validation passes over the others, as ``pass_order`` records them), ngram-mod's tables fed the output each
    server served."""
    history = ServerHistory(analysis.n_predict, analysis.n_ctx)
    chosen = [o for o in analysis.prompts if o.calibration]
    by_key = {o.prompt.key: o for o in analysis.prompts}
    if getattr(analysis, "pass_order", None):
        order = [by_key[key.split(" ", 2)[2]] for key in analysis.pass_order]
    else:  # an analysis measured with a fixed count: its calibration passes, then validation's, in workload order
        held_out = [o for o in analysis.prompts if not o.calibration]
        order = chosen * getattr(analysis, "calibration_passes", 1) + held_out * analysis.validation_repeats
    done: dict[str, int] = {}
    for outcome in order:
        index = done[outcome.prompt.key] = done.get(outcome.prompt.key, -1) + 1
        for number, setting in enumerate(outcome.settings):
            trial = setting.trials[index]
            replay = history.replay(number, setting, outcome, trial.measured.completion)
            setting.trials[index] = replace(trial, replay=replay)
    analysis.costs = fit_costs(chosen)
    for outcome in analysis.prompts:
        for setting in outcome.settings:
            setting.predicted_speedup = analysis.costs[setting.drafter.family].speedup(setting.replay)
    bound = analysis.fit_bound or 0.0
    problems = [f for f, cost in analysis.costs.items() if cost.checked_error > bound]
    analysis.withheld = f"re-priced: {', '.join(problems)} over the bound {bound:.1%}" if problems else None


def after_price(analysis: ServerAnalysis, drafter_family: str) -> Price:
    cost = analysis.costs[drafter_family]
    return lambda replay: (cost.plain_ms(replay), cost.speculative_ms(replay))


def _replay(setting: SettingOutcome, trial, advice: bool) -> ServerReplay:
    """The replay a run is priced from: of the output the server served, or (``advice``) of plain greedy
    output, as the advice was predicted before any server ran it."""
    return setting.replay if advice else setting.trial_replay(trial)


def _trials(setting: SettingOutcome, advice: bool) -> list:
    """The runs judged: every undisturbed one, or (``advice``) those that measured what the advice predicts
    (ngram-mod's first pass: later passes find the prompt's own output in its server's table)."""
    return setting.advice_trials if advice else setting.quiet_trials


def _prediction(price: Price, setting: SettingOutcome, advice: bool = False) -> float | None:
    quiet = _trials(setting, advice)
    if not quiet:
        return None
    values = []
    for trial in quiet:
        plain, spec = price(_replay(setting, trial, advice))
        values.append(np.log(plain / spec) if spec > 0 else 0.0)
    return float(np.exp(np.mean(values)))


def _aggregate(
    price: Price, settings: Sequence[SettingOutcome], advice: bool = False
) -> tuple[float | None, float | None]:
    pp = ps = mp = ms = 0.0
    for setting in settings:
        for trial in _trials(setting, advice):
            plain, spec = price(_replay(setting, trial, advice))
            pp, ps = pp + plain, ps + spec
            mp += trial.plain_step_ms * trial.measured.steps
            ms += trial.measured.completion.predicted_ms
    return (pp / ps if ps else None), (mp / ms if ms else None)


def judge(analysis: ServerAnalysis, price: Price, evaluated: set[str], advice: bool = False) -> dict:
    """The figures of one price over the evaluated prompts, each run priced from the replay of the output its
    server served (the cost model's own error), or with ``advice`` from plain greedy output's (the advice's
    error: the cost model's and any drift of the speculative output from plain greedy)."""
    noise = analysis.noise
    per_setting, per_task = [], {}
    for index, drafter in enumerate(analysis.drafters):
        settings = [
            o.settings[index]
            for o in analysis.prompts
            if o.prompt.key in evaluated and o.settings[index].quiet_trials
        ]
        pairs = [
            (p, m, len(_trials(s, advice)), s)
            for s in settings
            if (p := _prediction(price, s, advice))
            and (m := s.advised_speedup if advice else s.measured_speedup)
        ]
        predicted, measured = _aggregate(price, settings, advice)
        drafting = [(p, m) for p, m, _, s in pairs if any(s.trial_replay(t).draft_n for t in s.quiet_trials)]
        corr = (
            float(np.corrcoef(np.asarray(drafting).T)[0, 1])
            if len(drafting) >= 3 and np.std([d[0] for d in drafting]) > 0
            else None
        )
        floor = (lambda n: noise.floor_for(n) or 0.0) if noise is not None else (lambda n: 0.0)
        per_setting.append(
            {
                "setting": drafter.label,
                "prompts": len(pairs),
                "aggregate_predicted": predicted,
                "aggregate_measured": measured,
                "aggregate_error": abs(predicted / measured - 1) if predicted and measured else None,
                "mare": float(np.mean([abs(p - m) / m for p, m, _, _ in pairs])) if pairs else None,
                "within_noise": float(
                    np.mean([abs(p - m) / m <= floor(n) + PER_PROMPT_MARGIN for p, m, n, _ in pairs])
                )
                if pairs
                else None,
                "correlation": corr,
                "drafting": len(drafting),
            }
        )
    for task in sorted({o.prompt.task for o in analysis.prompts}):
        errors = []
        for index in range(len(analysis.drafters)):
            settings = [
                o.settings[index]
                for o in analysis.prompts
                if o.prompt.task == task and o.prompt.key in evaluated
            ]
            predicted, measured = _aggregate(price, settings, advice)
            if predicted and measured:
                errors.append(abs(predicted / measured - 1))
        per_task[task] = {
            "mean_error": float(np.mean(errors)) if errors else None,
            "worst": max(errors, default=None),
        }
    all_drafting = []
    for index in range(len(analysis.drafters)):
        for o in analysis.prompts:
            s = o.settings[index]
            if (
                o.prompt.key in evaluated
                and s.quiet_trials
                and any(s.trial_replay(t).draft_n for t in s.quiet_trials)
            ):
                p, m = _prediction(price, s, advice), (s.advised_speedup if advice else s.measured_speedup)
                if p and m:
                    all_drafting.append((p, m))
    overall_corr = float(np.corrcoef(np.asarray(all_drafting).T)[0, 1]) if len(all_drafting) >= 3 else None
    return {
        "settings": per_setting,
        "tasks": per_task,
        "correlation_all": overall_corr,
        "runs_drafting": len(all_drafting),
    }


def _fmt(value: float | None, form: str = "{:.1%}") -> str:
    return "-" if value is None else form.format(value)


def print_judgement(name: str, figures: dict) -> None:
    print(f"\n{name}: per setting (validated prompts neither model calibrated on)")
    print(
        "| setting | prompts | aggregate predicted / measured | aggregate error | error per prompt | "
        "within noise + 3 pts | correlation (drafting) |"
    )
    print("|---|---|---|---|---|---|---|")
    for f in figures["settings"]:
        print(
            f"| {f['setting']} | {f['prompts']} | {_fmt(f['aggregate_predicted'], '{:.3f}')} / "
            f"{_fmt(f['aggregate_measured'], '{:.3f}')} | {_fmt(f['aggregate_error'])} | {_fmt(f['mare'])} | "
            f"{_fmt(f['within_noise'], '{:.0%}')} | {_fmt(f['correlation'], '{:.2f}')} ({f['drafting']}) |"
        )
    overall = _fmt(figures["correlation_all"], "{:.2f}")
    print(f"correlation over every setting's drafting runs: {overall} ({figures['runs_drafting']} runs)")
    print("| task | mean aggregate error over settings | worst |")
    print("|---|---|---|")
    for task, row in figures["tasks"].items():
        print(f"| {task} | {_fmt(row['mean_error'])} | {_fmt(row['worst'])} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=("unseen", "long"), default="unseen")
    parser.add_argument(
        "--per-task", type=int, default=8, help="prompts per task of dev-extra.jsonl (unseen)"
    )
    parser.add_argument("--n-predict", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--calibration", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3, help="at most this many validation passes")
    parser.add_argument(
        "--reprice",
        action="store_true",
        help="measure nothing: refit and re-price the measurements this script saved last time for this workload "
        "(benchmarks/results/cost_transfer_WORKLOAD.pickle: this script's own runs, never a user upload)",
    )
    args = parser.parse_args()
    settings = load_settings()
    binary = find_llama_server(settings.llama_server, settings.resolved_data_dir() / "cache").path
    setup = ServerSetup(binary, gguf_file(parse_spec("builtin:smollm2-135m-instruct")), args.threads, 4096)
    prompts = unseen_prompts(args.per_task) if args.workload == "unseen" else long_prompts()
    saved = RESULTS / f"cost_transfer_{args.workload}.pickle"
    started = time.perf_counter()
    if args.reprice:
        with saved.open("rb") as source:
            analysis = pickle.load(source)  # this script's own measurements, from this machine
        reprice(analysis)
    else:
        analysis = analyze_in_llama_server(
            setup, prompts, [parse_drafter(d) for d in DRAFTERS], n_predict=args.n_predict,
            calibration_prompts=args.calibration, validate=True,
            # every held-out prompt: the accuracy is judged on all of them
            validation=ValidationAsk(args.repeats, budget_share=None),
            say=lambda line: print(f"  {line}", flush=True),
        )  # fmt: skip
        saved.parent.mkdir(parents=True, exist_ok=True)
        with saved.open("wb") as sink:
            pickle.dump(analysis, sink)
    wall = time.perf_counter() - started
    lengths = [len(o.prompt_ids) for o in analysis.prompts]
    print(
        f"\n{args.workload}: {len(prompts)} prompts ({min(lengths)}-{max(lengths)} tokens, median "
        f"{int(np.median(lengths))}), {args.n_predict} new tokens, {args.threads} threads, on {cpu_model_name()} "
        f"({os.cpu_count()} cores); llama-server {binary}; {wall:.0f} s"
    )
    print(noise_text(analysis.noise.as_dict() if analysis.noise else None))
    calibrated = getattr(analysis, "calibration_why", None)  # None in a pickle that does not carry it
    print(f"validation passes: {analysis.validation_repeats}; calibration: {calibrated}")
    if analysis.withheld:
        print(f"ADVICE WITHHELD: {analysis.withheld}")
    runs = [(s, t) for o in analysis.prompts for s in o.settings for t in s.trials if s.replayed_as_served(t)]
    equal = sum(
        (
            t.measured.completion.timings.get("draft_n", 0),
            t.measured.completion.timings.get("draft_n_accepted", 0),
        )
        == (s.trial_replay(t).draft_n, s.trial_replay(t).draft_n_accepted)
        for s, t in runs
    )
    left = sum(t.measured.completion.tokens != t.plain.completion.tokens for s, t in runs)
    print(
        f"draft counts equal to the replay of the served output: {equal} of {len(runs)} runs "
        f"({left} of them served output that left plain greedy)"
    )
    legacy, legacy_fit, legacy_keys = legacy_price(analysis)
    calibrated = {o.prompt.key for o in analysis.prompts if o.calibration}
    evaluated = {o.prompt.key for o in analysis.prompts} - calibrated - legacy_keys
    print(f"evaluated on {len(evaluated)} prompts (neither model's calibration prompts)")
    print(
        f"before: plain step {legacy_fit['plain_step_ms']:.2f} ms; a round {legacy_fit['round_ms']:.2f} ms + "
        f"{legacy_fit['per_draft_ms']:.2f} ms per drafted + {legacy_fit['per_accepted_ms']:.2f} ms per accepted "
        f"token; fit error {legacy_fit['fit_mare']:.1%} (first {LEGACY_CALIBRATION} prompts, in-sample)"
    )
    after = analysis.costs["n-gram"]
    print(f"after: {cost_text({**after.as_dict(), 'bound': analysis.fit_bound})}")
    before_figures = judge(analysis, legacy, evaluated)
    after_figures = judge(analysis, after_price(analysis, "n-gram"), evaluated)
    advice_figures = judge(analysis, after_price(analysis, "n-gram"), evaluated, advice=True)
    print_judgement("before", before_figures)
    print_judgement("after", after_figures)
    print_judgement("after, the advice (priced from plain greedy output's replay)", advice_figures)
    long_before = [
        before_figures["tasks"][t]["mean_error"] for t in LONG_CONTEXT_TASKS if t in before_figures["tasks"]
    ]
    long_after = [
        after_figures["tasks"][t]["mean_error"] for t in LONG_CONTEXT_TASKS if t in after_figures["tasks"]
    ]
    if long_before:
        print(
            f"\nlong-context tasks ({', '.join(t for t in LONG_CONTEXT_TASKS if t in after_figures['tasks'])}): mean "
            f"aggregate error {np.mean([e for e in long_before if e is not None]):.1%} before, "
            f"{np.mean([e for e in long_after if e is not None]):.1%} after"
        )
    routing = ceilings(analysis)
    print("\n| group | prompts | best static setting | routing by task | per-prompt oracle |")
    print("|---|---|---|---|---|")
    for c in routing:
        print(
            f"| {c.group} | {c.prompts} | {c.static:.3f} [{c.static_interval[0]:.3f}, {c.static_interval[1]:.3f}] "
            f"({c.static_option or 'off'}) | "
            f"{c.by_task:.3f} [{c.by_task_interval[0]:.3f}, {c.by_task_interval[1]:.3f}] | "
            f"{c.oracle:.3f} [{c.oracle_interval[0]:.3f}, {c.oracle_interval[1]:.3f}] |"
        )
    out = RESULTS / f"cost_transfer_{args.workload}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "workload": args.workload,
                "cpu": cpu_model_name(),
                "threads": args.threads,
                "prompts": len(prompts),
                "prompt_tokens": lengths,
                "noise": analysis.noise.as_dict() if analysis.noise else None,
                "withheld": analysis.withheld,
                "validation_repeats": analysis.validation_repeats,
                "before": {"fit": legacy_fit, **before_figures},
                "after": {"fit": after.as_dict(), "bound": analysis.fit_bound, **after_figures},
                "advice": advice_figures,
                "replayed_as_served": {"runs": len(runs), "counts_equal": equal, "left_plain": left},
                "routing": [c.as_dict() for c in routing],
                "seconds": wall,
            },
            indent=1,
        )
    )
    print(f"wrote {out}")
    from readme_tables import write_readme  # benchmarks/README.md's tables (this folder is on sys.path)

    write_readme()


if __name__ == "__main__":
    main()
