"""``ups fallback`` and ``ups relaunch``: the operator's ways out of hung DataLoader workers."""

from __future__ import annotations

import time
from typing import Annotated

import typer

from ups.cli.common import JsonOption, RunsDirOption, cli_actor, default_runs_dir, print_json

commands = typer.Typer()  # registered by ups.cli.app, the root


@commands.command("fallback")
def fallback_cmd(
    run: Annotated[str, typer.Argument(help="Run id, unique prefix, or path.")],
    wait: Annotated[float, typer.Option(help="Seconds to wait for the job to acknowledge.")] = 10.0,
    runs_dir: RunsDirOption = default_runs_dir(),
    json: JsonOption = False,
) -> None:
    """Make a running precompute drop its DataLoader workers and go on in-process.

    Writes a control request that the job's watchdog picks up within about a second; the
    remaining samples are read by the main process (num_workers=0), nothing is lost. Exit 1
    when the job did not acknowledge within --wait seconds. For a program of your own, use
    `ups relaunch RUN --num-workers 0`.
    """
    from ups.runs.actions import request_fallback
    from ups.runs.rundir import resolve_run

    rd = resolve_run(runs_dir, run)
    path = request_fallback(rd, actor=cli_actor())
    deadline = time.monotonic() + wait
    done = path.with_suffix(".done")
    while time.monotonic() < deadline and not done.exists():
        time.sleep(0.1)
    acked = done.exists()
    if json:
        print_json({"run_id": rd.run_id, "request": path.name, "acknowledged": acked})
    else:
        typer.echo(f"{rd.run_id}: " + ("the job is falling back to num_workers=0" if acked else f"no acknowledgement within {wait:g} s (is the job alive? `ups status {rd.run_id}`)"))
    if not acked:
        raise typer.Exit(1)


@commands.command("relaunch")
def relaunch_cmd(
    run: Annotated[str, typer.Argument(help="Run id, unique prefix, or path.")],
    num_workers: Annotated[int | None, typer.Option("--num-workers", help="Force every DataLoader of the new run to this many workers (0: load in the main process).")] = None,
    grace: Annotated[float, typer.Option(help="Seconds between SIGTERM and SIGKILL when the run is still alive.")] = 5.0,
    detach: Annotated[bool, typer.Option("--detach", help="Start the new run and return at once.")] = False,
    runs_dir: RunsDirOption = default_runs_dir(),
    json: JsonOption = False,
) -> None:
    """Run a run's command again as a new run (stopping the old one first if it is alive).

    With --num-workers 0 every DataLoader of the new run loads in its main process (the
    instrumentation overrides num_workers and drops persistent_workers / prefetch_factor):
    the way out when workers hang or die and the program is not yours to change. A
    precompute resumes from its cache. Both runs record the relaunch in their events.

    Only a run of yours is relaunched: its folder and run.json must be yours and writable by
    no one else (a run another user put in a shared runs folder is refused, with whose it
    is). The command that will run is printed first.
    """
    from ups.cli.launch import start_and_follow
    from ups.launch.relaunch import plan_relaunch, relaunch
    from ups.runs.rundir import resolve_run

    rd = resolve_run(runs_dir, run)
    plan = plan_relaunch(rd, num_workers=num_workers)
    typer.echo(f"relaunching {rd.run_id} as a new run: {plan.shown()}", err=True)
    new = relaunch(rd, str(runs_dir), num_workers=num_workers, actor=cli_actor(), grace=grace, plan=plan)
    start_and_follow(new, detach=detach, json_out=json)


@commands.command("adopt")
def adopt_cmd(
    run: Annotated[str, typer.Argument(help="Run id, unique prefix, or path.")],
    detach: Annotated[bool, typer.Option("--detach", help="Adopt and return at once.")] = False,
    runs_dir: RunsDirOption = default_runs_dir(),
    json: JsonOption = False,
) -> None:
    """Give a run whose launcher died a new supervisor.

    When a run's launcher is killed (the OOM killer, kill -9) its job runs on, unsupervised:
    `ups runs` and `ups status` show it so. `ups adopt` starts a new launcher that watches
    every process of the job to its end and writes the run's final state. A run whose
    processes have all ended needs no adopting: any ups command settles it from its records.
    Exit 1 when there is nothing to adopt.
    """
    from ups.cli.launch import start_and_follow
    from ups.launch.reconcile import adopt
    from ups.runs.rundir import resolve_run

    rd = resolve_run(runs_dir, run)
    pid = adopt(rd, actor=cli_actor())
    if not json:
        typer.echo(f"{rd.run_id}: adopted by a new launcher (pid {pid})", err=True)
    start_and_follow(rd, detach=detach, json_out=json)
