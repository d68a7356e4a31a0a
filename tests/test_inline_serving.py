"""webui/inline_serving.py: waitress answers the requests the app calls quick on its I/O thread and the others
on its worker threads, with the same answers in the same order, on kept-alive and pipelined connections; and
the router's API calls a route request quick only while its router is loaded and not due for the database."""

from __future__ import annotations

import socket
import threading

import pytest
import requests

from tests.waitress_thread import waitress_in_a_thread


def recording_app(seen: list[tuple[str, str, str]]):
    """A WSGI app that answers its method and path and records (method, path, thread name)."""

    def app(environ, start_response):
        seen.append((environ["REQUEST_METHOD"], environ["PATH_INFO"], threading.current_thread().name))
        environ["wsgi.input"].read()
        body = f"{environ['REQUEST_METHOD']} {environ['PATH_INFO']}".encode()
        start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
        return [body]

    return app


def quick(method: str, path: str) -> bool:
    return method == "POST" and path == "/quick"


def test_quick_requests_are_answered_on_the_io_thread_and_the_others_on_workers():
    seen: list[tuple[str, str, str]] = []
    with waitress_in_a_thread(recording_app(seen), quick=quick) as base, requests.Session() as http:
        asked = [("POST", "/quick"), ("GET", "/quick"), ("POST", "/slow"), ("POST", "/quick")] * 5
        for method, path in asked:
            answer = http.request(method, base + path, data=b'{"x": 1}' if method == "POST" else None)
            assert (answer.status_code, answer.text) == (200, f"{method} {path}")
    assert [(m, p) for m, p, _ in seen] == asked
    threads = {(m, p): {t for m2, p2, t in seen if (m2, p2) == (m, p)} for m, p in asked}
    assert threads[("POST", "/quick")] == {"waitress-io"}
    for other in (("GET", "/quick"), ("POST", "/slow")):
        assert threads[other] and all(
            t.startswith("waitress-") and t != "waitress-io" for t in threads[other]
        )


def test_without_quick_requests_every_request_goes_to_a_worker():
    seen: list[tuple[str, str, str]] = []
    with waitress_in_a_thread(recording_app(seen), quick=lambda method, path: False) as base:
        for _ in range(3):
            assert requests.post(base + "/quick", data=b"{}").text == "POST /quick"
    assert len(seen) == 3 and "waitress-io" not in {t for _, _, t in seen}


def _raw(method: str, path: str) -> bytes:
    body = b"{}" if method == "POST" else b""
    return (
        f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode("ascii") + body
    )


@pytest.mark.parametrize("rounds", [1, 3])
def test_pipelined_requests_are_answered_in_order(rounds):
    seen: list[tuple[str, str, str]] = []
    asked = [("POST", "/quick"), ("POST", "/quick"), ("POST", "/slow"), ("GET", "/quick"), ("POST", "/quick")]
    with waitress_in_a_thread(recording_app(seen), quick=quick) as base:
        port = int(base.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            for _ in range(rounds):
                sock.sendall(b"".join(_raw(m, p) for m, p in asked))
                last = f"{asked[-1][0]} {asked[-1][1]}".encode()
                got = b""
                while got.count(b"HTTP/1.1 200 OK") < len(asked) or not got.endswith(last):
                    chunk = sock.recv(65536)
                    assert chunk, got
                    got += chunk
                bodies = [part.split(b"\r\n\r\n", 1)[1] for part in got.split(b"HTTP/1.1 ")[1:]]
                assert [b.decode() for b in bodies] == [f"{m} {p}" for m, p in asked]
    assert [(m, p) for m, p, _ in seen] == asked * rounds
    assert seen[0][2] == "waitress-io"  # the first of a pipelined batch is read alone, answered by the reader


def test_a_route_is_quick_only_while_the_router_is_loaded_and_not_due(db_url, engine, published):
    from router.serve.api import answers_in_memory
    from webui.app import create_app

    for refresh, quick_after_a_route in ((60.0, True), (0.0, False)):
        app = create_app({"database_url": db_url, "router_refresh_s": refresh, "ui_worker": False})
        try:
            is_quick = answers_in_memory(app.extensions["specroute.router"])
            assert not is_quick("POST", "/v1/route")  # nothing loaded yet: the first goes to a worker
            answer = app.test_client().post("/v1/route", json={"prompt": "def f(x): return x"})
            assert answer.status_code == 200
            assert is_quick("POST", "/v1/route") is quick_after_a_route
            assert not is_quick("GET", "/v1/route") and not is_quick("POST", "/v1/feedback")
        finally:
            app.extensions["specroute.close"]()


def test_the_server_answers_routes_on_its_io_thread_as_a_worker_would(db_url, engine, published):
    from webui.app import create_app

    app = create_app({"database_url": db_url, "router_refresh_s": 60.0, "ui_worker": False})
    threads: list[str] = []
    inner = app.wsgi_app

    def recording(environ, start_response):
        threads.append(threading.current_thread().name)
        return inner(environ, start_response)

    setattr(app, "wsgi_app", recording)  # as router/serve/api.py sets its middleware
    try:
        with waitress_in_a_thread(app, as_served=True) as base:
            with requests.Session() as http:
                answers = [
                    http.post(base + "/v1/route", json={"prompt": "def f(x): return x"}) for _ in range(4)
                ]
                bad = http.post(
                    base + "/v1/route", data=b'{"prompt": 3}', headers={"Content-Type": "application/json"}
                )
        assert [a.status_code for a in answers] == [200] * 4
        assert len({a.json()["route_id"] for a in answers}) == 4
        assert {a.json()["task_type"] for a in answers} == {answers[0].json()["task_type"]}
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_request"
        assert threads[0] != "waitress-io"  # the router loads on a worker
        assert threads[1:] == ["waitress-io"] * 4
        assert answers[1].headers["X-Content-Type-Options"] == "nosniff"
    finally:
        app.extensions["specroute.close"]()
