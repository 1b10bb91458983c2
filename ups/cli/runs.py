"""Commands that read and act on runs: ``runs``, ``status``, ``kill``, ``stacks``, ``logs``.

Thin: resolve the run, build a :class:`~ups.runs.view.RunView`, render or act through
:mod:`ups.runs.signals`. Never imports torch, textual, wandb or h5py.
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
    fmt_attempt,
    fmt_bytes,
    fmt_duration,
    fmt_metric,
    fmt_progress,
    fmt_rate,
)

commands = typer.Typer()  # registered by ups.cli.app, the root

if TYPE_CHECKING:  # the run/status modules load only when a command runs (fast --help)
    from rich.text import Text

    from ups.runs.rundir import RunDir
    from ups.runs.view import NodeView, ProcessView, RunView
    from ups.status.record import StatusRecord

WideOption = Annotated[
    bool, typer.Option("--wide", help="Every column whole, one line per row however long (for a pipe or a wide terminal).")
]
RankOption = Annotated[int | None, typer.Option("--rank", "-r", help="Rank to target (default: see command).")]
WorkerOption = Annotated[
    int | None, typer.Option("--worker", "-w", help="DataLoader worker id of that rank (rank 0 if no --rank).")
]


def _console(stderr: bool = False):  # rich is imported lazily: ~30 ms we only pay when drawing
    return text_console(stderr)


# ---------------------------------------------------------------------------------- runs
def run_row(view: RunView, now: float) -> dict:
    m = view.manifest or {}
    step, total = view.progress
    worst = view.worst
    created = m.get("created_at")
    return {
        "id": view.run_id,
        "path": str(view.run.path),
        "kind": m.get("kind"),
        "state": view.state,
        "supervision": view.supervision,
        "created_at": created,
        "ended_at": m.get("ended_at"),
        "age": None if created is None else round(now - created, 1),
        "step": step,
        "total": total,
        "unit": view.unit,
        "rate": view.rate,
        "health": None if worst is None else worst.health.value,
        "reason": None if worst is None else worst.reason,
        "summary": m.get("summary"),
        "problem": view.manifest_problem,
        "unreadable_records": [f"{p.file}: {p.problem}" for p in view.problems],
    }


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
            table.add_row(r["id"], Text("unreadable", "red"), fmt_age(r["age"]), "-", _one_line(Text(r["problem"], "red")))
            continue
        health = r["health"] or "-"
        cell = Text(health, HEALTH_STYLES.get(health, ""))
        if r["reason"] and health not in ("ok", "done"):
            cell.append(f" {r['reason']}", "dim")
        state = r["state"] or "?"
        progress = fmt_progress(r["step"], r["total"])
        if r["rate"] and state == "running":
            progress += f" {fmt_rate(r['rate'], r['unit'])}"
        table.add_row(r["id"], Text(state, STATE_STYLES.get(state, "")), fmt_age(r["age"]), _one_line(Text(progress)), _one_line(cell))
    _print_fitted(table, wide=wide)


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


def _one_line(text: Text) -> Text:
    """A cell that is cut short with an ellipsis instead of wrapping onto more lines."""
    text.no_wrap, text.overflow = True, "ellipsis"
    return text


def _print_fitted(renderable, *, wide: bool) -> None:
    """Print at the terminal's width (80 in a pipe); --wide: as wide as the content needs,
    one line per row however long (a terminal folds it, a pipe or a file keeps it)."""
    console = _console()
    if wide:
        console.width = max(console.width, _natural_width(console, renderable))
    console.print(renderable)


def _natural_width(console, renderable) -> int:
    from rich.measure import Measurement

    return Measurement.get(console, console.options.update(width=10_000), renderable).maximum


# -------------------------------------------------------------------------------- status
def _hint_unsupervised(views: list[RunView]) -> None:
    """The next ups command offers the takeover of a run whose launcher died."""
    for v in views:
        if v.supervision == "unsupervised":
            pid = ((v.manifest or {}).get("launcher") or {}).get("pid")
            typer.echo(f"ups: run {v.run_id} lost its launcher (pid {pid}) and runs on unsupervised; "
                       f"`ups adopt {v.run_id}` takes it over", err=True)


def status_payload(view: RunView, gpu_by_pid: dict[int, int] | None = None) -> dict:
    processes = []
    for p in view.processes:
        row = p.to_dict()
        used = (gpu_by_pid or {}).get(p.record.pid)
        if used is not None:
            row["gpu"] = dict(row["gpu"] or {"device": None, "allocated": None, "reserved": None, "peak": None})
            row["gpu"]["nvml_used"] = used
        processes.append(row)
    step, total = view.progress
    return {
        "run": view.manifest,
        "state": view.state,
        "supervision": view.supervision,
        "run_dir": str(view.run.path),
        "manifest_problem": view.manifest_problem,
        "progress": {"step": step, "total": total, "rate": view.rate, "unit": view.unit, "eta_s": view.eta_s},
        "processes": processes,
        "nodes": [n.to_dict() for n in view.nodes],
        "unreadable": [{"file": p.file, "problem": p.problem} for p in view.problems],
        "series": series_payload(view),
        "read_at": view.read_at,
    }


def series_payload(view: RunView) -> dict:
    """Each process's metrics series (ups.status.series), points as dicts; unreadable files
    named with their reason. NaN and infinities are the strings "nan", "inf", "-inf"."""
    from ups.status.series import raw_points, read_run_series

    found, problems = read_run_series(view.run.path)
    out: dict = {}
    for name, data in found.items():
        out[name] = {"attempt": data.get("attempt"), "count": data.get("count"), "stride": data.get("stride"),
                     "first_nonfinite": data.get("first_nonfinite"), "points": raw_points(data)}
    for file, problem in problems.items():
        out[file.removesuffix(".json")] = {"unreadable": problem}
    return out


def _gpu_by_pid() -> dict[int, int]:
    """NVML's used memory per pid when the GPU layer is available; empty otherwise."""
    try:
        from ups.gpu import get_provider, gpu_memory_by_pid  # type: ignore[attr-defined]
    except ImportError:
        return {}
    try:
        return gpu_memory_by_pid(get_provider().snapshot())
    except Exception:  # noqa: BLE001 - GPU info is a bonus here, never a reason to fail
        return {}


