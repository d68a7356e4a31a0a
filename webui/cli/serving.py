"""``specroute worker`` and ``serve``: the processes that execute runs and answer requests."""

import os

import click

from analyzer.models import AnalysisRun
from analyzer.settings import SettingsError


from webui.cli.base import CliState, _cache_dir, cli


@cli.command("worker")
@click.option("--once", is_flag=True, help="Execute at most one queued run, then exit.")
@click.option("--poll", default=2.0, show_default=True, type=click.FloatRange(0.1), help="Seconds between queue checks.")
@click.pass_obj
def worker(state: CliState, once: bool, poll: float) -> None:
    """Execute analysis runs queued from the web UI (any number of workers may run; each run is
    taken by one). Runs until Ctrl-C; set SPECROUTE_UI_WORKER=false on the server to leave all
    runs to these processes."""
    import socket

    from analyzer.worker import work

    sessions = state.sessions()
    worker_id = f"{socket.gethostname()}:{os.getpid()}:cli"
    click.echo(f"worker {worker_id} waiting for queued runs; Ctrl-C stops", err=True)

    def report(run_id: int) -> None:
        with sessions() as session:
            run = session.get(AnalysisRun, run_id)
            click.echo(f"run {run_id}: {run.status}" + (f" ({run.error})" if run.error else ""), err=True)

    try:
        work(sessions, cache_dir=_cache_dir(state), worker_id=worker_id, allow_network=state.settings.allow_downloads,
             poll_s=poll, once=once, on_run=report)
    except KeyboardInterrupt:
        raise SystemExit(130) from None


@cli.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to listen on (0.0.0.0 for all).")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535), help="TCP port (0 picks a free one).")
@click.option("--threads", default=8, show_default=True, type=click.IntRange(1, 256), help="Worker threads per server process.")
@click.option("--workers", default=1, show_default=True, type=click.IntRange(1, 64),
              help="Server processes sharing the port (one per CPU core serves the most routing requests). "
                   "Each keeps its own metrics; online estimates are shared through the database.")
@click.pass_obj
def serve(state: CliState, host: str, port: int, threads: int, workers: int) -> None:
    """Serve the web UI and the routing API on waitress, a production WSGI server, until Ctrl-C."""
    state.sessions()  # the schema check, with its message
    _serve(state, host, port, threads, workers=workers)


def _serve(state: CliState, host: str, port: int, threads: int, urls: list[str] | None = None, workers: int = 1) -> None:
    import socket

    import waitress

    from webui.app import create_app

    state.close()  # no connection crosses a fork
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        listener = socket.create_server((host, port), family=family, backlog=1024)
    except OSError as exc:
        raise click.ClickException(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    effective_host, effective_port = listener.getsockname()[:2]
    base = f"http://{effective_host if family != socket.AF_INET6 else f'[{effective_host}]'}:{effective_port}"

    def serve_here(ui_worker: bool) -> None:
        try:
            app = create_app({} if ui_worker else {"ui_worker": False}, route_id_wait_s=1.0 if workers > 1 else 0.0)
        except SettingsError as exc:
            raise click.ClickException(str(exc)) from None
        server = waitress.create_server(app, sockets=[listener], threads=threads, ident="specroute",
                                        max_request_body_size=app.config["MAX_CONTENT_LENGTH"] + 1)
        try:
            server.run()
        except KeyboardInterrupt:
            pass
        finally:
            server.close()
            app.extensions["specroute.close"]()

    processes = "" if workers == 1 else f", {workers} processes"
    click.echo(f"specroute serving on {base} ({threads} threads{processes}); Ctrl-C stops", err=True)
    for line in urls or [f"web UI: {base}/", f"API: {base}/v1/route (OpenAPI at {base}/openapi.json)"]:
        click.echo("  " + line.replace("{base}", base), err=True)
    if workers == 1:
        import signal

        signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM stops as Ctrl-C does: logs flushed
        serve_here(ui_worker=True)
        return
    _supervise(serve_here, workers)


def _supervise(serve_here, workers: int) -> None:
    """Fork ``workers`` server processes on the shared listening socket and keep them running: one
    that dies is started again (unless it died within 10 s of its start: then all stop, exit 1);
    Ctrl-C or SIGTERM stops them all. Only the first runs the analysis worker thread."""
    import signal
    import time

    def start(index: int) -> int:
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                signal.signal(signal.SIGTERM, signal.default_int_handler)
                serve_here(ui_worker=index == 0)
            except BaseException as exc:  # noqa: BLE001 - a child never returns into the parent's code
                if not isinstance(exc, KeyboardInterrupt):
                    click.echo(f"specroute server process {index}: {exc}", err=True)
                    code = 1
            finally:
                os._exit(code)
        return pid

    children = {start(i): (i, time.monotonic()) for i in range(workers)}
    stopping = []

    def stop(*_args) -> None:
        stopping.append(True)
        for pid in children:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    signal.signal(signal.SIGTERM, stop)
    failed = False
    try:
        while children:
            try:
                pid, status = os.wait()
            except KeyboardInterrupt:
                stop()
                continue
            except ChildProcessError:
                break
            index, started = children.pop(pid, (None, 0.0))
            if index is None or stopping:
                continue
            click.echo(f"specroute server process {index} (pid {pid}) exited with status {status}", err=True)
            if time.monotonic() - started < 10:
                click.echo("it died within 10 s of its start; stopping every server process", err=True)
                failed = True
                stop()
            else:
                children[start(index)] = (index, time.monotonic())
    finally:
        if children:
            stop()
    if failed:
        raise SystemExit(1)
