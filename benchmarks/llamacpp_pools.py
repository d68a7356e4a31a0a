"""llama.cpp serving pools for the benchmarks and tests: ``python -m llama_cpp.server`` (llama-cpp-python's
OpenAI-compatible server) started as subprocesses on free loopback ports, one plain and one speculating
with prompt lookup at a fixed gamma, and a greedy client for them.

llama.cpp servers fix speculation per server (llama-cpp-python: ``--draft_model prompt-lookup-decoding
--draft_model_num_pred_tokens G`` builds one ``LlamaPromptLookupDecoding(num_pred_tokens=G)`` for the
server's life), so a deployment runs pools and the router names the pool (DESIGN.md, "Engines").

Each pool serves its GGUF file through a symbolic link named after the pool (``<name>.gguf``): the
server answers a completion with ``"model": <the model path it loaded>`` when the request names no model
(it echoes the request's ``model`` field otherwise, whatever it serves), so the link's name in the
answer says which server produced it. ``--model_alias`` is the pool's name too (``/v1/models`` lists it).

    with running_pools(gguf, {"plain": None, "spec4": 4}, n_threads=2) as pools:
        answer = complete(pools["spec4"].url, templated_prompt_text, max_tokens=64)
        print(answer.text, answer.completion_tokens, answer.wall_s, answer.model)
"""

from __future__ import annotations

import contextlib
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
from typing import Iterator, Mapping

# llama-cpp-python's request defaults are not greedy (temperature 0.8, top_k 40, top_p 0.95, min_p 0.05,
# repeat_penalty 1.1); the repeat penalty is applied before its greedy sampler, so it must be 1.0 too
GREEDY_FIELDS = {
    "temperature": 0.0,
    "top_k": 1,
    "top_p": 1.0,
    "min_p": 0.0,
    "repeat_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
}
STDERR_TAIL_CHARS = 3000
# environment names the server reads besides its command line (pydantic-settings fields, uvicorn's HOST/PORT)
_SERVER_ENVIRONMENT = {
    "host",
    "port",
    "config_file",
    "model",
    "model_alias",
    "n_ctx",
    "n_threads",
    "n_threads_batch",
    "draft_model",
    "draft_model_num_pred_tokens",
    "verbose",
    "api_key",
    "chat_format",
    "cache",
    "n_gpu_layers",
    "seed",
    "n_batch",
    "n_ubatch",
    "interrupt_requests",
    "root_path",
}


class PoolError(RuntimeError):
    """A pool did not start, died, or answered a request with an error (the message says which)."""


