"""llama-server processes and their HTTP API, as the llama-server engine uses them: start one server (one
slot, a given thread count and context, plain or with one drafter), wait until it serves, ask it for its
chat template, token ids and greedy completions with their ``timings``, and stop it.

Only the standard library speaks HTTP here (``urllib``), on 127.0.0.1 or on a URL the user gives. A server
that fails to start or stops answering raises :class:`LlamaServerError` with the last lines of its log."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from analyzer.engine.engine_base import EngineUnavailable

START_TIMEOUT_S = 120.0
REQUEST_TIMEOUT_S = 600.0


class LlamaServerError(EngineUnavailable):
    """A llama-server that did not start, or did not answer as expected."""

    status, code = 502, "llama_server_error"


@dataclass(frozen=True)
class Completion:
    """One greedy completion: its token ids (an end-of-generation token last where ``stop_type`` is
    ``"eos"``), the server's ``timings`` object (``predicted_ms``, ``predicted_n``, and ``draft_n`` /
    ``draft_n_accepted`` on a speculating server) and the text."""

    tokens: list[int]
    stop_type: str
    timings: dict[str, Any]
    text: str

    @property
    def predicted_ms(self) -> float:
        return float(self.timings["predicted_ms"])

    @property
    def stopped_at_eos(self) -> bool:
        return self.stop_type == "eos"


class LlamaServerClient:
    """The endpoints of one llama-server the engine uses, at ``url`` (``http://host:port``)."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")

    def _call(self, path: str, body: dict[str, Any] | None = None, timeout: float = REQUEST_TIMEOUT_S) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data, {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return json.load(response)
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:300]
            raise LlamaServerError(
                f"llama-server at {self.url} answered {path} with {exc.code}: {detail}"
            ) from None
        except (urllib.error.URLError, OSError) as exc:
            raise LlamaServerError(f"llama-server at {self.url} did not answer {path}: {exc}") from None

    def ready(self) -> bool:
        """Whether the server has loaded its model (``/health`` says ok)."""
        try:
            return self._call("/health", timeout=5).get("status") == "ok"
        except LlamaServerError:
            return False

    def props(self) -> dict[str, Any]:
        """The server's ``/props``: its context size, model path and build."""
        return dict(self._call("/props"))

    def chat_prompt(self, messages: list[dict[str, str]]) -> str:
        """The prompt text the server's chat template makes of ``messages`` (``/apply-template``)."""
        return str(self._call("/apply-template", {"messages": messages})["prompt"])

    def tokenize(self, text: str) -> list[int]:
        """The ids the server generates from for ``text`` (special tokens parsed, as for a completion)."""
        return [
            int(t)
            for t in self._call("/tokenize", {"content": text, "add_special": True, "parse_special": True})[
                "tokens"
            ]
        ]

    def complete(self, prompt_ids: list[int], n_predict: int) -> Completion:
        """Greedy completion of ``prompt_ids`` up to ``n_predict`` tokens, without the prompt cache (so
        ``timings`` cover the whole request)."""
        body = {
            "prompt": prompt_ids,
            "n_predict": n_predict,
            "temperature": 0.0,
            "top_k": 1,
            "return_tokens": True,
            "cache_prompt": False,
        }
        answer = self._call("/completion", body)
        return Completion(
            tokens=[int(t) for t in answer["tokens"]],
            stop_type=str(answer.get("stop_type", "")),
            timings=dict(answer["timings"]),
            text=str(answer.get("content", "")),
        )


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def server_command(
    binary: Path | str, model: Path | str, *, port: int, threads: int, n_ctx: int, flags: list[str],
    host: str = "127.0.0.1",
) -> list[str]:  # fmt: skip
    """The command line of one llama-server on ``host``:``port``: one slot, ``threads`` for decoding and
    prompts, context ``n_ctx``, and ``flags`` (a drafter's, or none for plain decoding)."""
    return [
        str(binary), "-m", str(model), "--host", host, "--port", str(port),
        "-t", str(threads), "-tb", str(threads), "-c", str(n_ctx), "-np", "1", "--no-webui", *flags,
    ]  # fmt: skip


def spawn(command: list[str], log: Any) -> subprocess.Popen[bytes]:
    """Start ``command`` with its output to ``log``, made to end with the thread that starts it where Linux
    allows (util-linux's ``setpriv --pdeathsig TERM``): a worker or a test run killed with SIGKILL leaves no
    server behind. Elsewhere the command as it is (:meth:`LlamaServerProcess.stop` still stops it)."""
    setpriv = shutil.which("setpriv") if sys.platform.startswith("linux") else None
    launched = [setpriv, "--pdeathsig", "TERM", "--", *command] if setpriv else command
    return subprocess.Popen(launched, stdout=log, stderr=subprocess.STDOUT)


class LlamaServerProcess:
    """One llama-server this process starts and stops (a context manager): ``client`` talks to it."""

    def __init__(
        self, binary: Path, model: Path, *, threads: int, n_ctx: int, flags: list[str] | None = None,
        host: str = "127.0.0.1", port: int | None = None,
    ) -> None:  # fmt: skip
        """``port`` None: a free one on 127.0.0.1."""
        self.flags = list(flags or [])
        self.port = free_port() if port is None else port
        self.command = server_command(
            binary, model, port=self.port, threads=threads, n_ctx=n_ctx, flags=self.flags, host=host
        )
        self.client = LlamaServerClient(
            f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{self.port}"
        )
        self._log = tempfile.NamedTemporaryFile(prefix="specroute-llama-server-", suffix=".log", delete=False)
        self._process: subprocess.Popen[bytes] | None = None

    def log_tail(self, lines: int = 15) -> str:
        """The last lines the server wrote."""
        return "\n".join(Path(self._log.name).read_text(errors="replace").splitlines()[-lines:])

    def cpu_seconds(self) -> float | None:
        """CPU seconds the server process has used so far (None off Linux or when it is not running)."""
        if self._process is None:
            return None
        try:
            fields = Path(f"/proc/{self._process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return None
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime

    def start(self, timeout_s: float = START_TIMEOUT_S) -> LlamaServerProcess:
        """Start the server and wait until it serves; raise :class:`LlamaServerError` with its log
        when it exits or is not ready within ``timeout_s``."""
        self._process = spawn(self.command, self._log)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise LlamaServerError(
                    f"llama-server exited with {self._process.returncode} at start "
                    f"({' '.join(self.command[3:])}):\n{self.log_tail()}"
                )
            if self.client.ready():
                return self
            time.sleep(0.1)
        self.stop()
        raise LlamaServerError(f"llama-server was not ready within {timeout_s:.0f} s:\n{self.log_tail()}")

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 10 s) and remove its log."""
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._process = None
        self._log.close()
        Path(self._log.name).unlink(missing_ok=True)

    def __enter__(self) -> LlamaServerProcess:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()


class RemoteServer:
    """A llama-server the user already runs, at ``url``: used as :class:`LlamaServerProcess` is, but never
    started or stopped here. Its CPU time is not readable from this machine (``cpu_seconds`` None), so its
    requests carry no interference reading. Its speculative setting is not in its ``/props``, so the analysis
    checks it from the server's own draft counts (analyzer/analysis/server_analysis.py)."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self.client = LlamaServerClient(self.url)
        self.flags: list[str] = []

    def start(self, timeout_s: float = START_TIMEOUT_S) -> RemoteServer:
        """Check that it serves; :class:`LlamaServerError` when it does not answer ``/health`` with ok."""
        if not self.client.ready():
            raise LlamaServerError(f"no llama-server answers /health with ok at {self.url}")
        return self

    def stop(self) -> None:
        """Nothing: the user's server keeps running."""

    def cpu_seconds(self) -> float | None:
        return None

    def setup(self) -> tuple[str, int]:
        """The server's model path and per-slot context size, from its ``/props``."""
        props = self.client.props()
        return str(props.get("model_path", "")), int(props["default_generation_settings"]["n_ctx"])


def server_version(binary: Path) -> str:
    """The binary's own version line (``version: 0.5.0-dev (build 1, commit 0c1e570)``), or "unknown"."""
    try:
        done = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.startswith("version:")]
    return lines[0].removeprefix("version:").strip()[:100] if lines else "unknown"


# a server an analysis asks: one it started, or one the user runs
Server = LlamaServerProcess | RemoteServer
