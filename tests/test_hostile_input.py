"""Hostile input on every surface that takes a body: never a 500 and never an unhandled exception.

Where tests/test_fuzz.py generates random shapes, this file sends the inputs known to break parsers and
the code behind them, on purpose and on every field: lone UTF-16 surrogates (``\\ud800``, as a JSON
escape or as bytes that are not UTF-8), NUL, bidirectional-override marks, a byte-order mark, 10 MB
strings; nesting 65 to 100,000 levels deep, arrays of 100,000 items, duplicate keys, numbers that
overflow or have 5,000 digits. Every JSON answer is 2xx or a 4xx in the one error shape with a code;
every page and import answers 2xx, 3xx or 4xx and writes nothing when it refuses. Each test writes its
count to ``test-artifacts/hostile/`` (or ``$SPECROUTE_TEST_ARTIFACTS/hostile/``), which RESULTS.md quotes.
"""

from __future__ import annotations

import functools
import io
import json
import os
import re
from pathlib import Path

import pytest
from sqlalchemy import func, select

from analyzer.json_input import JsonInputError, loads_untrusted
from analyzer.orm import AnalysisRun, CostProfile, Prompt, PromptSet
from router.orm import ClassifierVersion, FeedbackEvent, PolicySet, RouteDecision
from tests.factories import routing_test_app
from webui.cli import cli

ARTIFACTS = Path(
    os.environ.get("SPECROUTE_TEST_ARTIFACTS", Path(__file__).resolve().parent.parent / "test-artifacts")
)
HUGE = 10_000_000

