"""Background execution of queued analysis runs, spread over any number of workers.

A run's work is planned as chunks (:mod:`analyzer.analysis.chunks`: the cost profile, slices of its prompts,
the validation); a worker (the server's thread, or a ``specroute worker`` process on any machine)
claims one chunk at a time from any queued or running run (``FOR UPDATE SKIP LOCKED`` on
PostgreSQL, the write lock on SQLite), executes it, and claims the next. A chunk left by a worker
that died (no heartbeat for ``stale_after_s``, the setting) is claimed again, so a server restart or
a killed worker never loses a run, and the run finishes exactly once, after its last chunk.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from pathlib import Path
from typing import Callable

from sqlalchemy.orm import Session, sessionmaker

from analyzer.analysis.chunks import claim_chunk
from analyzer.settings import STALE_AFTER_S

log = logging.getLogger(__name__)


def run_next_chunk(
    sessions: sessionmaker[Session],
    *,
    worker_id: str,
    cache_dir: Path,
    allow_network: bool = False,
    stale_after_s: float = STALE_AFTER_S,
    kept: dict | None = None,
) -> int | None:
    """Claim and execute one chunk of any run; returns its run's id (None when nothing could be
    claimed). ``kept`` keeps the loaded pair between calls. A failing chunk fails its run (recorded
    by ``execute_chunk``) and does not stop the worker."""
    chunk = claim_chunk(sessions, worker_id, stale_after_s=stale_after_s)
    if chunk is None:
        return None
    # torch loads with the first run, not with the server
    from analyzer.analysis.runs import LoadedModelCache, execute_chunk

    kept = {} if kept is None else kept
    if "model_cache" not in kept:
        kept["model_cache"] = LoadedModelCache(cache_dir, allow_network)
    try:
        execute_chunk(sessions, chunk, worker_id=worker_id, model_cache=kept["model_cache"])
    except Exception:
        log.exception("analysis run %s failed (chunk %s)", chunk.run_id, chunk.position)
    return chunk.run_id


class Worker:
    """A daemon thread that executes queued runs until ``stop()``; polls every ``poll_s`` seconds;
    ``on_run`` is told each run's id when the run has stopped."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        *,
        cache_dir: Path,
        allow_network: bool = False,
        poll_s: float = 1.0,
        stale_after_s: float = STALE_AFTER_S,
        name: str = "thread",
        on_run: Callable[[int], None] | None = None,
        also: Callable[[str], bool] | None = None,
    ):
        self.sessions, self.cache_dir, self.allow_network = sessions, cache_dir, allow_network
        self.on_run, self.also = on_run, also
        self.poll_s, self.stale_after_s = poll_s, stale_after_s
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}:{name}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"specroute-worker-{name}", daemon=True)

    def start(self) -> "Worker":
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout=timeout_s)

    def _loop(self) -> None:
        work(
            self.sessions,
            cache_dir=self.cache_dir,
            worker_id=self.worker_id,
            allow_network=self.allow_network,
            poll_s=self.poll_s,
            stale_after_s=self.stale_after_s,
            stop=self._stop,
            on_run=self.on_run,
            also=self.also,
        )


def work(
    sessions: sessionmaker[Session],
    *,
    cache_dir: Path,
    worker_id: str,
    allow_network: bool = False,
    poll_s: float = 1.0,
    stale_after_s: float = STALE_AFTER_S,
    stop: threading.Event | None = None,
    once: bool = False,
    on_run: Callable[[int], None] | None = None,
    also: Callable[[str], bool] | None = None,
) -> None:
    """The worker loop of the server's thread and of ``specroute worker``: claim and execute the next chunk of
    any run (``on_run`` is told a run's id when it has stopped), else the next analysis in llama-server
    (executed whole), else ``also(worker_id)``, the caller's other work (the web UI's jobs: True when it did
    some); wait ``poll_s`` when there was none; until ``stop`` is set, or, with ``once``, until the first run
    has stopped, other work was done, or nothing is left. The loaded pair is kept between chunks; a database
    hiccup is logged and does not end the loop."""
    from analyzer.settings import load_settings

    stop = stop or threading.Event()
    llama_server = load_settings().llama_server
    kept: dict = {}
    first: int | None = None
    while not stop.is_set():
        try:
            ran, status, served = _next_work(
                sessions, worker_id, cache_dir, allow_network, stale_after_s, kept, llama_server, also
            )
        except Exception:
            log.exception("worker loop")
            ran = status = served = None
        if served is not None:
            if once:
                return
            continue
        first = first if first is not None else ran
        if ran is not None and status not in ("queued", "running") and on_run is not None:
            on_run(ran)
        if once and (ran is None or (ran == first and status not in ("queued", "running"))):
            return
        if ran is None:
            stop.wait(poll_s)


def _next_work(
    sessions: sessionmaker[Session],
    worker_id: str,
    cache_dir: Path,
    allow_network: bool,
    stale_after_s: float,
    kept: dict,
    llama_server: str,
    also: Callable[[str], bool] | None,
) -> tuple[int | None, str | None, int | None]:
    """One turn of :func:`work`: (the run whose chunk was executed, its status after it; the analysis job in
    llama-server executed, or 0 for the caller's other work done, or None where there was neither)."""
    from analyzer.analysis.run_records import run_status
    from analyzer.analysis.server_jobs import run_next_server_job

    ran = run_next_chunk(
        sessions,
        worker_id=worker_id,
        cache_dir=cache_dir,
        allow_network=allow_network,
        stale_after_s=stale_after_s,
        kept=kept,
    )
    if ran is not None:
        return ran, run_status(sessions, ran), None
    served = run_next_server_job(
        sessions,
        worker_id=worker_id,
        cache_dir=cache_dir,
        llama_server=llama_server,
        stale_after_s=stale_after_s,
    )
    if not served and also is not None and also(worker_id):
        served = 0  # other work done: look for more at once
    return None, None, served
