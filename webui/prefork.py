"""The multi-process server behind ``specroute serve --workers N`` (N > 1): gunicorn's arbiter forks N
worker processes on one listening socket, each answering on gunicorn's threaded worker (``gthread``).
Each process builds its own app after the fork, so no database connection or loaded model crosses a
fork. The arbiter restarts a worker that dies; SIGTERM stops every process gracefully (requests in
flight are answered), Ctrl-C at once. One worker at a time runs the analysis worker thread: the first
one forked, and when it dies, the one forked next. A chunked request body reaches the app with its
length, as on waitress (:class:`ChunkedBodyLimit`). gunicorn runs on POSIX only; one process
(``--workers 1``) is served by waitress, on every OS.
"""

from __future__ import annotations

import signal
import tempfile
from collections.abc import Callable

from flask import Flask
from gunicorn.app.base import BaseApplication
from gunicorn.errors import AppImportError

from analyzer.settings import SettingsError

SPOOL_BYTES = 512 * 1024  # a buffered chunked body larger than this goes to a temporary file, as in waitress

# waitress's idle-connection timeout (its channel_timeout), so kept-alive connections live as long
# with --workers N as with one process; gunicorn's own default (2 s) suits a server facing browsers
# directly, not clients and proxies that pool connections.
KEEPALIVE_S = 120


class PreforkServer(BaseApplication):
    """gunicorn configured in code (it reads no configuration file and no GUNICORN_CMD_ARGS).
    ``listener_fd``: a bound, listening socket's file descriptor, handed over (gunicorn closes it);
    ``make_app(runs_analysis)``: one worker's app, called in each worker after its fork
    (``runs_analysis`` False: no analysis worker thread in that process). ``run()`` returns only
    through SystemExit, in the arbiter with its exit status (0 after SIGTERM or Ctrl-C; 4 when a
    worker could not create its app, whose message is printed) and in each worker when it ends."""

    def __init__(self, listener_fd: int, make_app: Callable[[bool], Flask], *, workers: int, threads: int):
        self.make_app = make_app
        self.options = {
            "bind": [f"fd://{listener_fd}"],
            "workers": workers,
            "worker_class": "gthread",
            "threads": threads,
            "keepalive": KEEPALIVE_S,
            "limit_request_line": 8190,  # gunicorn's largest (its default, 4,094, is below waitress's limits)
            "forwarded_allow_ips": "",  # trust no X-Forwarded-* header, as waitress does by default
            "accesslog": None,
            "errorlog": "-",
            "loglevel": "warning",
            "proc_name": "specroute",
            "pre_fork": self._pre_fork,
            "child_exit": self._child_exit,
            "worker_exit": self._worker_exit,
        }
        self.runs_analysis = False  # set in the arbiter before each fork; the forked worker reads its copy
        self.flask_app: Flask | None = None  # in a worker, once loaded
        super().__init__(prog="specroute serve")

    def load_config(self) -> None:
        for name, value in self.options.items():
            self.cfg.set(name, value)
        if (
            "control_socket_disable" in self.cfg.settings
        ):  # gunicorn >= 25.1 opens a control socket by default
            self.cfg.set("control_socket_disable", True)  # none in the user's runtime folder

    def load(self) -> ChunkedBodyLimit:
        try:
            self.flask_app = self.make_app(self.runs_analysis)
        except SettingsError as exc:
            raise AppImportError(str(exc)) from None  # gunicorn prints the message and stops every process
        return ChunkedBodyLimit(self.flask_app, self.flask_app.config["MAX_CONTENT_LENGTH"])

    def _pre_fork(self, arbiter, worker) -> None:
        # In the arbiter. Its WORKERS are the live workers: a dead one is reaped before its
        # replacement is forked, so the replacement of the analysis thread's process takes it over.
        self.runs_analysis = not any(getattr(w, "runs_analysis", False) for w in arbiter.WORKERS.values())
        worker.runs_analysis = self.runs_analysis

    def _child_exit(self, arbiter, worker) -> None:
        # In the arbiter, after a worker was reaped. When no replacement will be forked because the
        # other workers already make up the count (a reload on SIGHUP or SIGTTOU retired the process
        # with the analysis thread), the youngest stops gracefully so that its replacement takes it.
        if (
            getattr(worker, "runs_analysis", False)
            and arbiter.WORKERS
            and len(arbiter.WORKERS) >= arbiter.num_workers
        ):
            youngest = max(arbiter.WORKERS.values(), key=lambda w: w.age)
            arbiter.kill_worker(youngest.pid, signal.SIGTERM)

    def _worker_exit(self, arbiter, worker) -> None:
        # In the worker as it ends: the decision log flushed, the analysis thread stopped, connections closed.
        if self.flask_app is not None:
            self.flask_app.extensions["specroute.close"]()


class ChunkedBodyLimit:
    """WSGI middleware: a chunked request body (no Content-Length) is read first, at most
    ``limit_bytes`` + 1 bytes of it, and the app gets it with its length, as waitress gives it. The
    app's size limits (MAX_CONTENT_LENGTH, the API's own, the /v1/route fast path) then answer 413
    for a body over them; on gunicorn's stream they would cut the body at the limit instead (a
    truncated JSON document, a 400). A body over ``limit_bytes`` is not read further: the app sees
    ``limit_bytes`` + 1 bytes and answers 413 (gunicorn then closes the connection rather than read
    much of the rest)."""

    def __init__(self, app, limit_bytes: int):
        self.app, self.limit_bytes = app, limit_bytes

    def __call__(self, environ, start_response):
        if "chunked" not in environ.get("HTTP_TRANSFER_ENCODING", "").lower():
            return self.app(environ, start_response)
        body, size = tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES), 0
        while size <= self.limit_bytes:
            data = environ["wsgi.input"].read(min(64 * 1024, self.limit_bytes + 1 - size))
            if not data:
                break
            body.write(data)
            size += len(data)
        body.seek(0)
        environ = {**environ, "wsgi.input": body, "CONTENT_LENGTH": str(size)}
        del environ["HTTP_TRANSFER_ENCODING"]
        return self.app(environ, start_response)
