"""Finding or building llama.cpp's own C++ server, ``llama-server``, from the llama.cpp source that the
pinned llama-cpp-python sdist vendors (so the binding and the server share one llama.cpp), and compiling
that llama.cpp once per machine and version for both.

Where it is looked for, in order: ``SPECROUTE_LLAMA_SERVER`` (a path), then ``llama-server`` on PATH, then
the data folder's cache (``<data_dir>/cache/llama-server/<llama-cpp-python version>/llama-server``, honoured
where a build lies there), then the machine's build cache (``SPECROUTE_BUILD_CACHE``, by default the per-user
cache folder such as ``~/.cache/specroute``: ``llama-server/<version>/llama-server``), which every data folder
on the machine shares. Where none holds it, :class:`LlamaServerMissing` names the command that builds it,
``specroute llama-server build``, which downloads the pinned sdist with pip, configures llama.cpp with CMake
for the same instruction sets for every x86-64 CPU of the last ten years, builds the ``llama-server`` target
with llama.cpp's shared libraries (``libllama``, ``libggml*``) beside it, and keeps them in the build cache; a
second build of the same version reuses whichever of the two caches holds it.

The README installs llama-cpp-python without compiling anything (``CMAKE_ARGS=-DLLAMA_BUILD=OFF``): its
Python binding then loads those same libraries from the cache (:func:`library_dir`; llama-cpp-python reads
``LLAMA_CPP_LIB_PATH``), so a machine compiles llama.cpp once, for the server and the binding alike."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

from analyzer.engine.engine_base import EngineUnavailable

LLAMA_CPP_PYTHON_VERSION = "0.3.36"  # the pinned version of pyproject.toml's llamacpp extra
BINARY = "llama-server"
BUILD_COMMAND = "specroute llama-server build"
# the README's build: for any x86-64 CPU of the last ten years, not the build machine's own (a native
# build on a CPU with AMX crashed in llama.cpp's AMX kernels; benchmarks/README.md)
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=OFF",
    "-DGGML_AVX=ON",
    "-DGGML_AVX2=ON",
    "-DGGML_FMA=ON",
    "-DGGML_F16C=ON",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_CURL=OFF",
    # shared libraries that llama-cpp-python loads too, found by the binary beside it
    "-DBUILD_SHARED_LIBS=ON",
    "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON",
    "-DCMAKE_INSTALL_RPATH=$ORIGIN",
)
LIBRARY = "libllama.so"  # the library llama-cpp-python loads first (with libggml*.so beside it)


class LlamaServerMissing(EngineUnavailable):
    """No llama-server binary where specroute looks; the message names where it looked and the build."""

    status, code = 503, "llama_server_missing"


class Found(NamedTuple):
    """A llama-server binary and where it was found: "SPECROUTE_LLAMA_SERVER", "PATH" or "cache"."""

    path: Path
    source: str


def cached_binary(cache_root: Path, version: str = LLAMA_CPP_PYTHON_VERSION) -> Path:
    """Where the build of ``version`` keeps its binary under ``cache_root`` (a data folder's ``cache`` or the
    machine's build cache)."""
    return cache_root / BINARY / version / BINARY


def machine_build_cache() -> Path:
    """The machine's build cache as the settings in force name it (SPECROUTE_BUILD_CACHE, else the per-user
    cache folder)."""
    from analyzer.settings import load_settings

    return load_settings().resolved_build_cache()


def build_roots(cache_root: Path, build_cache: Path | None = None) -> list[Path]:
    """Where a build is looked for, in order: the data folder's cache ``cache_root``, then the machine's build
    cache (``build_cache``; None: :func:`machine_build_cache`)."""
    machine = build_cache if build_cache is not None else machine_build_cache()
    return [cache_root] if machine == cache_root else [cache_root, machine]


def library_dir(
    cache_root: Path, version: str = LLAMA_CPP_PYTHON_VERSION, *, build_cache: Path | None = None
) -> Path | None:
    """The folder holding the build's llama.cpp shared libraries, in the data folder's cache or else the
    machine's build cache (:func:`build_roots`), or None when neither holds a build with them."""
    for root in build_roots(cache_root, build_cache):
        folder = cached_binary(root, version).parent
        if (folder / LIBRARY).is_file():
            return folder
    return None


def find_llama_server(
    setting: str, cache_root: Path, *, path: str | None = None, build_cache: Path | None = None
) -> Found:
    """The llama-server binary: ``setting`` (SPECROUTE_LLAMA_SERVER) when given, which must then be an
    executable file; else ``llama-server`` on ``path`` (default: PATH); else the data folder's cache
    ``cache_root``; else the machine's build cache (``build_cache``; None: :func:`machine_build_cache`). Raises
    :class:`LlamaServerMissing` naming each place and the build command."""
    if setting:
        given = Path(setting).expanduser()
        if not (given.is_file() and os.access(given, os.X_OK)):
            raise LlamaServerMissing(
                f"SPECROUTE_LLAMA_SERVER is {setting!r}, which is not an executable file; point it at a "
                f"llama-server binary, or unset it and run '{BUILD_COMMAND}'"
            )
        return Found(given, "SPECROUTE_LLAMA_SERVER")
    on_path = shutil.which(BINARY, path=path)
    if on_path:
        return Found(Path(on_path), "PATH")
    roots = build_roots(cache_root, build_cache)
    for root in roots:
        cached = cached_binary(root)
        if cached.is_file() and os.access(cached, os.X_OK):
            return Found(cached, "cache")
    places = " or ".join(str(cached_binary(root).parent) for root in roots)
    raise LlamaServerMissing(
        f"llama-server was not found (SPECROUTE_LLAMA_SERVER is unset, none is on PATH, none is in "
        f"{places}); build it with '{BUILD_COMMAND}' (llama.cpp from the pinned llama-cpp-python "
        f"{LLAMA_CPP_PYTHON_VERSION} sdist, with the libraries llama-cpp-python loads; 4 to 14 minutes on "
        "2 cores, once per version)"
    )


def build_llama_server(
    build_cache: Path,
    *,
    version: str = LLAMA_CPP_PYTHON_VERSION,
    jobs: int | None = None,
    say: Callable[[str], None] = print,
    force: bool = False,
    also: Sequence[Path] = (),
) -> Path:
    """Build llama-server and llama.cpp's shared libraries from the vendored llama.cpp of llama-cpp-python
    ``version``'s sdist into ``build_cache`` (the machine's build cache) and return the binary; unless
    ``force``, reuse a build of that version with its libraries found in one of the caches ``also`` (a data
    folder's) or in ``build_cache``. ``say`` gets a line per stage, each compile step as ``step N of M: ...``,
    and the time it took. Nothing is left in the cache when a step fails (the build happens in a temporary
    folder; the finished folder is moved in last)."""
    target = cached_binary(build_cache, version)
    if not force:
        for root in [build_cache, *also]:
            found = cached_binary(root, version)
            if found.is_file() and (found.parent / LIBRARY).is_file():
                say(f"llama-server {version} already built: {found} (reused; --force builds it again)")
                if found != target:  # a data folder's build, shared from now on through the build cache
                    _stage_and_replace(target.parent, lambda staged: _copy_build(found.parent, staged))
                    say(f"copied it to {target.parent}, where every data folder on this machine finds it")
                    return target
                return found
        if target.is_file():
            say(f"llama-server {version} is cached without llama.cpp's shared libraries: building it again")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="specroute-llama-server-") as work:
        source = _vendored_source(Path(work), version, say)
        build = Path(work) / "build"
        say(f"configuring llama.cpp from llama-cpp-python {version} ({' '.join(CMAKE_FLAGS)})")
        _run(["cmake", "-S", str(source), "-B", str(build), "-G", "Ninja", *CMAKE_FLAGS], say)
        say(f"building the {BINARY} target and llama.cpp's libraries ({jobs or os.cpu_count()} jobs)")
        _run(
            ["cmake", "--build", str(build), "--target", BINARY, "-j", str(jobs or os.cpu_count() or 1)], say
        )
        _stage_and_replace(target.parent, lambda staged: _copy_build(build / "bin", staged))
    say(f"built {target} and llama.cpp's libraries beside it in {_minutes(time.monotonic() - started)}")
    return target


