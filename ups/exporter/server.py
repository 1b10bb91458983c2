"""The HTTP endpoint: prometheus_client's server, on a registry that holds only our collector.

It answers every path with the metrics (``/metrics`` is the one to scrape) and reads only:
nothing a request says changes what is read or written.
"""

from __future__ import annotations

import threading
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server

from ups.errors import UpsError
from ups.exporter.collector import RunsCollector

DEFAULT_PORT = 9464
DEFAULT_BIND = "127.0.0.1"


def parse_address(text: str, default_bind: str = DEFAULT_BIND) -> tuple[str, int]:
    """``PORT`` or ``ADDRESS:PORT`` (``[::1]:PORT`` for IPv6) -> (address, port); UpsError
    naming the value otherwise."""
    bind, _, port_text = text.rpartition(":")
    bind = bind.strip("[]") or default_bind
    try:
        port = int(port_text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise UpsError(f"metrics port {text!r} is not a port (0-65535) or ADDRESS:PORT")
    return bind, port


def serve(collector: RunsCollector, port: int, bind: str = DEFAULT_BIND) -> tuple[Any, threading.Thread]:
    """Serve ``collector`` on ``bind:port`` from a daemon thread; (server, thread). A port
    that cannot be had is an UpsError that names it (exit 2)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    try:
        return start_http_server(port, addr=bind, registry=registry)
    except OSError as exc:
        raise UpsError(f"cannot serve metrics on {bind}:{port}: {exc.strerror or exc}") from None
