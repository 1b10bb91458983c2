"""Where metrics are served: ``PORT`` or ``ADDRESS:PORT`` (no prometheus_client import: the
launch command checks it before anything starts)."""

from __future__ import annotations

import socket

from ups.errors import UpsError

DEFAULT_PORT = 9464
DEFAULT_BIND = "127.0.0.1"


def parse_address(text: str, default_bind: str = DEFAULT_BIND) -> tuple[str, int]:
    """``PORT`` or ``ADDRESS:PORT`` (``[::1]:PORT`` for IPv6) -> (address, port); UpsError
    naming the value otherwise."""
    bind, _, port_text = str(text).rpartition(":")
    bind = bind.strip("[]") or default_bind
    try:
        port = int(port_text)
    except ValueError:
        port = -1
    if not 1 <= port <= 65535:
        raise UpsError(f"--metrics-port {text!r}: give a port (1-65535) or ADDRESS:PORT")
    return bind, port


def check_free(bind: str, port: int) -> None:
    """UpsError naming ``bind:port`` when it cannot be listened on now (taken, not an
    address of this host), so that a launch says so before anything starts."""
    family = socket.AF_INET6 if ":" in bind else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((bind, port))
    except OSError as exc:
        raise UpsError(f"--metrics-port: cannot listen on {bind}:{port}: {exc.strerror or exc}") from None
