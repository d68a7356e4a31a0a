"""Finding llama.cpp's own server: SPECROUTE_LLAMA_SERVER, then PATH, then the data folder's cache, then the
machine's build cache that every data folder shares; where none holds it, an error that names the build
command and every place looked in; a build of a version cached in either is reused. (The build itself, 4 to 14
minutes on 2 cores, is timed in benchmarks/; the binding loading its libraries runs against the build the
tests find.)"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from analyzer.engine.llama_server import (
    BUILD_COMMAND,
    LLAMA_CPP_PYTHON_VERSION,
    LlamaServerMissing,
    build_llama_server,
    cached_binary,
    find_llama_server,
)
from tests.conftest import require_modules
from webui.cli import cli


def _executable(path, text="#!/bin/sh\necho llama-server\n"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_the_setting_then_path_then_the_cache_and_an_error_naming_the_build(tmp_path):
    cache, bin_dir, machine = tmp_path / "cache", tmp_path / "bin", tmp_path / "machine"
    bin_dir.mkdir()
    with pytest.raises(LlamaServerMissing) as missing:
        find_llama_server("", cache, path=str(bin_dir), build_cache=machine)
    assert f"build it with '{BUILD_COMMAND}'" in str(missing.value)
    assert str(cache / "llama-server") in str(missing.value) and str(machine / "llama-server") in str(
        missing.value
    )
    built = _executable(cached_binary(machine))
    assert built == machine / "llama-server" / LLAMA_CPP_PYTHON_VERSION / "llama-server"
    assert find_llama_server("", cache, path=str(bin_dir), build_cache=machine) == (built, "cache")
    cached = _executable(cached_binary(cache))  # the data folder's own build comes first where there is one
    assert find_llama_server("", cache, path=str(bin_dir), build_cache=machine) == (cached, "cache")
    on_path = _executable(bin_dir / "llama-server")
    assert find_llama_server("", cache, path=str(bin_dir), build_cache=machine) == (on_path, "PATH")
    chosen = _executable(tmp_path / "mine" / "server")
    assert find_llama_server(str(chosen), cache, path=str(bin_dir), build_cache=machine) == (
        chosen,
        "SPECROUTE_LLAMA_SERVER",
    )
    # a setting that names no executable is an error, never a silent fallback to another binary
    (tmp_path / "plain").write_text("not executable")
    for wrong in (tmp_path / "nowhere", tmp_path / "plain", tmp_path):
        with pytest.raises(LlamaServerMissing, match="SPECROUTE_LLAMA_SERVER is .* not an executable file"):
            find_llama_server(str(wrong), cache, path=str(bin_dir), build_cache=machine)


def test_one_build_per_machine_is_found_from_every_data_folder(runner, tmp_path, monkeypatch):
    """A build in the machine's build cache serves a second data folder: the command line finds the server
    there, the binding's libraries are found there, and a build command run from the new data folder reuses
    it instead of compiling again."""
    from analyzer.engine import llama_server

    machine = tmp_path / "machine"
    built = _executable(cached_binary(machine))
    (built.parent / "libllama.so").write_bytes(b"")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("SPECROUTE_BUILD_CACHE", str(machine))

    def offline(work, version, say):
        raise AssertionError("nothing is compiled where a build exists")

    monkeypatch.setattr(llama_server, "_vendored_source", offline)
    for folder in ("first", "second"):
        monkeypatch.setenv("SPECROUTE_DATA_DIR", str(tmp_path / folder))
        where = runner.invoke(cli, ["llama-server", "where"])
        assert where.exit_code == 0 and where.stdout.strip() == f"{built} (from cache)"
        assert llama_server.library_dir(tmp_path / folder / "cache") == built.parent
        build = runner.invoke(cli, ["llama-server", "build"])
        assert build.exit_code == 0 and build.stdout.strip() == str(built)
        assert "already built" in build.stderr


def test_a_data_folders_build_is_shared_through_the_build_cache(runner, tmp_path, monkeypatch):
    """A build that lies in one data folder only is reused by the build command and copied, binary and
    libraries, to the machine's build cache, where another data folder then finds it."""
    from analyzer.engine import llama_server

    machine, first = tmp_path / "machine", tmp_path / "first"
    old = _executable(cached_binary(first / "cache"))
    (old.parent / "libllama.so").write_bytes(b"library")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("SPECROUTE_BUILD_CACHE", str(machine))
    monkeypatch.setenv("SPECROUTE_DATA_DIR", str(tmp_path / "second"))
    assert runner.invoke(cli, ["llama-server", "where"]).exit_code == 1  # not in the second data folder yet

    def offline(work, version, say):
        raise AssertionError("nothing is compiled where a build exists")

    monkeypatch.setattr(llama_server, "_vendored_source", offline)
    monkeypatch.setenv("SPECROUTE_DATA_DIR", str(first))
    build = runner.invoke(cli, ["llama-server", "build"])
    shared = cached_binary(machine)
    assert build.exit_code == 0 and build.stdout.strip() == str(shared)
    assert f"copied it to {shared.parent}" in build.stderr
    assert (
        shared.read_text() == old.read_text() and (shared.parent / "libllama.so").read_bytes() == b"library"
    )
    monkeypatch.setenv("SPECROUTE_DATA_DIR", str(tmp_path / "second"))
    where = runner.invoke(cli, ["llama-server", "where"])
    assert where.exit_code == 0 and where.stdout.strip() == f"{shared} (from cache)"


