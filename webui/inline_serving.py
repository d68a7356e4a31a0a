"""waitress answering the router's quick requests on the thread that read them.

waitress reads every request on its I/O thread and hands it to a worker thread, which runs the app and wakes the
I/O thread again to send the answer. For ``POST /v1/route`` that round trip costs more than the decision: with
eight workers and sixteen clients the threads queue for the GIL behind each other, and a profile of the server
under load found no thread holding the GIL at about half of its instants (benchmarks/profile_router.py). A
request the app says it answers from memory (:func:`router.serve.api.answers_in_memory`: a route decision
whose router is loaded and not due to be checked against the database) is answered by the I/O thread as soon
as it is read, and its answer sent at once; every other request (pages, feedback, the front door, a decision
whose router must look at the database first, a request pipelined behind another) goes to a worker thread as
before. The answer, its headers and errors are the app's either way: the same WSGI call, made on another
thread.

waitress has no hook for this; :func:`answer_quick_requests` sets a channel class and wraps the server's
``add_task`` on the server :func:`waitress.create_server` returned, through what waitress 3's ``HTTPChannel``
and ``BaseWSGIServer`` define (``received``, ``service``, ``handle_write``, ``requests``, ``add_task``,
``channel_class``); tests/test_inline_serving.py serves real connections through it, kept-alive and pipelined.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from waitress.channel import HTTPChannel

if TYPE_CHECKING:
    from flask import Flask

Quick = Callable[[str, str], bool]  # (method, path) -> whether the app answers it from memory


class InlineChannel(HTTPChannel):
    """A connection whose quick requests are answered on the I/O thread: while :meth:`received` parses what
    the client sent, the server's ``add_task`` (:func:`answer_quick_requests`) marks a quick request instead of
    queueing it, and once the parsing is done (outside the channel's lock, which :meth:`service` takes) the
    request is served here and its answer written out."""

    quick: Quick = staticmethod(lambda method, path: False)  # set per server by answer_quick_requests
    reading = False  # True while received() parses, on the I/O thread
    due = False  # a quick request was read and waits to be served here

    def received(self, data: bytes) -> bool:
        self.reading, self.due = True, False
        try:
            accepted = super().received(data)
        finally:
            self.reading = False
        if self.due:
            self.due = False
            self.service()  # a request read behind this one goes to a worker (add_task while not reading)
            self.handle_write()  # send the answer now rather than on the loop's next turn
        return accepted


def answer_quick_requests(server: Any, quick: Quick) -> None:
    """Make ``server`` (what :func:`waitress.create_server` returned for one listening socket) answer the
    requests ``quick`` names on its I/O thread (:class:`InlineChannel`); the others go to its workers."""
    channel = type("QuickChannel", (InlineChannel,), {"quick": staticmethod(quick)})
    server.channel_class = channel
    queue = server.add_task

    def add_task(task: HTTPChannel) -> None:
        request = task.requests[0] if task.requests else None
        if (
            isinstance(task, InlineChannel)
            and task.reading
            and request is not None
            and not request.error
            and quick(request.command, request.path)
        ):
            task.due = True
        else:
            queue(task)

    server.add_task = add_task


def serve_with_waitress(app: Flask, sockets: list, threads: int):
    """waitress for ``app`` on bound ``sockets`` (one), ``threads`` worker threads, the app's body limit,
    and the route decisions the router answers from memory answered on the I/O thread
    (:func:`answer_quick_requests`): one process's server, alone (``specroute serve``) or in each of
    gunicorn's workers (webui/prefork.py). Not started."""
    import waitress

    from router.serve.api import EXTENSION, answers_in_memory

    server = waitress.create_server(
        app,
        sockets=sockets,
        threads=threads,
        ident="specroute",
        max_request_body_size=app.config["MAX_CONTENT_LENGTH"] + 1,
    )
    answer_quick_requests(server, answers_in_memory(app.extensions[EXTENSION]))
    return server
