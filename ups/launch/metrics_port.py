"""``ups launch --metrics-port``: the launcher serves its own run's metrics (those of ``ups
exporter``, for this run only) from a daemon thread, for as long as it runs.

The endpoint only reads (ups.exporter); where it cannot be had (the port was taken between
the launch's check and now) the job runs all the same and the event log says why.
"""

from __future__ import annotations

from typing import Any

from ups.runs.rundir import RunDir


def start_metrics_endpoint(run: RunDir, manifest: dict[str, Any], *, actor: str) -> Any:
    """Serve ``run``'s metrics where run.json's ``metrics`` says (None when it says nothing);
    the server, or None. Each outcome is an event: ``metrics`` with the URL or the problem."""
    where = manifest.get("metrics")
    if not isinstance(where, dict):
        return None
    from ups.errors import UpsError
    from ups.exporter.address import parse_address

    try:
        bind, port = parse_address(f"{where.get('bind') or ''}:{where.get('port')}")
        from ups.exporter.collector import RunsCollector
        from ups.exporter.server import serve

        server, _ = serve(RunsCollector(run=run), port, bind)
    except (UpsError, ImportError) as exc:
        run.append_event("metrics", actor=actor, result=f"not served: {exc}")
        return None
    host = f"[{bind}]" if ":" in bind else bind
    run.append_event("metrics", actor=actor, result="serving", url=f"http://{host}:{server.server_port}/metrics")
    return server
