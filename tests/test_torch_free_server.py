"""`specroute serve` without torch: importing the app, creating it (with its in-process worker idle)
and serving the pages and the API load neither torch nor transformers; they load with the first
analysis a worker executes. Checked in a fresh interpreter (this test process has torch already)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = textwrap.dedent("""
    import json, sys
    from sqlalchemy import select
    import migrations
    from analyzer.db import make_engine, make_session_factory
    from analyzer.prompts.prompt_sets import import_sample
    from router.classify.training import train_classifier
    from router.classify.training_data import make_training_data
    from router.policies.policy import publish_policies
    from tests.factories import make_done_run
    from webui.app import create_app

    url = sys.argv[1]
    engine = make_engine(url)
    migrations.upgrade(engine)
    with make_session_factory(engine)() as session, session.begin():
        import_sample(session)
        texts = [f"def f{i}(x): return x" for i in range(6)] + [f"Who wrote book {i}?" for i in range(6)]
        train_classifier(session, make_training_data(texts, ["code"] * 6 + ["qa"] * 6, "test"))
        run = make_done_run(session, {"code": 0.8, "qa": 0.2})
        publish_policies(session, run.id)
        run_id = run.id
    app = create_app({"database_url": url, "data_dir": sys.argv[2], "ui_worker": True, "TESTING": True})
    client = app.test_client()
    statuses = {}
    for path in ("/", "/prompts", "/prompts/sample", "/runs", f"/runs/{run_id}", "/runs/new", "/classifier",
                 "/policies", "/playground", "/healthz", "/metrics", "/v1/policies", "/v1/classifier"):
        statuses[path] = client.get(path).status_code
    route = client.post("/v1/route", json={"prompt": "def g(y): return y", "max_new_tokens": 64})
    statuses["POST /v1/route"] = route.status_code
    app.extensions["specroute.close"]()
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "transformers"))
    print(json.dumps({"statuses": statuses, "loaded": loaded[:5], "count": len(loaded)}))
""")


@pytest.mark.slow
@pytest.mark.parallel
def test_serving_pages_and_the_api_loads_neither_torch_nor_transformers(tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, f"sqlite:///{tmp_path / 'serve.db'}", str(tmp_path / "data")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(report["statuses"].values()) == {200}, report["statuses"]
    assert report["count"] == 0, f"serving imported {report['loaded']}"