# strings as a Python str; a JSON body carries each as json.dumps writes it (lone surrogates as \u escapes)
HOSTILE_STRINGS = {
    "lone high surrogate": "\ud800 hi",
    "lone low surrogate": "a\udfffb",
    "reversed surrogate pair": "\udc00\ud800",
    "NUL": "a\x00b",
    "only NUL": "\x00",
    "RTL override": "\u202eedoc\u202c fix this",
    "BOM": "\ufeffwrite a poem",
    "zero-width joiners": "\u200d" * 50,
    "combining marks": "e" + "\u0301" * 500,
    "astral": "\U0001f600" * 100,
    "control characters": "".join(map(chr, range(1, 32))),
    "empty": "",
    "blank": " \t\n",
    "10 MB": "x" * HUGE,
    "10 MB of astral": "\U0001f600" * (HUGE // 4),
}
# bodies that are not JSON text a parser takes as it is
RAW_BODIES = {
    "nested 65": b"[" * 65 + b"]" * 65,
    "nested 1,000": b"[" * 1000 + b"]" * 1000,
    "nested 1,000 objects": b'{"a":' * 1000 + b"1" + b"}" * 1000,
    "nested 100,000": b"[" * 100_000 + b"]" * 100_000,
    "unclosed 100,000": b"[" * 100_000,
    "duplicate keys": b'{"prompt": "a", "prompt": "b"}',
    "NaN": b'{"prompt": "a", "temperature": NaN}',
    "Infinity": b'{"prompt": "a", "max_new_tokens": Infinity}',
    "overflowing float": b'{"prompt": "a", "temperature": 1e400}',
    "5,000 digits": b'{"prompt": "a", "max_new_tokens": ' + b"9" * 5000 + b"}",
    "29 digits": b'{"prompt": "a", "max_new_tokens": ' + b"9" * 29 + b"}",
    "surrogate bytes": b'{"prompt": "\xed\xa0\x80"}',
    "invalid UTF-8": b'{"prompt": "\xff\xfe"}',
    "UTF-16 body": json.dumps({"prompt": "hi"}).encode("utf-16"),
    "NUL byte": b'{"prompt": "a"}\x00',
    "huge array": json.dumps({"prompt": list(range(100_000))}).encode(),
    "huge object": json.dumps({"prompt": "a", **{f"k{i}": i for i in range(50_000)}}).encode(),
    "10 MB of spaces": b" " * HUGE + b'{"prompt": "a"}',
}


def _route_bodies() -> dict[str, bytes]:
    bodies = dict(RAW_BODIES)
    for name, text in HOSTILE_STRINGS.items():
        bodies[f"prompt {name}"] = json.dumps({"prompt": text}).encode()
        bodies[f"content {name}"] = json.dumps({"messages": [{"role": "user", "content": text}]}).encode()
        bodies[f"role {name}"] = json.dumps({"messages": [{"role": text, "content": "hi"}]}).encode()
        bodies[f"key {name}"] = json.dumps({"prompt": "hi", text: 1}).encode()
    bodies["messages 100,000"] = json.dumps(
        {"messages": [{"role": "user", "content": "a"}] * 100_000}
    ).encode()
    return bodies


def _batch_bodies() -> dict[str, bytes]:
    bodies = {
        f"item {name}": b'{"requests": [' + body + b"]}"
        for name, body in _route_bodies().items()
        if len(body) < HUGE  # a 10 MB item is the same case as a 10 MB body
    }
    bodies.update(RAW_BODIES)
    bodies["100,000 requests"] = json.dumps({"requests": [{"prompt": "a"}] * 100_000}).encode()
    return bodies


def _feedback_bodies() -> dict[str, bytes]:
    bodies = dict(RAW_BODIES)
    base = {"task_type": "code", "rounds": 4, "drafted": 8, "accepted": 6, "gamma": 2}
    for name, text in HOSTILE_STRINGS.items():
        for field in ("route_id", "task_type", "engine"):
            bodies[f"{field} {name}"] = json.dumps({**base, field: text}).encode()
        bodies[f"key {name}"] = json.dumps({**base, text: 1}).encode()
        bodies[f"timings key {name}"] = json.dumps({"task_type": "code", "timings": {text: 3}}).encode()
    for field in ("rounds", "drafted", "accepted", "gamma"):
        for value in (9 * 10**28, -1, 1e300, 0.5, True, "4"):
            bodies[f"{field} {value!r}"] = json.dumps({**base, field: value}).encode()
    return bodies


@pytest.fixture(scope="module")
def surfaces(tmp_path_factory):
    app, client, sessions, token, engine, url = routing_test_app(tmp_path_factory.mktemp("hostile"))
    yield client, sessions, app, token, url
    app.extensions["specroute.close"]()
    engine.dispose()


def _counts(sessions, app) -> tuple[int, ...]:
    app.extensions["specroute.router"].decision_log.flush()
    models = (FeedbackEvent, RouteDecision, PromptSet, Prompt, AnalysisRun, ClassifierVersion, PolicySet)
    with sessions() as session:
        counts = [session.scalar(select(func.count()).select_from(model)) for model in models]
        counts.append(session.scalar(select(func.count()).select_from(CostProfile)))
        return tuple(counts)


def _record(surface: str, tried: int, failures: list) -> None:
    folder = ARTIFACTS / "hostile"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{surface.strip('/').replace('/', '_') or 'root'}.txt").write_text(
        f"{surface}: {tried} inputs, {len(failures)} server errors\n"
    )
    assert not failures, failures[:10]


def _api_problem(response) -> str | None:
    """What is wrong with an API answer: None for a 2xx, or a 4xx in the one error shape with a code."""
    if response.status_code >= 500 or response.status_code < 200:
        return f"status {response.status_code}: {response.get_data()[:200]!r}"
    if response.status_code >= 400:
        data = response.get_json(silent=True)
        if not isinstance(data, dict) or set(data) != {"error"}:
            return f"{response.status_code} without the error shape: {response.get_data()[:200]!r}"
        error = data["error"]
        if set(error) != {"code", "message", "details"} or not error["code"] or not error["message"]:
            return f"{response.status_code} with a bad error object: {error!r}"[:300]
    return None


