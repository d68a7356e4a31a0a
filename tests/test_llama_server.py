"""Finding llama.cpp's own server (issue 33, point 1): SPECROUTE_LLAMA_SERVER, then PATH, then the build
cache; where none holds it, an error that names the build command; a build of a cached version is reused.
(The build itself, about 10 minutes on 2 cores, is measured in benchmarks/RESULTS.md, not run here.)"""

from __future__ import annotations

import stat

import pytest

from analyzer.engine.llama_server import (
    BUILD_COMMAND,
    LLAMA_CPP_PYTHON_VERSION,
    LlamaServerMissing,
    build_llama_server,
    cached_binary,
    find_llama_server,
)
from webui.cli import cli


def _executable(path, text="#!/bin/sh\necho llama-server\n"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_the_setting_then_path_then_the_cache_and_an_error_naming_the_build(tmp_path):
    cache, bin_dir = tmp_path / "cache", tmp_path / "bin"
    bin_dir.mkdir()
    with pytest.raises(LlamaServerMissing) as missing:
        find_llama_server("", cache, path=str(bin_dir))
    assert f"build it with '{BUILD_COMMAND}'" in str(missing.value) and str(cache / "llama-server") in str(
        missing.value
    )
    cached = _executable(cached_binary(cache))
    assert cached == cache / "llama-server" / LLAMA_CPP_PYTHON_VERSION / "llama-server"
    assert find_llama_server("", cache, path=str(bin_dir)) == (cached, "cache")
    on_path = _executable(bin_dir / "llama-server")
    assert find_llama_server("", cache, path=str(bin_dir)) == (on_path, "PATH")  # PATH before the cache
    chosen = _executable(tmp_path / "mine" / "server")
    assert find_llama_server(str(chosen), cache, path=str(bin_dir)) == (chosen, "SPECROUTE_LLAMA_SERVER")
    # a setting that names no executable is an error, never a silent fallback to another binary
    (tmp_path / "plain").write_text("not executable")
    for wrong in (tmp_path / "nowhere", tmp_path / "plain", tmp_path):
        with pytest.raises(LlamaServerMissing, match="SPECROUTE_LLAMA_SERVER is .* not an executable file"):
            find_llama_server(str(wrong), cache, path=str(bin_dir))


def test_a_build_of_a_cached_version_is_reused_without_building(tmp_path):
    cached = _executable(cached_binary(tmp_path))
    said = []
    assert build_llama_server(tmp_path, say=said.append) == cached
    assert said == [
        f"llama-server {LLAMA_CPP_PYTHON_VERSION} already built: {cached} (reused; --force builds it again)"
    ]


def test_the_command_line_says_where_or_how_to_build(runner, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    missing = runner.invoke(cli, ["llama-server", "where"])
    assert missing.exit_code == 1 and f"build it with '{BUILD_COMMAND}'" in missing.stderr
    chosen = _executable(tmp_path / "server")
    monkeypatch.setenv("SPECROUTE_LLAMA_SERVER", str(chosen))
    found = runner.invoke(cli, ["llama-server", "where"])
    assert found.exit_code == 0 and found.stdout == f"{chosen} (from SPECROUTE_LLAMA_SERVER)\n"