def _gpu_cell(p: ProcessView, nvml: dict[int, int]) -> str:
    g = p.record.gpu
    used = nvml.get(p.record.pid)
    parts = []
    if g is not None and g.allocated is not None:
        parts.append(f"{fmt_bytes(g.allocated)} alloc")
        if g.peak is not None:
            parts.append(f"{fmt_bytes(g.peak)} peak")
    if used is not None:
        parts.append(f"{fmt_bytes(used)} nvml")
    return ", ".join(parts) or "-"


def short_label(r: StatusRecord) -> str:
    """'launcher', 'rank 0', '  worker 3' (workers listed under their rank)."""
    return f"  worker {r.worker}" if r.role == "worker" else r.label


def _health_cell(p: ProcessView, *, reason: bool):
    from rich.text import Text

    h = p.verdict.health.value
    return _one_line(Text.assemble((h, HEALTH_STYLES.get(h, "")), (f" {p.verdict.reason}" if reason else "", "dim")))


def _progress_cell(r: StatusRecord) -> str:
    """'-' for a process that has no progress to show (the launcher supervises, it counts nothing)."""
    return "-" if r.role == "launcher" else fmt_progress(r.step, r.total)


def _has_training_metrics(view: RunView) -> bool:
    return any("loss" in p.record.metrics for p in view.processes)


