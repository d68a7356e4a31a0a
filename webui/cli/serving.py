"""``specroute worker`` and ``serve``: the processes that execute runs and answer requests."""

import os

import click

from analyzer.settings import SettingsError
from webui.cli.base import CliState, _cache_dir, cli


@cli.command("worker")
@click.option(
    "--once",
    is_flag=True,
    help="Work until the first run this worker took part in has stopped (or nothing is queued), then exit.",
)
@click.option(
    "--poll", default=2.0, show_default=True, type=click.FloatRange(0.1), help="Seconds between queue checks."
)
@click.option(
    "--stale-after",
    type=click.FloatRange(1.0),
    help="Seconds without a heartbeat after which another worker's chunk is claimed again "
    "(default: SPECROUTE_STALE_AFTER_S, 600).",
)
@click.pass_obj
def worker(state: CliState, once: bool, poll: float, stale_after: float | None) -> None:
    """Execute queued analysis runs, a chunk at a time (any number of workers, on any machines that
    share the database, work on the same run; a chunk left by a worker that died is claimed again
    after --stale-after), queued analyses in llama-server, and the web UI's training and suggestion jobs
    left queued by a server that shut down or died. Runs until Ctrl-C; set SPECROUTE_UI_WORKER=false on
    the server to leave all runs to these processes."""
    import socket

    from analyzer.analysis.run_records import get_run
    from analyzer.analysis.worker import work
    from router.serve.jobs import run_next_job

    sessions = state.sessions()
    stale_after_s = state.settings.stale_after_s if stale_after is None else stale_after
    worker_id = f"{socket.gethostname()}:{os.getpid()}:cli"
    click.echo(f"worker {worker_id} waiting for queued runs; Ctrl-C stops", err=True)

    def report(run_id: int) -> None:
        with sessions() as session:
            run = get_run(session, run_id)
            click.echo(f"run {run_id}: {run.status}" + (f" ({run.error})" if run.error else ""), err=True)

    try:
        work(
            sessions,
            cache_dir=_cache_dir(state),
            worker_id=worker_id,
            allow_network=state.settings.allow_downloads,
            poll_s=poll,
            stale_after_s=stale_after_s,
            once=once,
            on_run=report,
            also=lambda worker_id: run_next_job(sessions, worker_id, stale_after_s=stale_after_s),
        )
    except KeyboardInterrupt:
        raise SystemExit(130) from None


@cli.command("serve")
@click.option(
    "--host", default="127.0.0.1", show_default=True, help="Interface to listen on (0.0.0.0 for all)."
)
@click.option(
    "--port",
    default=8000,
    show_default=True,
    type=click.IntRange(0, 65535),
    help="TCP port (0 picks a free one).",
)
@click.option(
    "--threads",
    default=8,
    show_default=True,
    type=click.IntRange(1, 256),
    help="Worker threads per server process.",
)
@click.option(
    "--workers",
    default=1,
    show_default=True,
    type=click.IntRange(1, 64),
    help="Server processes sharing the port (one per CPU core serves the most routing requests): "
    "more than 1 runs them under gunicorn, which restarts one that dies. Each keeps its own "
    "metrics; online estimates are shared through the database.",
)
@click.pass_obj
def serve(state: CliState, host: str, port: int, threads: int, workers: int) -> None:
    """Serve the web UI and the routing API until Ctrl-C or SIGTERM: on waitress in one process, on
    gunicorn's pre-fork server (threaded workers) with --workers above 1."""
    state.sessions()  # the schema check, with its message
    _serve(state, host, port, threads, workers=workers)


def _serve(
    state: CliState, host: str, port: int, threads: int, urls: list[str] | None = None, workers: int = 1
) -> None:
    import socket

    if workers > 1:
        try:
            import webui.app  # noqa: F401 - imported once, before the forks: an import error stops here
            from webui.prefork import PreforkServer
        except ModuleNotFoundError as exc:
            if (exc.name or "").split(".")[0] not in ("gunicorn", "fcntl"):  # fcntl: gunicorn on Windows
                raise
            raise click.ClickException(
                "--workers above 1 runs on gunicorn, which is not installed "
                "(it runs on POSIX systems only); use --workers 1"
            ) from None
    state.close()  # no connection crosses a fork
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        listener = socket.create_server((host, port), family=family, backlog=1024)
    except OSError as exc:
        raise click.ClickException(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    effective_host, effective_port = listener.getsockname()[:2]
    base = f"http://{effective_host if family != socket.AF_INET6 else f'[{effective_host}]'}:{effective_port}"

    processes = "" if workers == 1 else f", {workers} processes"
    click.echo(f"specroute serving on {base} ({threads} threads{processes}); Ctrl-C stops", err=True)
    for line in urls or [f"web UI: {base}/", f"API: {base}/v1/route (OpenAPI at {base}/openapi.json)"]:
        click.echo("  " + line.replace("{base}", base), err=True)
    if workers == 1:
        _serve_one_process(listener, threads)
        return
    # the socket is bound here, before any fork, so that port 0 is resolved once and printed above
    PreforkServer(listener.detach(), _server_app, workers=workers, threads=threads).run()


def _server_app(runs_analysis: bool):
    """One server process's app; ``runs_analysis`` False keeps its analysis worker thread off (when
    True, SPECROUTE_UI_WORKER decides)."""
    from webui.app import create_app

    return create_app({} if runs_analysis else {"ui_worker": False})


def _serve_one_process(listener, threads: int) -> None:
    """waitress on ``listener`` in this process (threads only: it works on every OS) until Ctrl-C or SIGTERM."""
    import signal

    from webui.inline_serving import serve_with_waitress

    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM stops as Ctrl-C does: logs flushed
    try:
        app = _server_app(True)
    except SettingsError as exc:
        raise click.ClickException(str(exc)) from None
    server = serve_with_waitress(app, [listener], threads)
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
        app.extensions["specroute.close"]()
