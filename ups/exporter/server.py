"""The HTTP endpoint: each GET reads the runs through the collector and answers the text.

It answers a GET of any path with the metrics (``/metrics`` is the one to scrape), nothing
else, and reads only: nothing a request says changes what is read or written. Requests are
served one thread each (prometheus_client's threading WSGI server); nothing runs between them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client.exposition import ThreadingWSGIServer

from ups.errors import UpsError
from ups.exporter.address import DEFAULT_BIND
from ups.exporter.collector import RunsCollector
from ups.exporter.text import CONTENT_TYPE, exposition


class QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # the base class's name
        """No line on stderr per scrape."""


def metrics_app(collector: RunsCollector) -> Callable[..., Iterable[bytes]]:
    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("REQUEST_METHOD") != "GET":
            start_response("405 Method Not Allowed", [("Allow", "GET"), ("Content-Type", "text/plain")])
            return [b"the metrics endpoint only reads: GET /metrics\n"]
        body = exposition(collector.collect())
        start_response("200 OK", [("Content-Type", CONTENT_TYPE), ("Content-Length", str(len(body)))])
        return [body]

    return app


def serve(collector: RunsCollector, port: int, bind: str = DEFAULT_BIND) -> tuple[Any, threading.Thread]:
    """Serve ``collector`` on ``bind:port`` from a daemon thread; (server, thread). A port
    that cannot be had is an UpsError that names it (exit 2)."""
    server_class = ThreadingWSGIServer
    if ":" in bind:
        import socket

        class V6(ThreadingWSGIServer):
            address_family = socket.AF_INET6

        server_class = V6
    try:
        server = make_server(bind, port, metrics_app(collector), server_class, handler_class=QuietHandler)
    except OSError as exc:
        raise UpsError(f"cannot serve metrics on {bind}:{port}: {exc.strerror or exc}") from None
    thread = threading.Thread(target=server.serve_forever, name="ups-metrics", daemon=True)
    thread.start()
    return server, thread
