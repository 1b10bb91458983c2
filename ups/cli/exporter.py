"""``ups exporter``: every live run's figures on an HTTP endpoint for Prometheus."""

from __future__ import annotations

from typing import Annotated

import typer

from ups.cli.common import RunsDirOption, default_runs_dir

commands = typer.Typer()  # registered by ups.cli.app, the root


@commands.command("exporter")
def exporter_cmd(
    port: Annotated[int, typer.Option("--port", min=0, max=65535,
                                      help="TCP port to serve /metrics on (0: any free port, printed).")] = 9464,
    bind: Annotated[str, typer.Option("--bind", help="Address to listen on; 0.0.0.0 for Prometheus on another "
                                                     "host (the endpoint only reads).")] = "127.0.0.1",
    ended_kept: Annotated[float, typer.Option("--ended-kept", min=0.0, help="Seconds a run that ended is still "
                                                                           "exported (its final state, for alerts).")] = 900.0,
    all_nodes: Annotated[bool, typer.Option("--all-nodes", help="Export the processes of every node the runs folder "
                                                                "holds (one exporter for all), not only this node's.")] = False,
    runs_dir: RunsDirOption = default_runs_dir(),
) -> None:
    """Serve /metrics in the Prometheus text format for every live run of the runs folder:
    per rank the step, steps/s, samples/s, loss, learning rate, grad norm, GPU memory; per
    process its health (a state set), seconds since progress and heartbeat, its collective;
    per DataLoader worker the items fetched; per run its state, attempt, restarts and `ups
    why`'s verdict. Names, labels and series per rank: docs/monitoring.md.

    Each scrape reads the run folders as `ups status` does (nothing polls in between,
    nothing is written). One exporter per node: on a runs folder that nodes share, each
    exports its own node's processes (--all-nodes: every node's). A run that ended stays
    --ended-kept seconds.

    \b
        ups exporter --bind 0.0.0.0            # then scrape NODE:9464/metrics
        curl -s 127.0.0.1:9464/metrics | grep ups_rank_step

    Runs until SIGTERM or Ctrl-C (exit 0). Exit 2: the port cannot be had.
    """
    import signal
    import threading

    from ups.exporter.collector import RunsCollector
    from ups.exporter.server import serve

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    server, _ = serve(RunsCollector(runs_dir, ended_kept_s=ended_kept, all_nodes=all_nodes), port, bind)
    host = f"[{bind}]" if ":" in bind else bind
    typer.echo(f"serving http://{host}:{server.server_port}/metrics for the runs in {runs_dir}", err=False)
    while not stop.wait(3600):
        pass
    server.shutdown()