def process_table(view: RunView, nvml: dict[int, int], *, reasons: bool, wide: bool = False):
    """One row per process, every cell on one line. Without ``reasons`` (a narrow terminal)
    the HEALTH column holds the word alone and never gives way; rates drop their unit (the
    header line has it) and the other long cells are cut short first. A run whose ranks have
    a loss gets a LOSS column (and LR, GNORM with ``wide``)."""
    from rich.table import Table
    from rich.text import Text

    table = Table(box=None, header_style="bold", pad_edge=False)
    yielding = ("PHASE", "PROGRESS", "RATE", "GPU") if not reasons else ("GPU", "HEALTH")
    training = _has_training_metrics(view)
    extra = (("LOSS", "loss"), ("LR", "lr"), ("GNORM", "grad_norm")) if wide else (("LOSS", "loss"),)
    extra = extra if training else ()
    columns = ["PROCESS", "PID", "PHASE", "PROGRESS", "RATE", *(c for c, _ in extra), "HB/PROG", "GPU", "HEALTH"]
    for col in columns:
        table.add_column(col, no_wrap=col not in yielding)
    for p, node in grouped_processes(view):
        if node is not None:  # a multi-node run: a heading row per node, its processes under it
            h = node.health
            table.add_row(
                Text(f"node {node.host}" + (" (here)" if node.local else ""), "bold"),
                str(node.launcher_pid or "-"), Text(node.state or "?", STATE_STYLES.get(node.state or "", "")),
                "", "", *("" for _ in extra), "", "",
                _one_line(Text.assemble((h, HEALTH_STYLES.get(h, "")), (f" {node.reason}" if reasons and h != "ok" else "", "dim"))),
            )
            continue
        r = p.record
        table.add_row(
            ("  " if view.nodes else "") + short_label(r),
            str(r.pid),
            _one_line(Text(r.phase)),
            _one_line(Text(_progress_cell(r))),
            _one_line(Text(fmt_rate(r.rate, r.unit if reasons else ""))),
            *(_metric_cell(r.metrics.get(key)) if r.role == "rank" else "" for _, key in extra),
            f"{fmt_age(p.heartbeat_age)}/{fmt_age(p.progress_age)}" if r.state == "running" else "-",
            _one_line(Text(_gpu_cell(p, nvml))),
            _health_cell(p, reason=reasons),
        )
    return table


def _metric_cell(value):
    from rich.text import Text

    text = fmt_metric(value)
    return Text(text, style="bold red" if text in ("nan", "inf", "-inf") else "")


def grouped_processes(view: RunView) -> list[tuple[ProcessView | None, NodeView | None]]:
    """The processes in order; a multi-node run's grouped by node, each group after its node."""
    if not view.nodes:
        return [(p, None) for p in view.processes]
    out: list[tuple[ProcessView | None, NodeView | None]] = []
    for node in view.nodes:
        out.append((None, node))
        out.extend((p, None) for p in view.processes if p.record.host == node.host)
    return out


def render_status(view: RunView, nvml: dict[int, int], *, width: int | None = None, wide: bool = False):
    """The run's header, one line per process, and unreadable files.

    The HEALTH column holds the word and its reason when the table fits in ``width``
    (or ``wide``); otherwise the word alone, and the reason of every process in trouble
    follows the table, one line each, whole."""
    from rich.console import Group
    from rich.text import Text

    m = view.manifest or {}
    now = view.read_at
    state = view.state or "unreadable"
    elapsed = fmt_duration((m.get("ended_at") or now) - m["created_at"]) if m.get("created_at") else "-"
    head = Text.assemble(
        (view.run_id, "bold"),
        f"  {m.get('kind', '?')}  ",
        (state, STATE_STYLES.get(state, "")),
        f"  elapsed {elapsed}",
        (fmt_attempt(m), "bold yellow"),
        f"\nprogress {fmt_progress(*view.progress)}"
        f"  {fmt_rate(view.rate, view.unit)}  eta {fmt_duration(view.eta_s)}",
    )
    parts: list = [head]
    if view.manifest_problem:
        parts.append(Text(view.manifest_problem, style="red"))
    if m.get("summary"):
        parts.append(Text(f"summary: {m['summary']}"))
    verdict = m.get("verdict") or {}
    if verdict.get("text") and not verdict.get("ok"):  # an ended run's `ups why`, kept in run.json
        parts.append(Text(f"why: {verdict['text']}"))
    table = process_table(view, nvml, reasons=True, wide=wide)
    below: list = []
    if not wide and width is not None and _natural_width(_console(), table) > width:
        table = process_table(view, nvml, reasons=False)
        for p in view.processes:
            if p.verdict.health.is_problem and p.verdict.health.value != "unreachable":  # said once per node below
                h = p.verdict.health.value
                below.append(Text.assemble(f"{p.record.label}: ", (h, HEALTH_STYLES.get(h, "")), f": {p.verdict.reason}"))
    parts.append(table)
    parts.extend(below)
    for prob in view.problems:
        parts.append(Text(f"unreadable status file {prob.file}: {prob.problem}", style="yellow"))
    for node in view.nodes:
        if not node.reachable:
            parts.append(Text(node.reason, style="bold magenta"))
    if not view.processes and not view.problems:
        parts.append(Text("no process has written a status record yet", style="dim"))
    return Group(*parts)




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
        _status_remote(rd, run if rd is None else rd.run_id, specs, json=json, watch=watch or follow, follow=follow,
                       interval=interval, wide=wide, timeout=remote_timeout)
        return
    rd = resolve_run(runs_dir, run)
    rd.read_manifest()  # a corrupt run.json is bad input here: one line, exit 2
    if follow:
        _follow_json(rd, interval)
        return
    if json:
        print_json(status_payload(open_run(rd), _gpu_by_pid()))
        return
    width = _console().width
    if not watch:
        view = open_run(rd)
        _hint_unsupervised([view])
        _print_fitted(render_status(view, _gpu_by_pid(), width=width, wide=wide), wide=wide)
        return
    from rich.live import Live

    with Live(render_status(open_run(rd), {}, width=width, wide=wide), auto_refresh=False, screen=False) as live:
        try:
            while True:
                live.update(render_status(open_run(rd), _gpu_by_pid(), width=width, wide=wide), refresh=True)
                time.sleep(interval)
        except KeyboardInterrupt:
            pass


