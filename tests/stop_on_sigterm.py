"""A pytest plugin (tests/conftest.py takes its hook; ``-p tests.stop_on_sigterm`` loads it alone): a test run
stopped with SIGTERM (or SIGHUP) unwinds like one stopped with Ctrl-C, so every fixture's teardown runs: the
throw-away PostgreSQL server stops, llama-server processes stop, temporary folders go. The default action of
SIGTERM ends the interpreter at once, and a run stopped so once left its PostgreSQL server holding its port an
hour later."""

from __future__ import annotations

import signal


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"stopped by signal {signal.Signals(signum).name}")


def pytest_configure(config) -> None:
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _interrupt)
