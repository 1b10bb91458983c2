"""``ups fallback``: ask a live precompute to continue with num_workers=0."""

from __future__ import annotations

import time
from typing import Annotated

import typer

from ups.cli.app import app
from ups.cli.common import JsonOption, RunsDirOption, default_runs_dir, print_json
from ups.errors import UpsError


@app.command("fallback")
def fallback_cmd(
    run: Annotated[str, typer.Argument(help="Run id, unique prefix, or path.")],
    wait: Annotated[float, typer.Option(help="Seconds to wait for the job to acknowledge.")] = 10.0,
    runs_dir: RunsDirOption = default_runs_dir(),
    json: JsonOption = False,
) -> None:
    """Make a running precompute drop its DataLoader workers and go on in-process.

    Writes a control request that the job's watchdog picks up within about a second; the
    remaining samples are read by the main process (num_workers=0), nothing is lost. Exit 1
    when the job did not acknowledge within --wait seconds.
    """
    from ups.cli.runs import _actor
    from ups.runs.rundir import resolve_run

    rd = resolve_run(runs_dir, run)
    m = rd.read_manifest()
    if m.get("kind") != "precompute":
        raise UpsError(f"run {rd.run_id} is a {m.get('kind')} run; fallback applies to precompute runs")
    if m.get("state") not in ("launching", "running"):
        raise UpsError(f"run {rd.run_id} is {m.get('state')}; nothing to fall back")
    path = rd.put_control("fallback", actor=_actor())
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
