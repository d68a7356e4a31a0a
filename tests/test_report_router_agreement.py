"""One decision rule: for every task and every profiled batch size of several runs, the decision the
report shows is the one published and the one the router routes: the same on/off and the same gamma.
The runs cover the cases two rules could decide differently: a task too small to decide on its own (whose
gamma, its own or the workload's), a two-prompt workload (whether its wide interval counts), batch sizes
where speculation pays and where it does not."""

from __future__ import annotations

import pytest

import migrations
from analyzer.advice.report import build_report
from analyzer.db import make_engine, make_session_factory
from router.decide.decision import router_from_database
from router.policies.policy import FALLBACK_TASK, NO_GAMMA, publish_policies
from tests.factories import make_done_run

FLAT = [0.040, 0.041, 0.042, 0.043, 0.044, 0.045, 0.046, 0.047, 0.048]
STEEP = [0.050, 0.090, 0.130, 0.170, 0.210, 0.250, 0.290, 0.330, 0.370]
MIDDLE = [0.080, 0.100, 0.125, 0.150, 0.175, 0.200, 0.225, 0.250, 0.275]
RUNS = {
    "mixed, a small task, three batch sizes": dict(
        tasks={"code": 0.92, "rag": 0.7, "qa": 0.35, "creative_writing": 0.12, "math": 0.6},
        per_task={"code": 6, "rag": 5, "qa": 6, "creative_writing": 5, "math": 2},
        batch_curves={4: MIDDLE, 16: FLAT},
    ),
    "a two-prompt workload": dict(
        tasks={"a": 0.7, "b": 0.05}, per_task=1, seed=2, batch_curves={4: FLAT, 16: MIDDLE}
    ),
    "steep at large batches": dict(
        tasks={"code": 0.95, "qa": 0.9, "math": 0.3},
        per_task={"code": 8, "qa": 8, "math": 2},
        batch_curves={4: FLAT, 16: STEEP},
    ),
    "low acceptance everywhere": dict(tasks={"chat": 0.1, "qa": 0.15}, per_task=4, batch_curves={8: FLAT}),
}


class OneTask:
    """A classifier that calls every prompt ``task``, sure of it (or unsure: the fallback decides)."""

    version, threshold, rarely_reached, catch_all = 1, None, {}, {}

    def __init__(self, task: str, confidence: float = 0.99):
        self.task, self.confidence = task, confidence

    def predict(self, texts):
        return [(self.task, self.confidence)] * len(texts)


def _routed(router, task: str, batch_size: int) -> tuple[bool, int]:
    router.classifier = OneTask(task) if task != FALLBACK_TASK else OneTask("nobody", 0.0)
    decision = router.route("a request", max_new_tokens=1000, batch_size=batch_size)
    return decision.speculate, decision.gamma


def _shown(group: dict) -> tuple[bool, int]:
    return bool(group["speculate"]), group["best_gamma"] if group["speculate"] else NO_GAMMA


@pytest.mark.parametrize("name", list(RUNS))
def test_the_report_the_published_policies_and_the_router_agree_at_every_task_and_batch_size(tmp_path, name):
    engine = make_engine(f"sqlite:///{tmp_path}/agree.db")
    migrations.upgrade(engine)
    sessions = make_session_factory(engine)
    with sessions() as session, session.begin():
        run = make_done_run(session, **RUNS[name])
        report = build_report(session, run.id)
        published = {p.task_type: p for p in publish_policies(session, run.id).policies}
    with sessions() as session:
        router = router_from_database(session)
    groups = {**report["tasks"], FALLBACK_TASK: report["workload"]}
    checked = 0
    for task, group in groups.items():
        policy = published[task]
        assert (policy.speculate, policy.gamma if policy.speculate else NO_GAMMA) == _shown(group), task
        assert _routed(router, task, 1) == _shown(group), (task, 1)
        for batch, entry in group["by_batch"].items():
            if int(batch) == 1:
                continue  # the batch-1 decision is the group's own, checked above
            assert _routed(router, task, int(batch)) == _shown(entry), (task, batch)
            checked += 1
    assert checked >= len(groups)
    engine.dispose()


def _report(tmp_path, name: str) -> dict:
    engine = make_engine(f"sqlite:///{tmp_path}/{len(name)}.db")
    migrations.upgrade(engine)
    with make_session_factory(engine)() as session, session.begin():
        report = build_report(session, make_done_run(session, **RUNS[name]).id)
    engine.dispose()
    return report


def test_the_cases_that_used_to_disagree_are_in_the_runs(tmp_path):
    """The runs above hold a small task routed at the workload's gamma (not its own) at a batch size
    above 1, and a two-prompt workload whose interval turns it off where S(g*) alone would not."""
    report = _report(tmp_path, "steep at large batches")
    math, workload = report["tasks"]["math"], report["workload"]
    assert math["decision_basis"] == "workload"
    shown = math["by_batch"]["4"]
    own = max(range(1, 9), key=lambda g: shown["speedup_curve"][g - 1] or 0.0)
    assert shown["best_gamma"] == workload["by_batch"]["4"]["best_gamma"] != own
    tiny = _report(tmp_path, "a two-prompt workload")["workload"]["by_batch"]["4"]
    assert tiny["predicted_speedup"] > 1.05 and tiny["speedup_interval"][0] < 1.0
    assert (tiny["speculate"], tiny["decision_code"]) == (False, "interval_reaches_loss")
