"""Small factory helpers for tests: a finished analysis run built from synthetic match sequences
with the real walk (:mod:`analyzer.simulated_run`), so reports and policies can be tested without
loading models, and a routing database built on one."""

from __future__ import annotations

from analyzer.simulated_run import SIMULATED_COST_CURVE as COST_CURVE
from analyzer.simulated_run import create_simulated_run as make_done_run

__all__ = ["COST_CURVE", "make_done_run", "make_routing_database"]


def make_routing_database(url: str):
    """A migrated database at ``url`` with an active policy set (code speculates, qa does not) and a
    classifier telling code from qa; returns its engine."""
    import migrations
    from analyzer.db import make_engine, make_session_factory
    from router.classifier import train_classifier
    from router.policy import publish_policies
    from router.training_data import make_training_data

    engine = make_engine(url)
    migrations.upgrade(engine)
    with make_session_factory(engine)() as session, session.begin():
        run = make_done_run(session, {"code": 0.9, "qa": 0.2})
        publish_policies(session, run.id)
        texts = [f"def f{i}(x): return x + {i}  # fix this python function" for i in range(6)] + [
            f"What is the capital of country number {i}? Answer briefly." for i in range(6)
        ]
        train_classifier(
            session, make_training_data(texts, ["code"] * 6 + ["qa"] * 6, "test"), cross_validate=False
        )
    return engine