@pytest.mark.parametrize(
    "path,bodies",
    [("/v1/route", _route_bodies), ("/v1/route/batch", _batch_bodies), ("/v1/feedback", _feedback_bodies)],
)
def test_every_json_endpoint_answers_hostile_bodies_with_2xx_or_a_4xx_error(surfaces, path, bodies):
    client, sessions, app, *_ = surfaces
    cases = bodies()
    failures = []
    for name, body in cases.items():
        before = _counts(sessions, app)
        response = client.post(path, data=body, content_type="application/json")
        problem = _api_problem(response)
        if problem:
            failures.append((name, problem))
        elif response.status_code >= 400 and _counts(sessions, app)[:1] != before[:1]:
            failures.append((name, "a refused feedback was stored"))
    _record(path, len(cases), failures)
    assert len(cases) >= 70


def test_the_crashes_of_the_report_are_400s_that_say_where(surfaces):
    client, *_ = surfaces
    answer = client.post(
        "/v1/route", data=json.dumps({"prompt": "\ud800 hi"}), content_type="application/json"
    )
    error = answer.get_json()["error"]
    assert answer.status_code == 400 and error["code"] == "invalid_json"
    assert error["details"]["pointer"] == "/prompt" and "\\ud800" in error["message"]
    deep = client.post("/v1/feedback", data=b"[" * 1000 + b"]" * 1000, content_type="application/json")
    assert deep.status_code == 400 and "deeper than 64 levels" in deep.get_json()["error"]["message"]
    inner = json.dumps({"requests": [{"messages": [{"role": "user", "content": "\udfff"}]}]})
    answer = client.post("/v1/route/batch", data=inner, content_type="application/json")
    assert answer.get_json()["error"]["details"]["pointer"] == "/requests/0/messages/0/content"
    # a body 64 levels deep is still parsed: it is refused for what it is, not for its depth
    nested = client.post("/v1/route", data=b"[" * 64 + b"]" * 64, content_type="application/json")
    assert nested.status_code == 400 and nested.get_json()["error"]["code"] == "invalid_request"
    # valid text is routed, whatever it holds
    for text in ("\u202eedoc\u202c fix this", "a\x00b", "\U0001f600" * 100):
        assert client.post("/v1/route", json={"prompt": text}).status_code == 200


@pytest.mark.parametrize(
    "text,expected",
    [
        ('{"a": 1, "a": 2}', 'gives the key "a" twice'),
        ('{"a": NaN}', "NaN, which is not finite"),
        ('{"a": -Infinity}', "-Infinity, which is not finite"),
        ('{"a": [1e400]}', "1e400, which is not finite"),
        ('{"a": "\\ud800"}', "surrogate (\\ud800) in the string at /a"),
        ('{"\\udc00": 1}', "surrogate in the key at /\\udc00"),
        ("[" * 65 + "]" * 65, "deeper than 64 levels (at /0/0"),
        ("[" * 5000 + "]" * 5000, "deeper than 64 levels"),
        ('{"a": 1', "is not valid JSON: Expecting ',' delimiter at line 1, column 8"),
    ],
)
def test_loads_untrusted_refuses_with_the_place(text, expected):
    with pytest.raises(JsonInputError) as caught:
        loads_untrusted(text, subject="the file")
    assert caught.value.message.startswith("the file ") and expected in caught.value.message
    assert caught.value.status == 400


def test_loads_untrusted_keeps_what_json_takes():
    text = '{"a": [1, 2.5, "\\ud83d\\ude00", null, true, {"b": "x\\u0000y"}], "c": 1e300}'
    assert loads_untrusted(text) == json.loads(text)
    assert loads_untrusted("[" * 64 + "]" * 64) == json.loads("[" * 64 + "]" * 64)


def _form_body(token: str, fields: dict[str, bytes]) -> bytes:
    """An urlencoded form whose values are raw bytes (surrogates as the bytes no encoder writes)."""
    pairs = {"csrf_token": token.encode(), **fields}
    return "&".join(f"{k}={_quoted(v)}" for k, v in pairs.items()).encode()


@functools.lru_cache(maxsize=64)
def _quoted(value: bytes) -> str:
    """``value`` percent-encoded, once per value: the huge ones took most of the forms test's time, encoded
    anew for every field of every form."""
    from urllib.parse import quote_from_bytes

    return quote_from_bytes(value)