def test_a_build_of_a_cached_version_is_reused_without_building(tmp_path, monkeypatch):
    from analyzer.engine import llama_server

    cached = _executable(cached_binary(tmp_path))
    monkeypatch.setenv("SPECROUTE_BUILD_CACHE", str(tmp_path))

    # a binary cached without llama.cpp's shared libraries (a build from before the binding loaded them) is
    # built again; a build that fails leaves the cache as it was
    def offline(work, version, say):
        raise LlamaServerMissing("pip could not download the sdist")

    monkeypatch.setattr(llama_server, "_vendored_source", offline)
    said = []
    with pytest.raises(LlamaServerMissing, match="could not download"):
        build_llama_server(tmp_path, say=said.append)
    assert said == [
        f"llama-server {LLAMA_CPP_PYTHON_VERSION} is cached without llama.cpp's shared libraries: building it again"
    ]
    assert (
        llama_server.library_dir(tmp_path) is None and cached.read_text() == "#!/bin/sh\necho llama-server\n"
    )
    (cached.parent / "libllama.so").write_bytes(b"")
    assert llama_server.library_dir(tmp_path) == cached.parent
    said.clear()
    assert build_llama_server(tmp_path, say=said.append) == cached
    assert said == [
        f"llama-server {LLAMA_CPP_PYTHON_VERSION} already built: {cached} (reused; --force builds it again)"
    ]


def test_ninja_progress_reads_as_steps_and_other_lines_are_not_progress():
    from analyzer.engine.llama_server import _step

    assert (
        _step("[42/212] Building CXX object src/llama.cpp.o")
        == "step 42 of 212: Building CXX object src/llama.cpp.o"
    )
    assert _step("[ 50%] Built target ggml") is None and _step("-- Configuring done") is None


def test_the_command_line_says_where_or_how_to_build(runner, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    missing = runner.invoke(cli, ["llama-server", "where"])
    assert missing.exit_code == 1 and f"build it with '{BUILD_COMMAND}'" in missing.stderr
    chosen = _executable(tmp_path / "server")
    monkeypatch.setenv("SPECROUTE_LLAMA_SERVER", str(chosen))
    found = runner.invoke(cli, ["llama-server", "where"])
    assert found.exit_code == 0 and found.stdout == f"{chosen} (from SPECROUTE_LLAMA_SERVER)\n"


_LOAD_AND_GENERATE = """
import sys
from analyzer.engine.engine_base import EngineUnavailable
from analyzer.engine.llamacpp_engine import require_llama_cpp
from analyzer.models.loading import _builtin_gguf_path
try:
    llama_cpp = require_llama_cpp()
except EngineUnavailable as exc:
    print("unavailable:", exc)
    sys.exit(3)
print("loaded from", llama_cpp.llama_cpp._base_path)
model = llama_cpp.Llama(str(_builtin_gguf_path()), n_ctx=256, n_threads=2, verbose=False)
print("tokens", len(model("The capital of France is", max_tokens=4, temperature=0.0)["choices"][0]["text"]) > 0)
"""


def _binding_without_its_library(tmp_path):
    """A copy of the installed llama-cpp-python without llama.cpp compiled into it, as
    ``CMAKE_ARGS=-DLLAMA_BUILD=OFF pip install`` leaves it."""
    import importlib.util
    import shutil

    package = Path(importlib.util.find_spec("llama_cpp").origin).parent
    site = tmp_path / "site"
    shutil.copytree(package, site / "llama_cpp", ignore=shutil.ignore_patterns("lib", "__pycache__"))
    return site


def test_a_binding_installed_without_llama_cpp_loads_the_one_the_server_build_compiled(
    tmp_path, llama_server_binary
):
    """One compile for both: the binding without a library of its own loads the libraries the llama-server
    build keeps beside the binary, and generates with them; with no build in the cache, the error names it."""
    import subprocess
    import sys

    require_modules(["llama_cpp"], "pip install -e '.[llamacpp]'")
    libraries = llama_server_binary.parent
    assert (libraries / "libllama.so").is_file() and list(libraries.glob("libggml*.so*"))
    site = _binding_without_its_library(tmp_path)
    data = tmp_path / "data"
    (data / "cache" / "llama-server").mkdir(parents=True)
    (data / "cache" / "llama-server" / LLAMA_CPP_PYTHON_VERSION).symlink_to(libraries)
    env = {k: v for k, v in os.environ.items() if k != "LLAMA_CPP_LIB_PATH"}
    env.update(
        PYTHONPATH=f"{site}{os.pathsep}{Path(__file__).resolve().parents[1]}", SPECROUTE_DATA_DIR=str(data)
    )
    ran = subprocess.run([sys.executable, "-c", _LOAD_AND_GENERATE], env=env, capture_output=True, text=True)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert (
        ran.stdout.splitlines()[0]
        == f"loaded from {data / 'cache' / 'llama-server' / LLAMA_CPP_PYTHON_VERSION}"
    )
    assert ran.stdout.splitlines()[1] == "tokens True"
    env["SPECROUTE_DATA_DIR"] = str(tmp_path / "empty")
    missing = subprocess.run(
        [sys.executable, "-c", _LOAD_AND_GENERATE], env=env, capture_output=True, text=True
    )
    assert missing.returncode == 3 and missing.stdout.startswith(
        "unavailable: llama-cpp-python is installed without llama.cpp's library"
    )
    assert f"run '{BUILD_COMMAND}' once" in missing.stdout
