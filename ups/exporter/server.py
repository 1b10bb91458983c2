"""The HTTP endpoint: prometheus_client's server, on a registry that holds only our collector.

It answers every path with the metrics (``/metrics`` is the one to scrape) and reads only:
nothing a request says changes what is read or written.
"""

from __future__ import annotations

import threading
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server

from ups.errors import UpsError
from ups.exporter.address import DEFAULT_BIND
from ups.exporter.collector import RunsCollector


def serve(collector: RunsCollector, port: int, bind: str = DEFAULT_BIND) -> tuple[Any, threading.Thread]:
    """Serve ``collector`` on ``bind:port`` from a daemon thread; (server, thread). A port
    that cannot be had is an UpsError that names it (exit 2)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    try:
        return start_http_server(port, addr=bind, registry=registry)
    except OSError as exc:
        raise UpsError(f"cannot serve metrics on {bind}:{port}: {exc.strerror or exc}") from None
