"""The multi-process server behind ``specroute serve --workers N`` (N > 1): gunicorn's arbiter forks N
worker processes on one listening socket, and each process is served by waitress as one process is
(:class:`WaitressWorker`: the same threads, limits and route decisions answered on the I/O thread that read
them). Each process builds its own app after the fork, so no database connection or loaded model crosses a
fork. The arbiter restarts a worker that dies; SIGTERM stops every process gracefully (requests in flight
are answered), Ctrl-C at once. One worker at a time runs the analysis worker thread: the first one forked,
and when it dies, the one forked next. gunicorn runs on POSIX only; one process (``--workers 1``) is served
by waitress alone, on every OS.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import threading
import time
from collections.abc import Callable

from flask import Flask
from gunicorn.app.base import BaseApplication
from gunicorn.errors import AppImportError
from gunicorn.workers.base import Worker

from analyzer.settings import SettingsError
from webui.inline_serving import serve_with_waitress

HEARTBEAT_S = 1.0  # how often a worker tells the arbiter it lives (its timeout is gunicorn's, 30 s)


class WaitressWorker(Worker):
    """One worker process of :class:`PreforkServer`, served by waitress (:func:`serve_with_waitress`) on its own
    I/O thread, while this process's main thread beats the arbiter's heartbeat and handles its signals.
    On SIGTERM (``alive`` false) the listening socket is closed, the requests already read are answered (at
    most gunicorn's ``graceful_timeout``, 30 s) and the process ends; when the arbiter is gone, at once."""

    def run(self) -> None:
        app = self.app.flask_app  # PreforkServer.load made it, in this process
        server = serve_with_waitress(app, [s.sock for s in self.sockets], self.cfg.threads)
        loop = threading.Thread(target=server.run, name="waitress-io", daemon=True)
        loop.start()
        while self.alive and loop.is_alive():
            self.notify()
            if self.ppid != os.getppid():  # the arbiter died: nobody is left to stop this process
                self.log.info("Parent changed, shutting down: %s", self)
                return
            ready, _, _ = select.select([self.PIPE[0]], [], [], HEARTBEAT_S)  # a signal writes to the pipe
            if ready:
                with contextlib.suppress(OSError):
                    os.read(self.PIPE[0], 4096)
        closed = threading.Event()
        server.trigger.pull_trigger(lambda: _stop_accepting(server, closed))
        deadline = time.monotonic() + self.cfg.graceful_timeout
        closed.wait(timeout=self.cfg.graceful_timeout)
        while loop.is_alive() and _busy(server) and time.monotonic() < deadline:
            self.notify()
            time.sleep(0.05)
        server.task_dispatcher.shutdown(timeout=max(0.0, deadline - time.monotonic()))


def _stop_accepting(server, closed: threading.Event) -> None:
    """On waitress' I/O thread: close the listening socket (the listener only: the server's own ``close``
    stops the trigger too); the open connections stay in its loop. ``closed`` is set once done."""
    import waitress.wasyncore

    server.accepting = False
    waitress.wasyncore.dispatcher.close(server)
    closed.set()


def _busy(server) -> bool:
    """Whether a request read by ``server`` is not answered yet (being served, queued, or its answer unsent)."""
    dispatcher = server.task_dispatcher
    if dispatcher.active_count or dispatcher.queue:
        return True
    return any(
        channel.requests or channel.total_outbufs_len for channel in list(server.active_channels.values())
    )


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
            "worker_class": WaitressWorker,
            "threads": threads,
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

    def load(self) -> Flask:
        try:
            self.flask_app = self.make_app(self.runs_analysis)
        except SettingsError as exc:
            raise AppImportError(str(exc)) from None  # gunicorn prints the message and stops every process
        return self.flask_app

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