@dataclass
class Pool:
    """One running ``llama_cpp.server``: ``name`` (its alias and model link), ``url`` (http://127.0.0.1:<port>),
    ``gamma`` (prompt-lookup tokens per round; None for the plain pool), its process and log file."""

    name: str
    url: str
    gamma: int | None
    model_path: Path
    process: subprocess.Popen
    log_path: Path

    def log_tail(self, chars: int = STDERR_TAIL_CHARS) -> str:
        """The end of the server's stdout + stderr."""
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self, timeout_s: float = 10.0) -> None:
        """Terminate the server (kill it if it has not exited after ``timeout_s``)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=timeout_s)


@dataclass(frozen=True)
class Completion:
    """One greedy completion: the ``text``, ``completion_tokens`` and ``prompt_tokens`` the server
    counted, its ``finish_reason`` ("stop" at EOS, "length" at max_tokens), the ``model`` it named
    (the pool's model link) and ``wall_s``, the client-measured time from sending the request to
    reading the whole answer (prefill + decoding + HTTP on loopback)."""

    text: str
    completion_tokens: int
    prompt_tokens: int
    finish_reason: str | None
    model: str
    wall_s: float


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _server_environment(n_threads: int) -> dict[str, str]:
    """This process' environment less every name the server would read as a setting (its settings
    are pydantic-settings fields, filled from same-named environment variables the command line leaves
    unset; uvicorn reads HOST and PORT), so only the command line configures a pool."""
    names = set(_SERVER_ENVIRONMENT)
    try:
        from llama_cpp.server.settings import Settings

        names |= {name.lower() for name in Settings.model_fields}
    except ImportError:
        pass
    env = {k: v for k, v in os.environ.items() if k.lower() not in names}
    env["OMP_NUM_THREADS"] = str(n_threads)
    return env


def _get_json(url: str, timeout_s: float) -> dict:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return json.loads(response.read())


def start_pool(
    model: Path,
    name: str,
    *,
    gamma: int | None = None,
    n_threads: int = 1,
    n_ctx: int = 2048,
    folder: Path,
    startup_timeout_s: float = 120.0,
) -> Pool:
    """Start ``python -m llama_cpp.server`` serving ``model`` (a GGUF file) as pool ``name`` on a free
    loopback port, speculating with prompt lookup at ``gamma`` tokens per round (None: plain), decoding
    with ``n_threads`` threads, and wait until ``/v1/models`` answers. A server that exits or does not
    answer within ``startup_timeout_s`` is stopped and reported with the tail of its output."""
    if gamma is not None and gamma < 1:
        raise ValueError(f"gamma must be >= 1 (or None for the plain pool), got {gamma}")
    folder.mkdir(parents=True, exist_ok=True)
    link = folder / f"{name}.gguf"
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(Path(model).resolve())
    log_path = folder / f"{name}.log"
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "llama_cpp.server",
        "--model",
        str(link),
        "--model_alias",
        name,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--n_ctx",
        str(n_ctx),
        "--n_threads",
        str(n_threads),
        "--n_threads_batch",
        str(n_threads),
        "--verbose",
        "false",
    ]
    if gamma is not None:
        command += ["--draft_model", "prompt-lookup-decoding", "--draft_model_num_pred_tokens", str(gamma)]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=_server_environment(n_threads),
        )
    pool = Pool(name, f"http://127.0.0.1:{port}", gamma, link, process, log_path)
    deadline = time.monotonic() + startup_timeout_s
    while True:
        if process.poll() is not None:
            raise PoolError(
                f"llama.cpp pool {name!r} exited with status {process.returncode} while starting "
                f"({' '.join(command)}); its output ends:\n{pool.log_tail()}"
            )
        try:
            served = [m["id"] for m in _get_json(pool.url + "/v1/models", timeout_s=2.0)["data"]]
            if name in served:
                return pool
        except (OSError, ValueError, KeyError):
            pass
        if time.monotonic() > deadline:
            pool.stop()
            raise PoolError(
                f"llama.cpp pool {name!r} did not answer /v1/models within {startup_timeout_s:.0f} s; "
                f"its output ends:\n{pool.log_tail()}"
            )
        time.sleep(0.2)


@contextlib.contextmanager
def running_pools(
    model: Path,
    gammas: Mapping[str, int | None],
    *,
    n_threads: int = 1,
    n_ctx: int = 2048,
    startup_timeout_s: float = 120.0,
) -> Iterator[dict[str, Pool]]:
    """Pools {name: Pool} for ``gammas`` ({name: gamma or None}), started one after the other in a
    temporary folder (model links and logs) and all stopped, and the folder removed, on exit."""
    folder = Path(tempfile.mkdtemp(prefix="specroute-pools-"))
    pools: dict[str, Pool] = {}
    try:
        for name, gamma in gammas.items():
            pools[name] = start_pool(
                model,
                name,
                gamma=gamma,
                n_threads=n_threads,
                n_ctx=n_ctx,
                folder=folder,
                startup_timeout_s=startup_timeout_s,
            )
        yield pools
    finally:
        for pool in pools.values():
            pool.stop()
        shutil.rmtree(folder, ignore_errors=True)


def complete(url: str, prompt: str, max_tokens: int, *, timeout_s: float = 300.0) -> Completion:
    """Send one prompt, already in its final text form (the chat template applied), to a pool's
    ``/v1/completions`` with greedy sampling (:data:`GREEDY_FIELDS`) and ``max_tokens``, and return the
    completion with the client-measured wall time. llama-cpp-python's server reports no timings of its
    own (no prefill/decode split, no drafted/accepted counts), so the wall time is all there is. The
    server's own request parser accepts text prompts only (not token ids); it tokenizes them with
    llama.cpp's tokenizer, special tokens parsed, and adds BOS only where the GGUF asks for it."""
    body = {"prompt": prompt, "max_tokens": int(max_tokens), "stream": False, **GREEDY_FIELDS}
    request = urllib.request.Request(
        url.rstrip("/") + "/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    started = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            answer = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        raise PoolError(f"{url} answered {exc.code}: {exc.read()[:500]!r}") from None
    except OSError as exc:
        raise PoolError(f"{url} did not answer: {exc}") from None
    wall_s = time.perf_counter() - started
    choice, usage = answer["choices"][0], answer.get("usage") or {}
    return Completion(
        choice["text"],
        int(usage.get("completion_tokens", 0)),
        int(usage.get("prompt_tokens", 0)),
        choice.get("finish_reason"),
        str(answer.get("model", "")),
        wall_s,
    )


def evict_prompt_cache(url: str) -> None:
    """Make the pool's next request prefill its whole prompt: the server keeps the last request's KV
    cache and reuses the longest common prefix, so a prompt sent a second time would skip most of
    its prefill. One token of an unrelated one-character prompt replaces that cache."""
    complete(url, "\n", 1, timeout_s=60.0)


def pool_name(model_path: str) -> str:
    """The pool that produced an answer, from the ``model`` it names (the pool's ``<name>.gguf`` link)."""
    return Path(model_path).name.removesuffix(".gguf")


def decision_pool(decision: Mapping) -> str:
    """The deployment a routing decision (its JSON form) names for llama.cpp: ``engine["llama.cpp"]["pool"]``
    where the router gives a llama.cpp block, else ``engine["pool"]`` (the same name: spec-off /
    spec-k<gamma>, or what SPECROUTE_ROUTER_POOLS maps "off" / "k<gamma>" to)."""
    engine = decision["engine"]
    block = engine.get("llama.cpp")
    return block["pool"] if isinstance(block, Mapping) and block.get("pool") else engine["pool"]
