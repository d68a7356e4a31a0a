"""Small factory helpers for tests: a finished analysis run built from synthetic match sequences
with the real walk (:mod:`analyzer.analysis.simulated_run`), so reports and policies can be tested without
loading models, and a routing database built on one."""

from __future__ import annotations

from analyzer.analysis.simulated_run import SIMULATED_COST_CURVE as COST_CURVE
from analyzer.analysis.simulated_run import create_simulated_run as make_done_run

__all__ = ["COST_CURVE", "make_done_run", "make_routing_database", "routing_test_app"]


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


def routing_test_app(folder, **config):
    """(app, its test client, the session factory, the form's CSRF token, the database engine, its URL):
    a web app over a routing database in ``folder`` (no UI worker, no router refresh), for tests that
    post to every surface. The caller closes ``app.extensions["specroute.close"]`` and disposes the engine."""
    import re

    from analyzer.db import make_session_factory
    from webui.app import create_app

    url = f"sqlite:///{folder}/routing.db"
    engine = make_routing_database(url)
    app = create_app(
        {
            "database_url": url,
            "data_dir": str(folder),
            "router_refresh_s": 0,
            "ui_worker": False,
            "TESTING": True,
        }
        | config
    )
    client = app.test_client()
    token = re.search(
        r'name="csrf_token" value="([^"]+)"', client.get("/prompts").get_data(as_text=True)
    ).group(1)
    return app, client, make_session_factory(engine), token, engine, url
