"""A test run that is interrupted leaves nothing behind: one stopped with SIGTERM tears its
fixtures down as Ctrl-C does (a throw-away server's teardown runs), and a llama-server whose starter is killed
with SIGKILL ends with it (the kernel's parent-death signal)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has ended, waiting for its parent to reap it


def _wait_for(path: Path, timeout_s: float = 30.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return path.read_text().strip()
        time.sleep(0.05)
    raise AssertionError(f"{path} was not written within {timeout_s} s")


@pytest.mark.parametrize("workers", [(), ("-n", "2")], ids=["one process", "two xdist workers"])
def test_a_run_stopped_with_sigterm_tears_its_fixtures_down(tmp_path, workers):
    started, torn_down = tmp_path / "started", tmp_path / "torn_down"
    test_file = tmp_path / "test_long.py"
    test_file.write_text(
        textwrap.dedent(
            f"""
            import time
            from pathlib import Path

            import pytest

            @pytest.fixture(scope="session")
            def server():
                yield
                Path({str(torn_down)!r}).write_text("stopped")  # as throwaway_postgres stops its server

            def test_long(server):
                Path({str(started)!r}).write_text("running")
                time.sleep(60)
            """
        )
    )
    run = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.stop_on_sigterm", "-p", "no:cacheprovider",
         *workers, str(test_file), "--rootdir", str(tmp_path)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        _wait_for(started)
        run.send_signal(signal.SIGTERM)
        output, _ = run.communicate(timeout=30)
    finally:
        run.kill()
    assert torn_down.read_text() == "stopped", output
    assert run.returncode != 0 and "stopped by signal SIGTERM" in output


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_a_server_ends_with_the_process_that_started_it_even_when_killed(tmp_path):
    pid_file = tmp_path / "pid"
    starter = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(
            f"""
            import time
            from pathlib import Path
            from analyzer.engine.llama_server_process import spawn

            child = spawn(["sleep", "120"], open({str(tmp_path / 'log')!r}, "wb"))
            Path({str(pid_file)!r}).write_text(str(child.pid))
            time.sleep(120)
            """
        )],
        cwd=ROOT,
    )  # fmt: skip
    try:
        child = int(_wait_for(pid_file))
        # setpriv arms the parent-death signal and then becomes the command: kill the starter after that, as a
        # worker is killed while its server runs (before it, a busy machine could let the kill come first)
        comm = Path(f"/proc/{child}/comm")
        deadline = time.monotonic() + 10
        while comm.read_text().strip() != "sleep" and time.monotonic() < deadline:
            time.sleep(0.02)
        assert comm.read_text().strip() == "sleep" and _alive(child)
        os.kill(starter.pid, signal.SIGKILL)  # no finally, no atexit: only the kernel can stop the child
        starter.wait(10)
        deadline = time.monotonic() + 10
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child)
    finally:
        starter.kill()
