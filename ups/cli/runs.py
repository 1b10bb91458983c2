"""``ups runs`` and ``ups status``: what runs there are, and each process of one run.

Thin: resolve the run, read it through :func:`ups.runs.read.open_run` (reading never writes;
``ups runs --settle`` does, when asked), render (:mod:`ups.cli.tables`) or print the
``--json`` contract (:mod:`ups.runs.payload`). Never imports torch, textual, wandb or h5py.
"""

from __future__ import annotations

import os
import sys
import time
from typing import TYPE_CHECKING, Annotated

import typer

from ups.cli.common import (
    JsonOption,
    RemoteOption,
    RunArgument,
    RunsDirOption,
    WideOption,
    cli_actor,
    default_runs_dir,
    print_json,
    say_error,
    text_console,
)
from ups.errors import UpsError
from ups.format import (
    HEALTH_STYLES,
    STATE_STYLES,
    fmt_age,
    fmt_progress,
    fmt_rate,
)
from ups.runs.payload import gpu_by_pid, run_row, status_payload, stream_payload

if TYPE_CHECKING:  # the run/status modules load only when a command runs (fast --help)

    from ups.runs.rundir import RunDir
    from ups.runs.view import RunView

from ups.cli.remote import status_remote
from ups.cli.tables import one_line, print_fitted, render_status

commands = typer.Typer()  # registered by ups.cli.app, the root


@commands.command("runs")
def runs_cmd(
    ctx: typer.Context,
    runs_dir: RunsDirOption = default_runs_dir(),
    json: JsonOption = False,
    wide: WideOption = False,
    settle: Annotated[bool, typer.Option("--settle", help="Write down the end of every run of yours that nobody is left "
                                         "to finish (its launcher and every process gone: a reboot, a kill -9): the "
                                         "state every reader already shows, with a 'reconcile' event and its verdict.")] = False,
) -> None:
    """List runs, newest first: kind, state, age, progress, throughput, worst health.

    One line per run: what does not fit the terminal is cut short (--wide shows it all).
    A run folder whose run.json is missing or corrupt is listed with its problem. A runs
    folder named with --runs-dir or UPS_RUNS_DIR must exist; the default ./runs may not yet.

    Reading never writes: a run whose launcher died after its job ended is shown with the
    end its records tell ("launcher lost ..."); --settle writes that end into its run.json.
    """
    from ups.runs.read import open_run
    from ups.runs.rundir import list_runs

    # By name: typer vendors its own click, whose ParameterSource is not click's.
    source = ctx.get_parameter_source("runs_dir")
    implicit = getattr(source, "name", None) == "DEFAULT"
    now = time.time()
    summaries = list_runs(runs_dir, missing_ok=implicit)
    if settle:
        _settle_runs(summaries)
    views = [open_run(s.run, now=now) for s in summaries]
    rows = [run_row(v, now) for v in views]
    _hint_unsupervised(views)
    if json:
        print_json({"runs_dir": str(runs_dir), "runs": rows})
        return
    if not rows:
        typer.echo(f"no runs under {runs_dir} (start one with `ups demo` or `ups launch`)", err=True)
        return
    from rich.table import Table
    from rich.text import Text

    table = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("RUN", "STATE", "AGE", "PROGRESS", "HEALTH"):
        # PROGRESS and HEALTH give way when the terminal is narrow; their cells never wrap.
        table.add_column(col, no_wrap=col not in ("PROGRESS", "HEALTH"))
    for r in rows:
        if r["problem"]:
            table.add_row(r["id"], Text("unreadable", "red"), fmt_age(r["age"]), "-", one_line(Text(r["problem"], "red")))
            continue
        health = r["health"] or "-"
        cell = Text(health, HEALTH_STYLES.get(health, ""))
        if r["reason"] and health not in ("ok", "done"):
            cell.append(f" {r['reason']}", "dim")
        state = r["state"] or "?"
        progress = fmt_progress(r["step"], r["total"])
        if r["rate"] and state == "running":
            progress += f" {fmt_rate(r['rate'], r['unit'])}"
        table.add_row(r["id"], Text(state, STATE_STYLES.get(state, "")), fmt_age(r["age"]), one_line(Text(progress)), one_line(cell))
    print_fitted(table, wide=wide)


def _settle_runs(summaries: list) -> None:
    """``ups runs --settle``: each run nobody is left to finish, written down (one line each
    on stderr); another user's run or a folder that cannot be written is said, not fatal."""
    from ups.errors import Refused
    from ups.launch.reconcile import write_settled

    for s in summaries:
        if s.problem:
            continue
        try:
            done = write_settled(s.run, actor=cli_actor())
        except (Refused, OSError, UpsError) as exc:
            say_error(f"{s.run_id}: not settled: {exc}")
            continue
        if done is not None:
            m = done.manifest or {}
            typer.echo(f"settled {s.run_id}: {m.get('state')}: {m.get('summary')}", err=True)


