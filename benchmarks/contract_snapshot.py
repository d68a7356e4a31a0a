"""What the run-to-router contract produces, as one canonical JSON document, so that two versions of
the code can be compared (a change meant to keep the behaviour must leave it equal): simulated analysis runs (real walk,
fixed cost profiles, several batch sizes and acceptance rates), their published policy sets
(``policy_set_dict``, timestamps and versions dropped) and the router's decision for a grid of requests
per task (task, speculate, gamma, expected speedup to 6 digits), before and after feedback events.

    python benchmarks/contract_snapshot.py > after.json
    PYTHONPATH=<checkout of the other version> python benchmarks/contract_snapshot.py > before.json
    diff before.json after.json

Only stable entry points are used (create_simulated_run, publish_policies, policy_set_dict,
router_from_database, record_feedback), so the same script runs on both versions. No timing.
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
from pathlib import Path

if "PYTHONPATH" not in os.environ:  # else: the checkout PYTHONPATH names (the version to compare)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import migrations  # noqa: E402

try:
    from analyzer.analysis.simulated_run import create_simulated_run  # noqa: E402
except ImportError:  # a checkout whose analyzer/ has no subpackages
    from analyzer.simulated_run import create_simulated_run  # type: ignore[no-redef]  # noqa: E402
from analyzer.db import make_engine, make_session_factory  # noqa: E402
from router.decide.contract import RouteRequest
from router.decide.decision import router_from_database  # noqa: E402
from router.policies.policy import publish_policies  # noqa: E402
from router.policies.records import policy_set_dict  # noqa: E402

TASKS = {"code": 0.92, "rag": 0.75, "qa": 0.35, "creative_writing": 0.12, "math": 0.6}
PER_TASK = {
    "code": 6,
    "rag": 5,
    "qa": 6,
    "creative_writing": 5,
    "math": 2,
}  # math: too few, the workload decides
BATCH_CURVES = {
    4: [0.050, 0.070, 0.085, 0.095, 0.105, 0.115, 0.125, 0.135, 0.145],
    16: [0.080, 0.130, 0.180, 0.230, 0.280, 0.330, 0.380, 0.430, 0.480],
}
SCENARIOS = {
    "ngram, batch 1": dict(draft_spec="ngram:max_ngram=2", draft_step_s=0.001),
    "model draft, batches 1/4/16": dict(batch_curves=BATCH_CURVES),
    "model draft, gamma_max 4": dict(gamma_max=4),
}
REQUESTS = [
    dict(),
    dict(max_new_tokens=8),
    dict(max_new_tokens=200),
    dict(batch_size=2),
    dict(batch_size=4),
    dict(batch_size=10),
    dict(batch_size=16),
    dict(batch_size=32),
    dict(temperature=0.7),
]


def rounded(value):
    """Floats to 6 significant digits (NaN as the string "nan"), recursively."""
    if isinstance(value, float):
        return "nan" if math.isnan(value) else float(f"{value:.6g}")
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [rounded(v) for v in value]
    return value


def decisions(router, label: str) -> list[dict]:
    """The router's decision for every task's label text (the classifier is absent: tasks are forced
    by routing as the task) at every request shape."""
    rows = []
    for task in [*TASKS, "unknown"]:
        for shape in REQUESTS:
            router.classifier = None
            decision = router._decide(RouteRequest.of(f"{task} prompt", **shape), task, 1.0)
            rows.append(
                {
                    "when": label,
                    "task": task,
                    "request": shape,
                    "speculate": decision.speculate,
                    "gamma": decision.gamma,
                    "expected_speedup": rounded(decision.expected_speedup),
                }
            )
    return rows


def scenario(name: str, options: dict) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        engine = make_engine(f"sqlite:///{folder}/snapshot.db")
        migrations.upgrade(engine)
        sessions = make_session_factory(engine)
        with sessions() as session, session.begin():
            run = create_simulated_run(session, TASKS, per_task=PER_TASK, n_tokens=96, seed=3, **options)
            published = publish_policies(session, run.id)
            data = policy_set_dict(published)
        for key in ("version", "created_at", "activated_at", "run_id"):
            data.pop(key, None)
        with sessions() as session:
            router = router_from_database(session)
        rows = decisions(router, "published")
        from router.decide.feedback import parse_feedback, record_feedback  # noqa: PLC0415

        with sessions() as session, session.begin():
            for task, (rounds, drafted, accepted) in {"code": (10, 40, 4), "qa": (10, 20, 19)}.items():
                key = task if any(p["task_type"] == task for p in data["policies"]) else "*"
                # by task type under the active set (a route id is signed with the server's key)
                for _ in range(6):
                    record_feedback(
                        session,
                        parse_feedback(
                            {"task_type": key, "rounds": rounds, "drafted": drafted, "accepted": accepted}
                        ),
                    )
        with sessions() as session:
            router = router_from_database(session)
        rows += decisions(router, "after feedback")
        engine.dispose()
    return {"scenario": name, "policy_set": rounded(data), "decisions": rows}


def main() -> None:
    print(
        json.dumps([scenario(name, options) for name, options in SCENARIOS.items()], indent=1, sort_keys=True)
    )


if __name__ == "__main__":
    main()
