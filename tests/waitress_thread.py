"""A real waitress server on a free port, in a thread of the test's process, and its clean stop."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

import waitress

from webui.inline_serving import Quick, answer_quick_requests, serve_with_waitress


@contextlib.contextmanager
def waitress_in_a_thread(
    app, threads: int = 4, quick: Quick | None = None, as_served: bool = False
) -> Iterator[str]:
    """Serve ``app`` with waitress on 127.0.0.1 and a free port, in a thread named ``waitress-io``; yields its
    base URL. ``quick``: the requests its I/O thread answers (webui/inline_serving.py); ``as_served``: the
    server ``specroute serve`` builds for a specroute app, in one process or each of its workers
    (``serve_with_waitress``: the app's own limits and quick requests). On the way out every
    socket of the server is closed in the server's own loop (the listener, kept-alive connections, its
    trigger), so the loop ends at once: closing the listener from this thread instead left the loop
    polling a browser's kept-alive connections until the join gave up (5 s) and raced its ``select()``
    (EBADF)."""
    if as_served:
        server = serve_with_waitress(app, [socket.create_server(("127.0.0.1", 0))], threads)
    else:
        server = waitress.create_server(app, host="127.0.0.1", port=0, threads=threads)
    if quick is not None:
        answer_quick_requests(server, quick)
    thread = threading.Thread(target=server.run, daemon=True, name="waitress-io")
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.effective_port}"
    finally:

        def close_every_socket() -> None:
            for channel in list(server._map.values()):  # waitress keeps its sockets there
                channel.close()

        server.trigger.pull_trigger(close_every_socket)
        thread.join(timeout=5)
        server.task_dispatcher.shutdown()
