"""The ``specroute`` command line: the group every command hangs on, the state the commands share,
and small helpers. The commands live in the modules beside this one, one per command group.

Every command that touches data first checks that the database schema is at head and, if not, says
exactly what to run. Each command is one transaction: it stores everything or nothing.

Errors have one handler, :class:`SpecrouteGroup`: a :class:`analyzer.errors.SpecrouteError` from any
command (or from reading the settings) prints ``Error: <message>`` on stderr and exits with the
class's ``exit_code`` (1); click's usage errors exit 2, an interrupted analysis 130.
"""

import sys
import typing
from dataclasses import dataclass
from pathlib import Path

import click
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

import migrations
from analyzer.db import engine_from_settings, make_session_factory
from analyzer.errors import SpecrouteError
from analyzer.run_params import LIMITS, RunParams
from analyzer.settings import Settings, load_settings


@dataclass
class CliState:
    """What the commands share: the settings in force and, once needed, the engine."""

    settings: Settings
    _engine: Engine | None = None

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            self._engine = engine_from_settings(self.settings)
        return self._engine

    def sessions(self, *, check_schema: bool = True) -> sessionmaker[Session]:
        """A session factory, after checking the schema is at head (unless told not to:
        SchemaNotCurrent says what to run)."""
        if check_schema:
            migrations.require_head(self.engine)
        return make_session_factory(self.engine)

    def close(self) -> None:
        if self._engine is not None:
            self._engine.dispose()


class CommandFailed(click.ClickException):
    """A SpecrouteError as click reports it: ``Error: <message>`` on stderr, the class's exit code."""

    def __init__(self, error: SpecrouteError):
        super().__init__(error.message)
        self.exit_code = error.exit_code  # type: ignore[misc]  # click declares it on the class


class SpecrouteGroup(click.Group):
    """The root group: every command runs inside its ``invoke``, so this is the one place that turns
    a SpecrouteError into a message and an exit code (no command catches them to do the same)."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except SpecrouteError as exc:
            raise CommandFailed(exc) from None


@click.group(cls=SpecrouteGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="specroute")
@click.pass_context
def cli(ctx: click.Context) -> None:
    """specroute: measure where speculative decoding pays off on your prompts, then route requests.

    Settings come from SPECROUTE_* environment variables; see 'specroute settings'.
    """
    state = CliState(load_settings())  # SettingsError: SpecrouteGroup reports it
    ctx.obj = state
    ctx.call_on_close(state.close)


def run_param_range(name: str) -> click.ParamType:
    """The click type of the analysis run parameter ``name``: its range in
    :data:`analyzer.run_params.LIMITS` (the one the web form and ``RunParams.check`` use), an
    ``IntRange`` where :class:`RunParams` declares the parameter an ``int``, else a ``FloatRange``."""
    limit = LIMITS[name]
    declared = typing.get_type_hints(RunParams)[name]
    whole = declared is int or int in typing.get_args(declared)
    if whole:
        high = None if limit.high is None else int(limit.high)
        return click.IntRange(int(limit.low), high, min_open=limit.low_open)
    return click.FloatRange(limit.low, limit.high, min_open=limit.low_open)


class AnalysisParam(click.ParamType):
    """An analysis as ``specroute runs list`` prints it (:mod:`analyzer.analysis.analysis_ref`): ``7``,
    ``llama-server:3``, ``llama-server-job:2``."""

    name = "analysis"

    def convert(self, value, param, ctx):
        from analyzer.analysis.analysis_ref import AnalysisRef, parse_analysis_ref

        if isinstance(value, AnalysisRef):
            return value
        try:
            return parse_analysis_ref(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


ANALYSIS = AnalysisParam()


class _TqdmProgress:
    """A tqdm bar per phase (profiling, measuring, validating) on stderr."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.bar: typing.Any = None
        self.phase: str | None = None

    def __call__(self, done: int, total: int, phase: str) -> None:
        if not self.enabled:
            return
        from tqdm import tqdm

        if phase != self.phase:
            self.close()
            self.phase = phase
            if total == 0:
                click.echo(phase + " ...", err=True)
                return
            unit = (
                "s"
                if phase.startswith("machine busy")
                else "generation"
                if "machinery overhead" in phase
                else "pass"
                if phase.startswith("profiling")
                else "prompt"
            )
            waiting = {"bar_format": "{desc}: {n_fmt}/{total_fmt} s waited"} if unit == "s" else {}
            self.bar = tqdm(
                total=total,
                initial=done,
                desc=phase,
                unit=unit,
                file=sys.stderr,
                dynamic_ncols=True,
                **waiting,
            )
            return
        if self.bar is not None:  # a phase's total is fixed: its bar never grows past 100%
            self.bar.update(min(done, self.bar.total) - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def _cache_dir(state: CliState) -> Path:
    return state.settings.resolved_data_dir() / "cache"


def _tasks_text(counts: dict[str | None, int]) -> str:
    return ", ".join(f"{task or 'unlabelled'} {count}" for task, count in counts.items()) or "empty"


def _summary_dict(summary) -> dict:
    return {
        "name": summary.name,
        "prompt_count": summary.prompt_count,
        "file_format": summary.file_format,
        "source_filename": summary.source_filename,
        "duplicates_merged": summary.duplicates_merged,
        "task_counts": {task or "": count for task, count in summary.task_counts.items()},
        "created_at": summary.created_at.isoformat(),
    }


def _prompt_dict(prompt) -> dict:
    return {
        "position": prompt.position,
        "line": prompt.source_line,
        "id": prompt.external_id,
        "task": prompt.task,
        "text": prompt.text,
        "messages": prompt.messages,
        "suggested_task": prompt.suggested_task,
        "suggested_confidence": prompt.suggested_confidence,
        "suggested_by": prompt.suggested_by,
    }


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="specroute")