FORM_VALUES = {name: text.encode("utf-8", "surrogatepass") for name, text in HOSTILE_STRINGS.items()} | {
    "invalid UTF-8": b"\xff\xfe\xfd",
    "29 digits": b"9" * 29,
    "negative": b"-1",
    "nan": b"nan",
    "inf": b"inf",
}
FORMS = {
    "/prompts/sample/labels": ("label", "prompt_id"),
    "/prompts/sample/accept": ("prompt_ids",),
    "/prompts/sample/delete": ("confirm",),
    "/runs": ("prompt_set", "target", "draft", "max_new_tokens", "gamma_max", "temperature", "validate"),
    "/runs/1/cancel": ("next",),
    "/runs/1/resume": ("next",),
    "/runs/1/reprice": ("profile_id",),
    "/costs": ("run_id",),
    "/classifier/train": ("prompt_sets", "source", "notes"),
    "/classifier/1/activate": ("next",),
    "/playground": ("prompt", "max_new_tokens", "batch_size"),
    "/policies/publish": ("analysis", "run_id", "notes"),
    "/policies/1/activate": ("next",),
    "/login": ("token", "next"),
}


@pytest.mark.slow
@pytest.mark.parallel
def test_every_form_answers_hostile_values_without_a_server_error(tmp_path):
    # an app of its own: a hostile value the training form accepts starts training on the bundled corpus in
    # the background (half a minute of cross-validation), which closing the app stops at its next fold instead of
    # leaving it to compete with the module's later tests
    app, client, sessions, token, engine, _ = routing_test_app(tmp_path)
    try:
        _post_every_form(client, sessions, app, token)
    finally:
        app.extensions["specroute.close"]()
        engine.dispose()


def _post_every_form(client, sessions, app, token) -> None:
    failures, tried = [], 0
    for path, fields in FORMS.items():
        for field in fields:
            for name, value in FORM_VALUES.items():
                tried += 1
                before = _counts(sessions, app)
                response = client.post(
                    path,
                    data=_form_body(token, {field: value}),
                    content_type="application/x-www-form-urlencoded",
                )
                cookie = max(map(len, response.headers.getlist("Set-Cookie")), default=0)
                if response.status_code >= 500:
                    failures.append((path, field, name, response.status_code))
                elif response.status_code >= 400 and _counts(sessions, app) != before:
                    failures.append((path, field, name, "refused but wrote"))
                elif cookie > 4093:  # a browser drops the cookie, and the message with it
                    failures.append((path, field, name, f"a {cookie}-byte cookie"))
    _record("forms", tried, failures)
    assert tried >= 500


def _prompt_files() -> dict[str, tuple[str, bytes]]:
    files = {}
    for name, text in HOSTILE_STRINGS.items():
        if len(text) >= HUGE:
            continue  # the upload limit answers these (a case of its own below)
        escaped = json.dumps({"prompt": text, "task": text}).encode()
        files[f"jsonl {name}"] = ("p.jsonl", escaped + b"\n")
        files[f"txt {name}"] = ("p.txt", text.encode("utf-8", "surrogatepass") + b"\n")
        files[f"csv {name}"] = ("p.csv", b"prompt,task\n" + text.encode("utf-8", "surrogatepass") + b",qa\n")
    for name, body in RAW_BODIES.items():
        files[f"jsonl {name}"] = ("p.jsonl", body + b"\n")
    files["10 MB upload"] = ("p.txt", b"x" * (HUGE + 1))
    return files