def _hint_unsupervised(views: list[RunView]) -> None:
    """The next ups command offers the takeover of a run whose launcher died."""
    for v in views:
        if v.supervision == "unsupervised":
            pid = ((v.manifest or {}).get("launcher") or {}).get("pid")
            typer.echo(f"ups: run {v.run_id} lost its launcher (pid {pid}) and runs on unsupervised; "
                       f"`ups adopt {v.run_id}` takes it over", err=True)


@commands.command("status")
def status_cmd(
    run: RunArgument = None,
    runs_dir: RunsDirOption = default_runs_dir(),
    json: JsonOption = False,
    wide: WideOption = False,
    watch: Annotated[bool, typer.Option("--watch", help="Redraw every second until Ctrl-C.")] = False,
    interval: Annotated[float, typer.Option(help="Seconds between redraws with --watch, or snapshots with --follow.")] = 1.0,
    follow: Annotated[bool, typer.Option("--follow", help="With --json: one snapshot per line (NDJSON) every --interval "
                                                          "until the run ends (what --remote reads over SSH).")] = False,
    remote: RemoteOption = None,
    remote_timeout: Annotated[float, typer.Option("--remote-timeout", help="Seconds to wait for each --remote node's first "
                                                                           "snapshot; a node silent longer is unreachable.")] = 10.0,
) -> None:
    """One row per process of a run (launcher, ranks, DataLoader workers) with its health.

    Health is a word and a reason: starting, ok, slow (below half the peers' median rate),
    stalled (heartbeat alive, no progress), unresponsive (no heartbeat, pid alive: blocked
    in a C call or stopped), dead (pid gone or reused), unreachable (another node whose
    every process went silent at once, or whose SSH stream ended), done, failed. Each
    process stays on one line; when the reasons do not fit the terminal, the reasons of
    processes in trouble follow the table (--wide keeps every reason in its row).

    A run across nodes is shown node by node: from a shared runs folder as it is, or with
    --remote NODE for each node whose records live on that node only:

    \b
        ups status exp7 --remote node1 --remote node2:/scratch/runs

    --json prints {"run": manifest, "processes": [...], "nodes": [...]} (schema in
    docs/status-json.md); --json --follow prints one such snapshot per line.
    """
    from ups.errors import RunNotFound
    from ups.runs.read import open_run
    from ups.runs.rundir import resolve_run

    if follow and not json:
        raise UpsError("--follow streams JSON lines: add --json (--watch redraws the table)")
    if interval <= 0:
        raise UpsError("--interval must be > 0 seconds")
    if remote:
        from ups.runs.remote import RemoteSpec

        specs = [RemoteSpec.parse(r) for r in remote]
        try:
            rd = resolve_run(runs_dir, run)
        except (RunNotFound, UpsError):
            if not run:
                raise
            rd = None  # a run none of whose nodes is this host: every node is read remotely
        status_remote(rd, run if rd is None else rd.run_id, specs, json=json, watch=watch or follow, follow=follow,
                       interval=interval, wide=wide, timeout=remote_timeout)
        return
    rd = resolve_run(runs_dir, run)
    rd.read_manifest()  # a corrupt run.json is bad input here: one line, exit 2
    if follow:
        _follow_json(rd, interval)
        return
    if json:
        print_json(status_payload(open_run(rd), gpu_by_pid()))
        return
    width = text_console().width
    if not watch:
        view = open_run(rd)
        _hint_unsupervised([view])
        print_fitted(render_status(view, gpu_by_pid(), width=width, wide=wide), wide=wide)
        return
    from rich.live import Live

    with Live(render_status(open_run(rd), {}, width=width, wide=wide), auto_refresh=False, screen=False) as live:
        try:
            while True:
                live.update(render_status(open_run(rd), gpu_by_pid(), width=width, wide=wide), refresh=True)
                time.sleep(interval)
        except KeyboardInterrupt:
            pass


def _follow_json(rd: RunDir, interval: float) -> None:
    """NDJSON until the run ends (its final snapshot is the last line) or the reader goes."""
    import json as jsonlib

    from ups.runs.read import open_run

    sent: dict[str, tuple] = {}  # the stack files this stream has sent, as they were
    try:
        while True:
            view = open_run(rd)
            sys.stdout.write(jsonlib.dumps(stream_payload(view, sent), default=str, separators=(",", ":")) + "\n")
            sys.stdout.flush()
            if view.is_final:
                return
            time.sleep(interval)
    except (BrokenPipeError, KeyboardInterrupt):
        # The reader went away (ssh closed): nothing more to say, and nothing to flush at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        raise typer.Exit(0) from None
