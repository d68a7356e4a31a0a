"""A pytest plugin (tests/conftest.py takes its hook; ``-p tests.stop_on_sigterm`` loads it alone): a test run
stopped with SIGTERM (or SIGHUP) unwinds like one stopped with Ctrl-C, so every fixture's teardown runs: the
throw-away PostgreSQL server stops, llama-server processes stop, temporary folders go. The default action of
SIGTERM ends the interpreter at once, and a run stopped so once left its PostgreSQL server holding its port an
hour later.

Under pytest-xdist the signal reaches the controller only, while the fixtures live in the worker processes: the
controller passes it on to its workers, so that each unwinds at once, as all of them do on Ctrl-C (which reaches
the whole process group). Without that a worker waited for the controller's shutdown message, and on a loaded
machine xdist killed it after its 10 s grace, before its teardown had run."""

from __future__ import annotations

import os
import signal
from pathlib import Path

_xdist_controller = False  # set in pytest_configure: this process runs xdist's workers


def _children() -> list[int]:
    """This process's child processes (from /proc; none where there is no /proc)."""
    me, found = str(os.getpid()), []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if stat.read_text().rsplit(")", 1)[1].split()[1] == me:
                found.append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    return found


def _interrupt(signum, frame):
    if _xdist_controller:
        for pid in _children():
            try:
                os.kill(pid, signum)
            except OSError:
                continue
    raise KeyboardInterrupt(f"stopped by signal {signal.Signals(signum).name}")


def pytest_configure(config) -> None:
    global _xdist_controller
    _xdist_controller = not hasattr(config, "workerinput") and bool(
        getattr(config.option, "numprocesses", None)
    )
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _interrupt)