def _cost_files() -> dict[str, tuple[str, bytes]]:
    good = {
        "engine": "vllm",
        "device": "NVIDIA H100",
        "dtype": "bfloat16",
        "batch_size": 1,
        "target": "hf:a/b",
        "draft": "ngram:max_ngram=3",
        "target_step_ms": [10.0, 10.5, 11.0],
        "draft_step_ms": 0.2,
    }
    files = {}
    for name, text in HOSTILE_STRINGS.items():
        if len(text) >= HUGE:
            continue
        for field in ("engine", "device", "dtype", "target", "engine_version"):
            files[f"json {field} {name}"] = ("c.json", json.dumps({**good, field: text}).encode())
        files[f"csv device {name}"] = (
            "c.csv",
            b"engine,device,dtype,batch_size,target,draft,t1_ms,t2_ms,draft_step_ms\nvllm,"
            + text.replace(",", ";").replace("\n", " ").encode("utf-8", "surrogatepass")
            + b",bfloat16,1,hf:a/b,ngram:max_ngram=3,10,10.5,0.2\n",
        )
    for name, body in RAW_BODIES.items():
        files[f"json {name}"] = ("c.json", body)
    files["json steps of 100,000"] = (
        "c.json",
        json.dumps({**good, "target_step_ms": [10.0] * 100_000}).encode(),
    )
    return files


@pytest.mark.slow
@pytest.mark.parallel
def test_prompt_and_cost_uploads_answer_hostile_files_without_a_server_error(surfaces):
    client, sessions, app, token, _ = surfaces
    failures, tried = [], 0
    uploads = [
        ("/prompts", "file", {"name": "hostile"}, _prompt_files()),
        ("/costs", "file", {"new_pair": "1"}, _cost_files()),
    ]
    for path, field, extra, files in uploads:
        for name, (filename, content) in files.items():
            tried += 1
            before = _counts(sessions, app)
            response = client.post(
                path, data={"csrf_token": token, **extra, field: (io.BytesIO(content), filename)}
            )
            if response.status_code >= 500:
                failures.append((path, name, response.status_code))
            elif response.status_code >= 400 and _counts(sessions, app) != before:
                failures.append((path, name, "refused but wrote"))
            if response.status_code < 400 and path == "/prompts":
                client.post("/prompts/hostile/delete", data={"csrf_token": token, "confirm": "hostile"})
    _record("uploads", tried, failures)
    assert tried >= 100


@pytest.mark.slow
@pytest.mark.parallel
def test_the_command_line_imports_answer_hostile_files_with_a_message(surfaces, tmp_path):
    from click.testing import CliRunner

    *_, url = surfaces
    runner = CliRunner(env={"SPECROUTE_DATABASE_URL": url})
    failures, tried = [], 0
    for command, files in (("prompts", _prompt_files()), ("costs", _cost_files())):
        for name, (filename, content) in files.items():
            if len(content) > HUGE:
                continue
            tried += 1
            path = tmp_path / filename
            path.write_bytes(content)
            args = [command, "import", str(path)]
            args += ["--name", f"hostile{tried}"] if command == "prompts" else ["--new-pair"]
            result = runner.invoke(cli, args)
            if result.exception is not None and not isinstance(result.exception, SystemExit):
                failures.append((command, name, repr(result.exception)[:200]))
            elif result.exit_code not in (0, 1):
                failures.append((command, name, result.exit_code, result.output[-200:]))
            elif (problem := _import_message_problem(command, filename, result)) is not None:
                failures.append((command, name, problem, result.output[-200:]))
    _record("cli imports", tried, failures)
    assert tried >= 100


def _import_message_problem(command: str, filename: str, result) -> str | None:
    """What is wrong with the words an import printed: None when a stored file says what it stored and a
    refused one says why on stderr (the file's summary with each problem on its own line below, or one
    ``Error: ...`` line), never with a traceback."""
    if "Traceback" in result.output:
        return "a traceback"
    if result.exit_code == 0:
        stored = (
            r"imported [1-9]\d* prompts as 'hostile\d+'"
            if command == "prompts"
            else r"stored [1-9]\d* cost profile"
        )
        return None if re.search(stored, result.stdout) else "stored, but the output does not say what"
    first, *rest = result.stderr.splitlines() or [""]
    noun = "errors?" if command == "prompts" else "problems?"
    if re.fullmatch(rf"{re.escape(filename)}: (\d+) {noun}; nothing was imported", first):
        listed = [line for line in rest if line.startswith("  ")]
        return None if listed and all(line.strip() for line in listed) else "refused, no problem listed"
    if re.fullmatch(r"Error: \S.*", first) and not rest:
        return None
    return f"refused without a message: {first[:80]!r}"