def _copy_build(source: Path, staged: Path) -> None:
    """The binary and llama.cpp's shared libraries of the build in ``source`` into ``staged``."""
    for built in [source / BINARY, *sorted(source.glob("lib*.so*"))]:
        shutil.copy2(built, staged / built.name, follow_symlinks=False)


def _stage_and_replace(folder: Path, fill: Callable[[Path], None]) -> None:
    """A new ``folder``, filled by ``fill`` in a staging folder beside it and then put in its place whole."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    staged = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    staged.chmod(0o755)  # mkdtemp's folder is the owner's alone; a cache other users may read
    fill(staged)
    _replace_folder(staged, folder)


def _replace_folder(staged: Path, folder: Path) -> None:
    """Put ``staged`` where ``folder`` is: a reader finds the old folder or the new one, never a part."""
    old = folder.with_name(f".{folder.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if folder.exists():
        folder.rename(old)
    staged.rename(folder)
    shutil.rmtree(old, ignore_errors=True)


def _minutes(seconds: float) -> str:
    return f"{int(seconds // 60)} min {int(seconds % 60)} s"


def _vendored_source(work: Path, version: str, say: Callable[[str], None]) -> Path:
    """The sdist of llama-cpp-python ``version`` (pip download, from the configured index) unpacked in
    ``work``; its vendored llama.cpp folder."""
    say(f"downloading the llama-cpp-python {version} sdist with pip")
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            f"llama-cpp-python=={version}",
            "--no-deps",
            "--no-binary",
            ":all:",
            "--dest",
            str(work),
        ],
        say,
    )
    (archive,) = work.glob("llama_cpp_python-*.tar.gz")
    with tarfile.open(archive) as sdist:
        sdist.extractall(work, filter="data")
    (source,) = work.glob(f"llama_cpp_python-{version}/vendor/llama.cpp")
    return source


def _run(command: list[str], say: Callable[[str], None]) -> None:
    """Run ``command``, passing its progress lines (Ninja's ``[n/m] ...`` as ``step n of m: ...``) to
    ``say``; a failure raises :class:`LlamaServerMissing` with the command's last lines."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert process.stdout is not None  # piped above
    tail: list[str] = []
    for line in process.stdout:
        line = line.rstrip()
        tail = (tail + [line])[-20:]
        step = _step(line)
        if step:
            say(step)
    if process.wait() != 0:
        raise LlamaServerMissing(
            f"building llama-server failed at: {' '.join(command[:4])} ...\n" + "\n".join(tail)
        )


def _step(line: str) -> str | None:
    """Ninja's ``[42/206] Building CXX object ...`` as ``step 42 of 206: Building CXX object ...``; None for
    any other line."""
    head, _, rest = line.partition("] ")
    done, _, total = head.lstrip("[").partition("/")
    if not (line.startswith("[") and done.isdigit() and total.isdigit()):
        return None
    return f"step {done} of {total}: {rest}"[:160]
