"""The read and act commands across nodes (``--remote HOST``): another node's stream merged
into this node's view, and a command run on each node over SSH with its output shown as text.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING

import typer

from ups.cli.common import (
    print_json,
    text_console,
)
from ups.runs.payload import status_payload

if TYPE_CHECKING:  # the run/status modules load only when a command runs (fast --help)

    from ups.runs.rundir import RunDir
    from ups.runs.view import RunView

from ups.cli.tables import print_fitted, render_status


def status_remote(rd: RunDir | None, run_id: str, specs, *, json: bool, watch: bool, follow: bool, interval: float,
                   wide: bool, timeout: float) -> None:
    """``ups status --remote``: this node's records (if it has the run) and every other
    node's over SSH, in one view."""
    import json as jsonlib

    from ups.runs.read import open_run
    from ups.runs.remote import open_sources, stop_sources

    sources = open_sources(specs, run_id, silent_after=timeout)
    try:
        deadline = time.monotonic() + timeout
        for src in sources:
            src.wait_first(max(0.0, deadline - time.monotonic()))

        def view() -> RunView:
            return open_run(rd, remotes=sources, run_id=run_id)

        def payload(v: RunView) -> dict:
            data = status_payload(v)
            data["remotes"] = (v.manifest or {}).get("remotes", [])
            return data

        if json and not follow:
            print_json(payload(view()))
            return
        if follow:
            while True:
                v = view()
                sys.stdout.write(jsonlib.dumps(payload(v), default=str, separators=(",", ":")) + "\n")
                sys.stdout.flush()
                if v.is_final:
                    return
                time.sleep(interval)
        width = text_console().width
        if not watch:
            print_fitted(render_status(view(), {}, width=width, wide=wide), wide=wide)
            return
        from rich.live import Live

        with Live(render_status(view(), {}, width=width, wide=wide), auto_refresh=False, screen=False) as live:
            try:
                while True:
                    live.update(render_status(view(), {}, width=width, wide=wide), refresh=True)
                    time.sleep(interval)
            except KeyboardInterrupt:
                pass
    finally:
        stop_sources(sources)


def relay_remote(remote: list[str], args: list[str]) -> None:
    """Run the same command on each --remote node over SSH; its output here, the worst exit."""
    from ups.runs.remote import RemoteSpec, remote_ups
    from ups.status.printable import printable

    worst = 0
    for spec in (RemoteSpec.parse(r) for r in remote):
        res = remote_ups(spec, *args)
        if len(remote) > 1:
            typer.echo(f"=== {spec.host} ===")
        sys.stdout.write(printable(res.stdout, lines=True))  # another node's stream is outside input too
        sys.stderr.write(printable(res.stderr, lines=True))
        if res.returncode == 255:  # ssh's own failure
            typer.echo(f"ups: node {spec.host} unreachable over ssh", err=True)
        worst = max(worst, 1 if res.returncode == 255 else res.returncode)
    if worst:
        raise typer.Exit(worst)