def stream_payload(view: RunView) -> dict:
    """A ``--follow`` line: the status payload, this host's name, and the records whole (a
    reader on another node rebuilds its view from them, with the health judged here)."""
    from ups.status.host import hostname

    payload = status_payload(view)
    payload["host"] = hostname()
    payload["records"] = [p.record.to_dict() for p in view.processes]
    return payload


def _follow_json(rd: RunDir, interval: float) -> None:
    """NDJSON until the run ends (its final snapshot is the last line) or the reader goes."""
    import json as jsonlib
    import os

    from ups.runs.read import open_run

    try:
        while True:
            view = open_run(rd)
            sys.stdout.write(jsonlib.dumps(stream_payload(view), default=str, separators=(",", ":")) + "\n")
            sys.stdout.flush()
            if view.is_final:
                return
            time.sleep(interval)
    except (BrokenPipeError, KeyboardInterrupt):
        # The reader went away (ssh closed): nothing more to say, and nothing to flush at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        raise typer.Exit(0) from None


def _status_remote(rd: RunDir | None, run_id: str, specs, *, json: bool, watch: bool, follow: bool, interval: float,
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
        width = _console().width
        if not watch:
            _print_fitted(render_status(view(), {}, width=width, wide=wide), wide=wide)
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


def _relay_remote(remote: list[str], args: list[str]) -> None:
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


# ---------------------------------------------------------------------------------- kill
def select_records(view: RunView, rank: int | None, worker: int | None) -> list[StatusRecord]:
    """The records a --rank/--worker pair names; UpsError listing what exists otherwise."""
    if worker is not None:
        r = 0 if rank is None else rank
        found = [p.record for p in view.workers(r) if p.record.worker == worker]
        if not found:
            have = ", ".join(str(p.record.worker) for p in view.workers(r)) or "none"
            raise UpsError(f"run {view.run_id} has no worker {worker} of rank {r} (workers: {have})")
        return found
    if rank is not None:
        found = [p.record for p in view.ranks() if p.record.rank == rank]
        if not found:
            have = ", ".join(str(p.record.rank) for p in view.ranks()) or "none"
            raise UpsError(f"run {view.run_id} has no rank {rank} (ranks: {have})")
        return found
    return [p.record for p in view.processes]


@commands.command("kill")
def kill_cmd(
    run: Annotated[str, typer.Argument(help="Run id, unique prefix, or path.")],
    rank: RankOption = None,
    worker: WorkerOption = None,
    force: Annotated[bool, typer.Option("--force", help="SIGKILL at once instead of SIGTERM first.")] = False,
    grace: Annotated[float, typer.Option(help="Seconds between SIGTERM and SIGKILL.")] = 5.0,
    reason: Annotated[str, typer.Option(help="Why: recorded in the run's event log.")] = "operator request",
    runs_dir: RunsDirOption = default_runs_dir(),
    json: JsonOption = False,
    remote: Annotated[list[str] | None, typer.Option("--remote", metavar="HOST[:RUNS_DIR]", help="Do it on that node of a multi-node run, over SSH "
                                                                      "(HOST or HOST:RUNS_DIR, repeatable).")] = None,
) -> None:
    """Stop a run, or one rank or DataLoader worker of it.

    Only processes named by the run's records are signalled, and only when the live
    process's start time matches the record (a reused pid is refused). SIGTERM, then
    SIGKILL after --grace seconds. Without --rank/--worker the whole run is stopped and
    marked killed. Every signal is written to the run's events.jsonl.

    A multi-node run: each node's processes are signalled on that node (this node's here,
    another's with --remote NODE, through its own `ups kill`).
    """
    if remote:
        _relay_remote(remote, ["kill", run, *(["--rank", str(rank)] if rank is not None else []),
                               *(["--worker", str(worker)] if worker is not None else []), *(["--force"] if force else []),
                               "--grace", str(grace), "--reason", reason, *(["--json"] if json else [])])
        return
    from ups.runs.actions import kill_run
    from ups.runs.ownership import JobScope
    from ups.runs.read import open_run
    from ups.runs.rundir import resolve_run
    from ups.runs.signals import check_identity, terminate

    rd = resolve_run(runs_dir, run)
    JobScope.of_run(rd.path)  # not a run folder, or another user's: one line, nothing written
    view = open_run(rd)
    actor = cli_actor()
    if rank is None and worker is None:
        results = kill_run(rd, view, actor=actor, reason=reason, grace=grace, force=force)
    else:
        targets = select_records(view, rank, worker)
        for rec in targets:
            check_identity(rd, rec)  # refuse (exit 2 / 1) before anything is sent
        results = terminate(rd, targets, actor=actor, reason=reason, grace=grace, force=force)
    if json:
        print_json({"run_id": rd.run_id, "results": [r.__dict__ for r in results]})
    else:
        for r in results:
            typer.echo(f"{r.name} (pid {r.pid}): {r.outcome}")
        if not results:
            typer.echo("no live process in this run", err=True)
    if any(r.outcome.startswith(("refused", "survived")) for r in results):
        raise typer.Exit(1)


# -------------------------------------------------------------------------------- stacks
@commands.command("stacks")
def stacks_cmd(
    run: RunArgument = None,
    rank: RankOption = None,
    worker: WorkerOption = None,
    group: Annotated[bool, typer.Option("--group", help="Fold processes with the same top frames into one line each.")] = False,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for each dump.")] = 5.0,
    runs_dir: RunsDirOption = default_runs_dir(),
    json: JsonOption = False,
    remote: Annotated[list[str] | None, typer.Option("--remote", metavar="HOST[:RUNS_DIR]", help="Dump them on that node of a multi-node run, over "
                                                                      "SSH (HOST or HOST:RUNS_DIR, repeatable).")] = None,
) -> None:
    """Print where processes are stuck: every thread's Python stack.

    Live processes get the stack-dump signal their record registered (faulthandler dumps
    even while a C call holds the GIL); finished or dead ones show the last thing their
    stack file holds (a crash traceback, an earlier dump). Default: every rank and worker.

    --group folds them, as large-scale training teams read stacks: one line per distinct
    place, e.g. "ranks 0, 2-7: all_reduce at train.py:120" / "rank 1: broadcast at
    train.py:250" (the library call it is in, and the program's own frame that made it).

    A multi-node run: this node's processes; --remote NODE dumps that node's, over SSH.
    """
    if remote:
        _relay_remote(remote, ["stacks", *([run] if run else []), *(["--rank", str(rank)] if rank is not None else []),
                               *(["--worker", str(worker)] if worker is not None else []), *(["--group"] if group else []),
                               "--timeout", str(timeout), *(["--json"] if json else [])])
        return
    from ups.runs.read import open_run
    from ups.runs.rundir import resolve_run

    rd = resolve_run(runs_dir, run)
    view = open_run(rd)
    targets = [r for r in select_records(view, rank, worker) if rank is not None or worker is not None or r.role != "launcher"]
    if not targets:
        raise UpsError(f"run {rd.run_id} has no process records yet")
    texts = _collect_stacks(rd, targets, timeout)
    if group or json:
        from ups.why import stacks as stack_parse

        parsed = {rec.label: stack_parse.latest(text) for rec, (text, _) in zip(targets, texts, strict=True)}
        signatures = {label: (s.signature() if s is not None else "no stack recorded") for label, s in parsed.items()}
        groups = stack_parse.group(signatures)
        if json:
            print_json({"run_id": rd.run_id, "groups": [{"where": sig, "processes": labels} for sig, labels in groups],
                        "processes": [{"label": label, "where": sig, "frames": [str(f) for f in (parsed[label].stack if parsed[label] else ())]}
                                      for label, sig in signatures.items()]})
        else:
            for sig, labels in groups:
                typer.echo(f"{stack_parse.fold_labels(labels)}: {sig}")
        return
    failures = 0
    for rec, (text, problem) in zip(targets, texts, strict=True):
        typer.echo(f"--- {rec.label} (pid {rec.pid}, phase {rec.phase}) ---")
        if problem:
            typer.echo(f"ups: {problem}", err=True)
            failures += 1
        typer.echo(text.rstrip() if text else "(no stack dump recorded)")
    if failures:
        raise typer.Exit(1)


def _collect_stacks(rd: RunDir, targets: list[StatusRecord], timeout: float) -> list[tuple[str | None, str | None]]:
    """Each target's stacks: a fresh dump from a live process (in parallel: a run of 2,000
    processes must not take 2,000 timeouts), else the last its stack file holds."""
    from concurrent.futures import ThreadPoolExecutor

    from ups.errors import RefusedSignal
    from ups.runs.signals import dump_stacks, is_alive, last_stack_dump

    def one(rec: StatusRecord) -> tuple[str | None, str | None]:
        if rec.state == "running" and is_alive(rec):
            try:
                return dump_stacks(rd, rec, actor=cli_actor(), timeout=timeout), None
            except RefusedSignal as exc:
                return last_stack_dump(rd, rec), str(exc)
        return last_stack_dump(rd, rec), None

    with ThreadPoolExecutor(max_workers=min(16, len(targets))) as pool:
        return list(pool.map(one, targets))


# ---------------------------------------------------------------------------------- logs
@commands.command("logs")
def logs_cmd(
    run: RunArgument = None,
    rank: RankOption = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new lines until the run ends or Ctrl-C.")] = False,
    lines: Annotated[int, typer.Option("--lines", "-n", help="Lines from the end to start with.")] = 50,
    raw: Annotated[bool, typer.Option("--raw", help="The log's bytes as the program wrote them, escape sequences and all "
                                      "(by default only its colours are kept and every other control is removed).")] = False,
    runs_dir: RunsDirOption = default_runs_dir(),
) -> None:
    """Print the job's log (or one rank's with --rank).

    The program's colours are kept; any other terminal control in the log (cursor moves,
    screen clears, window titles, OSC 52 clipboard writes) is removed, so a log cannot act on
    your terminal. --raw prints the bytes as written."""
    from ups.runs.actions import find_logs
    from ups.runs.rundir import FINAL_RUN_STATES, resolve_run
    from ups.status.printable import printable, sgr_only
    from ups.status.safeio import OPEN_READ, BadFile, open_regular

    def show(data: bytes) -> None:
        if raw:
            sys.stdout.buffer.write(data)
        else:
            sys.stdout.write(sgr_only(data.decode(errors="replace")))
        sys.stdout.flush()

    rd = resolve_run(runs_dir, run)
    paths = find_logs(rd, rank)
    budget = max(1, lines) * 4096  # the last N lines, read from no more than ~4 KB a line
    for path in [*paths[1:], paths[0]]:  # a rank's stderr after its stdout, then the log itself
        main_log = path == paths[0]
        if main_log and not path.exists():
            raise UpsError(f"no log yet at {path}")
        if len(paths) > 1:
            typer.echo(f"==> {printable(path.name)} <==")
        try:  # a regular file only: a FIFO named like a log must not hang `ups logs`
            fd = open_regular(path, OPEN_READ)
        except (OSError, BadFile) as exc:
            if main_log:
                raise UpsError(f"{path}: {exc}") from None
            typer.echo(f"unreadable: {printable(path.name)}: {exc}")
            continue
        fh = os.fdopen(fd, "rb")
        fh.seek(max(0, os.fstat(fd).st_size - budget))
        tail = fh.read().splitlines(keepends=True)[-lines:]
        show(b"".join(tail) + (b"" if not tail or tail[-1].endswith((b"\n", b"\r")) else b"\n"))
        if not main_log:
            fh.close()
    with fh:
        if not follow:
            return
        pending = b""
        try:
            while True:
                chunk = fh.read()
                if chunk:  # whole lines only: an escape sequence is never cut in two
                    pending += chunk
                    cut = max(pending.rfind(b"\n"), pending.rfind(b"\r")) + 1
                    if cut:
                        show(pending[:cut])
                        pending = pending[cut:]
                    continue
                try:
                    if rd.read_manifest().get("state") in FINAL_RUN_STATES:
                        break
                except UpsError:
                    pass
                time.sleep(0.3)
        except KeyboardInterrupt:
            pass
        if pending:
            show(pending + b"\n")
