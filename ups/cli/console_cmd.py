"""``ups console``: the dashboard (Textual is imported only when it runs)."""

from __future__ import annotations

from typing import Annotated

import typer

from ups.cli.common import RunsDirOption, default_runs_dir, remote_option

commands = typer.Typer()  # registered by ups.cli.app, the root


@commands.command("console")
def console_cmd(
    run: Annotated[str | None, typer.Argument(help="Open this run directly (id or prefix).")] = None,
    refresh: Annotated[float, typer.Option("--refresh", help="Seconds between reads of the status folder.")] = 1.0,
    readonly: Annotated[bool, typer.Option("--readonly", help="Watch only: no kill, stacks, fallback, launch or attach.")] = False,
    runs_dir: RunsDirOption = default_runs_dir(),
    remote: Annotated[list[str] | None, remote_option("Another node of a multi-node run whose records live there, read over SSH: HOST or "
                         "HOST:RUNS_DIR (repeatable). Its processes join the run's screen, grouped by node; kill and "
                         "stacks on them go to that node's ups over the same SSH.")] = None,
) -> None:
    """The live dashboard: every run, every rank and DataLoader worker with its health,
    GPU memory and where it is stuck; kill, dump stacks, fall back to num_workers=0, launch.

    Keys are in the footer (and the command palette, ctrl+p). Closing the console never
    stops a job; reopening shows the same runs.

    The runs list also shows the PyTorch jobs of this host that ups does not watch (`ups
    attach --scan`, every 10 s), marked "not launched by ups"; a attaches the selected one,
    after a confirmation that lists its processes (see `ups attach`).

    A run across nodes shows every node's processes under its node: from a shared runs
    folder as it is, or with --remote for nodes that keep their records to themselves:

    \b
        ups console exp7 --remote node1 --remote node2:/scratch/runs
    """
    from ups.errors import UpsError

    if refresh <= 0:
        raise UpsError("--refresh must be > 0 seconds")
    specs = None
    if remote:
        from ups.runs.remote import RemoteSpec

        specs = [RemoteSpec.parse(r) for r in remote]
    run_id = None
    if run:
        from ups.runs.rundir import resolve_run

        run_id = resolve_run(runs_dir, run).run_id
    from console.app import run_console

    run_console(runs_dir, run_id=run_id, readonly=readonly, refresh=refresh, remotes=specs)
