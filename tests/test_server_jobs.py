"""Analyses in llama-server as queued work (analyzer/analysis/server_jobs.py): checked parameters, claims (and
claims of a job whose worker died), cancel and resume, the web form and job page, and, with real servers, a
job whose server dies mid-analysis failing with its code and resuming with its plain generations kept, one
that dies mid-validation resuming from the pass it did not finish, and a prompt longer than the context refused
with its code."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from datetime import timedelta

import pytest
from sqlalchemy import update

from analyzer.analysis import server_generation, server_passes
from analyzer.analysis.server_jobs import (
    ServerJobError,
    ServerJobParams,
    cancel_server_job,
    claim_server_job,
    create_server_job,
    execute_server_job,
    get_server_job,
    job_view,
    resume_server_job,
)
from analyzer.db import make_session_factory, utcnow
from analyzer.engine.llama_server_process import LlamaServerError
from analyzer.orm import ServerAnalysisJob, ServerAnalysisRecord
from analyzer.prompts.prompt_sets import import_sample
from tests.small_gguf import gguf_spec


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (ServerJobParams(n_predict=1), "n_predict must be a whole number from 2 to 4096, got 1"),
        (
            ServerJobParams(validate_repeats=21),
            "validate_repeats must be a whole number from 1 to 20, got 21",
        ),
        (ServerJobParams(limit=0), "limit must be a whole number from 1 to 10000000, got 0"),
        (ServerJobParams(drafters=("ngram-cache",)), "drafters: drafter 'ngram-cache': start with one of"),
        (ServerJobParams(drafters=("ngram-mod", "ngram-mod")), "drafters: a setting is named twice"),
        (
            ServerJobParams(drafters=("draft-simple",)),
            "draft_model: a draft-simple setting needs the draft model",
        ),
        (ServerJobParams(drafters=()), "drafters: give at least one drafter setting"),
    ],
)
def test_bad_parameters_are_refused_naming_the_field(params, message):
    with pytest.raises(ServerJobError, match=message.replace("(", r"\(").replace(")", r"\)")):
        params.checked()


def test_a_job_is_claimed_once_reclaimed_when_its_worker_died_and_resumed_after_it_stopped(engine, session):
    sessions = make_session_factory(engine)
    prompt_set, _ = import_sample(session)
    job = create_server_job(session, prompt_set, ServerJobParams(limit=4))
    session.commit()
    assert (job.status, job.params["limit"], job.params["drafters"][0]) == ("queued", 4, "ngram-simple")
    assert claim_server_job(sessions, "a") == job.id
    assert claim_server_job(sessions, "b") is None  # running, its heartbeat fresh
    # worker a died: its heartbeat goes stale, and b takes the job over
    with sessions() as other, other.begin():
        other.execute(update(ServerAnalysisJob).values(heartbeat_at=utcnow() - timedelta(seconds=700)))
    assert claim_server_job(sessions, "b", stale_after_s=600) == job.id
    session.expire_all()
    job = get_server_job(session, job.id)
    assert (job.status, job.worker_id, job.attempts) == ("running", "b", 2)
    with pytest.raises(ServerJobError, match="only a failed or cancelled job resumes"):
        resume_server_job(session, job.id)
    assert cancel_server_job(session, job.id).status == "cancelled"
    with pytest.raises(ServerJobError, match="only a queued or running job is cancelled"):
        cancel_server_job(session, job.id)
    assert resume_server_job(session, job.id).status == "queued"
    session.commit()
    assert claim_server_job(sessions, "c", job_id=job.id) == job.id


def test_the_web_form_queues_a_job_refuses_bad_values_and_the_job_page_follows_it(session, client):
    import_sample(session)
    session.commit()
    page = client.get("/llama-server").get_data(as_text=True)
    assert 'id="new-server-analysis"' in page and 'name="n_predict" min="2" max="4096" value="64"' in page
    token = re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)
    assert (
        client.post("/llama-server/jobs", data={"prompt_set": "sample"}).status_code == 400
    )  # no CSRF token
    form = {"prompt_set": "sample", "model": "builtin:smollm2-135m-instruct", "n_predict": "24", "per_task": "2",
            "limit": "", "calibration": "3", "validate_repeats": "1", "validate": "on"}  # fmt: skip
    form["csrf_token"] = token
    bad = client.post("/llama-server/jobs", data=form | {"n_predict": "lots"})
    assert (
        bad.status_code == 400
        and "n_predict must be a whole number from 2 to 4096, got &#39;lots&#39;"
        in bad.get_data(as_text=True)
    )
    bad = client.post("/llama-server/jobs", data=form | {"calibration": "0"})
    assert (
        bad.status_code == 400
        and "calibration must be a whole number from 1 to 1000, got 0" in bad.get_data(as_text=True)
    )
    unknown = client.post("/llama-server/jobs", data=form | {"prompt_set": "nope"})
    assert unknown.status_code == 400 and "nope" in unknown.get_data(as_text=True)
    assert session.query(ServerAnalysisJob).count() == 0  # nothing queued by a refused form
    queued = client.post("/llama-server/jobs", data=form)
    assert queued.status_code == 302 and queued.headers["Location"].endswith("/llama-server/jobs/1")
    session.rollback()  # a fresh read: the app committed in its own session
    job = session.get_one(ServerAnalysisJob, 1)
    assert (job.params["n_predict"], job.params["per_task"], job.params["limit"], job.params["validate"]) == (
        24, 2, None, True,
    )  # fmt: skip
    assert (job.params["validate_all"], job.params["refit"]) == (False, False)  # boxes left unticked
    ticked = client.post("/llama-server/jobs", data=form | {"validate_all": "on", "refit": "on"})
    assert ticked.status_code == 302
    session.rollback()
    second = session.get_one(ServerAnalysisJob, 2).params
    assert (second["validate_all"], second["refit"]) == (True, True)
    cancel_server_job(session, 2)  # not for a worker to claim: the rest of this test follows job 1
    session.commit()
    shown = client.get("/llama-server/jobs/1").get_data(as_text=True)
    assert (
        '<dd class="status">queued</dd>' in shown
        and 'data-job-url="/llama-server/jobs/1/status.json"' in shown
    )
    status = client.get("/llama-server/jobs/1/status.json").get_json()
    assert (status["status"], status["kept"], status["passes"], status["analysis_id"]) == (
        "queued",
        0,
        0,
        None,
    )
    assert client.post("/llama-server/jobs/1/cancel", data={"csrf_token": token}).status_code == 302
    assert client.get("/llama-server/jobs/1/status.json").get_json()["status"] == "cancelled"
    assert client.post("/llama-server/jobs/1/resume", data={"csrf_token": token}).status_code == 302
    assert client.get("/llama-server/jobs/1/status.json").get_json()["status"] == "queued"
    assert client.get("/llama-server/jobs/9").status_code == 404
    assert client.post("/llama-server/jobs/1/explode", data={"csrf_token": token}).status_code == 404
    listing = client.get("/llama-server").get_data(as_text=True)
    assert '<tr data-job="1">' in listing


def _short_job(model, **given) -> ServerJobParams:
    """A job of 6 sample prompts (3 of them calibrating), 24 new tokens and one drafter, on GGUF file ``model``."""
    return ServerJobParams(
        model=gguf_spec(model), drafters=("ngram-simple 2/4",), n_predict=24, limit=6, calibration=3, **given
    )


@pytest.mark.slow
def test_a_job_whose_server_dies_fails_with_its_code_and_resumes_keeping_its_generations(
    llama_server_binary, small_gguf, engine, session, tmp_path, monkeypatch
):
    sessions = make_session_factory(engine)
    prompt_set, _ = import_sample(session)
    params = _short_job(small_gguf, validate=False)
    job_id = create_server_job(session, prompt_set, params).id
    session.commit()
    real = server_generation.timed_complete
    calls = {"n": 0}

    def dies_on_the_fourth(server, ids, n_predict):
        calls["n"] += 1
        if calls["n"] == 4:
            raise LlamaServerError(
                "llama-server at http://127.0.0.1:1 did not answer /completion: connection refused"
            )
        return real(server, ids, n_predict)

    monkeypatch.setattr(server_generation, "timed_complete", dies_on_the_fourth)
    lines: list[str] = []
    run = dict(worker_id="w", cache_dir=tmp_path, llama_server=str(llama_server_binary), echo=lines.append)
    assert claim_server_job(sessions, "w") == job_id
    assert execute_server_job(sessions, job_id, **run) is None
    session.expire_all()
    job = get_server_job(session, job_id)
    assert (job.status, job.error_code) == ("failed", "llama_server_error") and "did not answer" in job.error
    assert len(job.generated["outputs"]) == 3 and job.analysis_id is None  # the three made before it died
    assert session.query(ServerAnalysisRecord).count() == 0
    # resumed: the three are kept, the other three generated, and the analysis stored with the job done
    monkeypatch.setattr(server_generation, "timed_complete", real)
    resume_server_job(session, job_id)
    session.commit()
    lines.clear()
    assert claim_server_job(sessions, "w") == job_id
    analysis_id = execute_server_job(sessions, job_id, **run)
    assert analysis_id is not None
    assert "kept 3 plain generations of an earlier attempt" in lines
    generated = [line for line in lines if line.startswith("generated ")]
    assert [line.split()[1] for line in generated] == ["4/6", "5/6", "6/6"]
    session.expire_all()
    job = get_server_job(session, job_id)
    assert (job.status, job.analysis_id, job.attempts, job.error) == ("done", analysis_id, 2, None)
    record = session.get_one(ServerAnalysisRecord, analysis_id)
    assert len(record.prompts) == 6 and record.drafters == ["ngram-simple 2/4"]


# a question in Chinese of about 2,400 characters: far more tokens than characters with the embedded model's
# tokenizer, as long non-English prompts are
LONG_CHINESE = (
    "请仔细阅读下面关于城市交通规划的材料，然后回答问题。"
    + "城市的公共交通系统需要兼顾效率、公平与可持续发展，"
    "规划者必须在地铁、公交、自行车道和步行空间之间取得平衡。"
    * 40
    + "问题：根据材料，规划者应当如何安排预算？"
)


@pytest.mark.slow
def test_prompts_the_context_cannot_hold_are_counted_first_and_left_out_or_refused(
    llama_server_binary, small_gguf, engine, session, tmp_path
):
    """Every prompt is counted before anything is generated: by default a prompt that does not fit the context
    with its new tokens is left out, named in the stored analysis with its token count, and the others are
    analyzed; with long_prompts "refuse" the job fails at once, naming every such prompt, having generated
    nothing."""
    from analyzer.analysis.server_store import server_analysis_json
    from analyzer.prompts.prompt_sets import import_prompt_file

    sessions = make_session_factory(engine)
    rows = [
        {"prompt": "Write a haiku about the sea.", "task": "creative_writing"},
        {"prompt": LONG_CHINESE, "task": "qa"},
        {"prompt": "Repeat after me: one two three four, one two three four.", "task": "general"},
        {"prompt": "List the planets of the solar system.", "task": "qa"},
    ]
    data = "\n".join(json.dumps(row, ensure_ascii=False) for row in rows).encode()
    prompt_set, _ = import_prompt_file(session, "long", data, "long.jsonl")
    session.commit()
    long_key = str(prompt_set.prompts[1].id)
    run = dict(worker_id="w", cache_dir=tmp_path, llama_server=str(llama_server_binary), echo=[].append)
    params = ServerJobParams(
        model=gguf_spec(small_gguf), drafters=("ngram-simple 2/4",), n_predict=16, n_ctx=512, calibration=2,
        validate=False,
    )  # fmt: skip
    refused = create_server_job(session, prompt_set, replace(params, long_prompts="refuse")).id
    session.commit()
    assert claim_server_job(sessions, "w") == refused
    assert execute_server_job(sessions, refused, **run) is None
    session.expire_all()
    failed = get_server_job(session, refused)
    assert failed.error_code == "prompt_too_long" and failed.generated is None
    tokens = int(re.search(rf"prompt {long_key} \(qa\) has (\d+) tokens", failed.error).group(1))
    assert tokens > 512 and failed.error.startswith(
        "1 of 4 prompts do not fit the servers' context of 512 with 16 new tokens"
    )
    left = create_server_job(session, prompt_set, params).id
    session.commit()
    assert claim_server_job(sessions, "w") == left
    analysis_id = execute_server_job(sessions, left, **run)
    assert analysis_id is not None
    record = session.get_one(ServerAnalysisRecord, analysis_id)
    assert [row["prompt_id"] for row in record.prompts] == [
        int(p.id) for p in prompt_set.prompts if str(p.id) != long_key
    ]
    assert record.left_out == {
        "settings": {},
        "prompts": [
            {
                "prompt_id": long_key,
                "task": "qa",
                "tokens": tokens,
                "why": f"{tokens} tokens and 16 new ones exceed the context of 512",
            }
        ],
    }
    assert server_analysis_json(session, record)["left_out"] == record.left_out
    from webui.cli.server_analysis import server_analysis_text

    assert f"Left out prompt {long_key} (qa): {tokens} tokens and 16 new ones exceed the context of 512" in (
        server_analysis_text(record).splitlines()
    )


@pytest.mark.slow
def test_a_job_that_dies_mid_validation_resumes_from_the_pass_it_did_not_finish(
    llama_server_binary, small_gguf, engine, session, tmp_path, monkeypatch
):
    """The calibration passes and the validation passes a failed attempt finished are kept on this machine: the
    resumed attempt generates nothing, runs no calibration pass again, and makes only the passes left."""
    sessions = make_session_factory(engine)
    prompt_set, _ = import_sample(session)
    params = _short_job(small_gguf, validate=True, validate_repeats=1)
    job_id = create_server_job(session, prompt_set, params).id
    session.commit()
    lines: list[str] = []
    real = server_passes.timed_complete
    calls = {"n": 0}

    def dies_after_the_first_validated_prompt(server, ids, n_predict):
        if any(line.startswith("validated 1/3") for line in lines):
            raise LlamaServerError(
                "llama-server at http://127.0.0.1:1 did not answer /completion: connection refused"
            )
        calls["n"] += 1
        return real(server, ids, n_predict)

    monkeypatch.setattr(server_passes, "timed_complete", dies_after_the_first_validated_prompt)
    run = dict(worker_id="w", cache_dir=tmp_path, llama_server=str(llama_server_binary), echo=lines.append)
    assert claim_server_job(sessions, "w") == job_id
    assert execute_server_job(sessions, job_id, **run) is None
    session.expire_all()
    job = get_server_job(session, job_id)
    assert (job.status, job.error_code) == ("failed", "llama_server_error")
    calibrated = [line for line in lines if line.startswith("calibrated ")]
    assert len(calibrated) == 3  # three calibration prompts (the most asked), measured once each
    stored = job.generated["passes"]
    # every finished pass is stored in order: the calibration passes, then the first validation pass
    assert len(stored) == len(calibrated) + 1 and list(stored)[-1].startswith("validation 1 ")
    assert all(len(p["measured"]) == 1 and len(p["plain"]["tokens"]) >= 1 for p in stored.values())
    assert calls["n"] == 3 * len(stored)  # plain, the setting's server, plain again per pass
    assert (job_view(job).kept, job_view(job).passes) == (6, len(stored))  # as the job's page shows them
    first_calibration = stored[next(iter(stored))]
    # resumed: nothing generated, no calibration pass run again, the two validation passes left made
    calls["n"] = 0
    lines.clear()
    monkeypatch.setattr(server_passes, "timed_complete", lambda server, ids, n_predict: (
        calls.__setitem__("n", calls["n"] + 1), real(server, ids, n_predict))[1])  # fmt: skip
    resume_server_job(session, job_id)
    session.commit()
    assert claim_server_job(sessions, "w") == job_id
    analysis_id = execute_server_job(sessions, job_id, **run)
    assert analysis_id is not None, lines
    assert "kept 6 plain generations of an earlier attempt" in lines
    assert f"kept {len(stored)} passes through the servers of an earlier attempt" in lines
    assert not any(line.startswith("generated ") for line in lines)
    again = [line for line in lines if line.startswith("calibrated ")]
    assert len(again) == len(calibrated) and all(" (kept)" in line for line in again)
    validated = [line for line in lines if line.startswith("validated ")]
    assert [" (kept)" in line for line in validated] == [True, False, False]
    assert calls["n"] == 3 * 2  # the two validation passes left, nothing else
    record = session.get_one(ServerAnalysisRecord, analysis_id)
    held_out = [p for p in record.prompts if not p["calibration"]]
    assert len(held_out) == 3 and all(len(p["settings"][0]["passes"]) == 1 for p in held_out)
    # the kept calibration pass is the earlier attempt's own run, timings and all
    key = next(iter(stored)).split()[-1]
    kept = next(p for p in record.prompts if str(p["prompt_id"]) == key)
    assert kept["calibration"] and kept["settings"][0]["passes"][0]["ms"] == pytest.approx(
        first_calibration["measured"][0]["timings"]["predicted_ms"]
    )
    assert get_server_job(session, job_id).generated["passes"].keys() >= stored.keys()


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--max-new-tokens", "1", "--max-new-tokens: must be a whole number from 2 to 4096, got '1'"),
        ("--max-new-tokens", "4097", "--max-new-tokens: must be a whole number from 2 to 4096, got '4097'"),
        ("--limit", "10000001", "--limit: must be a whole number from 1 to 10000000, got '10000001'"),
        ("--limit", "ten", "--limit: must be a whole number from 1 to 10000000, got 'ten'"),
    ],
)
def test_analyze_in_llama_server_takes_the_runs_limits_and_names_the_option(runner, option, value, message):
    """`specroute analyze --engine llama-server` checks the options it shares with a run against the run's
    limits (analyzer/run_params.py; a job needs two new tokens at least), naming the option the user typed."""
    from webui.cli import cli

    result = runner.invoke(cli, ["analyze", "--engine", "llama-server", "--prompts", "sample", option, value])
    assert result.exit_code == 2 and message in result.stderr, result.output


@pytest.mark.slow
@pytest.mark.parametrize("validate_all", [False, True])
def test_validation_takes_the_sample_its_budget_pays_for_or_every_held_out_prompt_when_asked(
    llama_server_binary, small_gguf, engine, session, tmp_path, validate_all
):
    """10 prompts, 2 calibrating: one pass over a held-out prompt (plain twice and the setting) costs more than
    the plain generation of several, so the budget (half of the whole plain generation) pays for fewer than the
    8 held out and validation takes the minimum, 4, chosen across tasks; ``validate_all`` takes all 8. Only the
    chosen prompts are run through the servers, and the record says how many of how many and why."""
    from analyzer.measuring.validation_plan import MIN_VALIDATED
    from webui.cli.server_analysis import server_analysis_text

    sessions = make_session_factory(engine)
    prompt_set, _ = import_sample(session)
    params = replace(
        _short_job(small_gguf, validate=True, validate_repeats=1),
        limit=10,
        calibration=2,
        validate_all=validate_all,
    )
    job_id = create_server_job(session, prompt_set, params).id
    session.commit()
    lines: list[str] = []
    assert claim_server_job(sessions, "w") == job_id
    analysis_id = execute_server_job(
        sessions,
        job_id,
        worker_id="w",
        cache_dir=tmp_path,
        llama_server=str(llama_server_binary),
        echo=lines.append,
    )
    assert analysis_id is not None
    session.expire_all()
    record = session.get_one(ServerAnalysisRecord, analysis_id)
    plan = record.validation_plan
    expected = 8 if validate_all else MIN_VALIDATED
    assert (plan["validated"], plan["held_out"], record.validation_repeats) == (expected, 8, 1)
    validated = [line for line in lines if line.startswith("validated ")]
    assert len(validated) == expected and validated[-1].startswith(f"validated {expected}/8 ")
    if validate_all:
        assert plan["why"].startswith("every held-out prompt (8)") and plan["why"].endswith(", no budget")
        assert plan["budget_s"] is None and plan["stopped"] in ("target", "passes")
    else:
        assert plan["why"].startswith(f"{MIN_VALIDATED} of 8 held-out prompts (chosen across tasks")
        # one pass over a prompt costs about three of its generations: the budget (half the generation of 10)
        # is spent by the minimum, unless run noise left every aggregate within the target by then
        assert plan["stopped"] in ("budget", "target") and plan["spent_s"] > 0
        assert (plan["stopped"] == "target") == (plan["half_width"] <= plan["target"])
        tasks = {p["task"] for p in record.prompts if not p["calibration"]}
        sampled = {p["task"] for p in record.prompts if not p["calibration"] and p["settings"][0]["passes"]}
        assert len(sampled) == min(MIN_VALIDATED, len(tasks))
    shown = server_analysis_text(record)
    assert f"validated {plan['why']}" in shown.splitlines()
    # two calibration prompts, the most asked: too few to leave one out, so the fit is checked in-sample
    assert record.calibration_why is not None and "after 2 prompts, the most asked" in record.calibration_why
    assert f"calibrated: {record.calibration_why}" in shown.splitlines()
