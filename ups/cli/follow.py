"""Follow a run until it ends: a live view on a terminal, plain lines otherwise.

Ctrl-C only stops following: the job runs on, detached; ``ups status RUN`` or
``ups console`` shows it again.
"""

from __future__ import annotations

import sys
import time

import typer

from ups.cli.common import text_console
from ups.format import HEALTH_STYLES, fmt_duration, fmt_progress, fmt_rate
from ups.runs.read import open_run
from ups.runs.rundir import FINAL_RUN_STATES, RunDir
from ups.runs.view import RunView

EXIT_BY_STATE = {"succeeded": 0, "partial": 3, "failed": 1, "killed": 1, "lost": 1, "ended": 1}


def follow_line(view: RunView) -> str:
    step, total = view.progress
    worst = view.worst
    health = "" if worst is None else f"  {worst.health.value}" + (f" ({worst.reason})" if worst.health.is_problem else "")
    return (
        f"{view.state or '?'}  {fmt_progress(step, total)}  {fmt_rate(view.rate, view.unit)}"
        f"  eta {fmt_duration(view.eta_s)}{health}"
    )


def _render(view: RunView, events: list[dict]):
    from rich.console import Group
    from rich.progress_bar import ProgressBar
    from rich.table import Table
    from rich.text import Text

    step, total = view.progress
    head = Text.assemble((view.run_id, "bold"), f"  {view.kind or '?'}  {view.state or '?'}")
    bar = ProgressBar(total=float(total or 1), completed=float(step), width=50)
    stats = Text(f"{fmt_progress(step, total)}  {fmt_rate(view.rate, view.unit)}  eta {fmt_duration(view.eta_s)}")
    table = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("PROCESS", "PID", "PHASE", "ITEM", "DONE", "HEALTH"):
        table.add_column(col, no_wrap=col != "HEALTH")
    procs = [p for p in view.processes if p.record.role != "launcher"]
    for p in procs[:12]:
        r, h = p.record, p.verdict.health.value
        table.add_row(r.label, str(r.pid), r.phase, r.item or "-", str(r.step),
                      Text.assemble((h, HEALTH_STYLES.get(h, "")), (f" {p.verdict.reason}" if p.verdict.health.is_problem else "", "dim")))
    if len(procs) > 12:
        table.add_row(f"... {len(procs) - 12} more", "", "", "", "", "")
    recent = [Text(f"{time.strftime('%H:%M:%S', time.localtime(e.get('ts', 0)))} {e.get('event')}: "
                   f"{e.get('reason') or e.get('summary') or e.get('sample') or e.get('error') or ''}", style="dim")
              for e in events if e.get("event") not in ("launch", "start", "control.handled", "plan", "loader.start", "signal")][-5:]
    return Group(head, bar, stats, table, *recent)


def _sleep_unless_ended(run: RunDir, seconds: float, step: float = 0.05) -> None:
    """Sleep up to ``seconds``, returning early once run.json says the run ended: the command
    exits as soon as the run does (a 0.5 s render interval alone added up to 0.5 s to every
    followed launch). run.json is read only when its mtime changes."""
    deadline = time.monotonic() + seconds
    seen = None
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(step, left))
        try:
            mtime = run.manifest_path.stat().st_mtime_ns
        except OSError:
            continue
        if mtime != seen:
            seen = mtime
            try:
                if run.read_manifest().get("state") in FINAL_RUN_STATES:
                    return
            except Exception:  # noqa: BLE001 - a manifest being replaced: the next view says
                continue


def _with_verdict(run: RunDir, seconds: float = 10.0) -> dict:
    """run.json once the launcher has written the ended run's verdict beside its state (it does
    right after the state: a caller that reads run.json when we return must find both), or
    when the launcher is gone, or after ``seconds``."""
    from ups.status.procs import is_zombie, process_start_time

    deadline = time.monotonic() + seconds
    while True:
        m = run.read_manifest()
        pid = (m.get("launcher") or {}).get("pid")
        gone = not isinstance(pid, int) or process_start_time(pid) is None or is_zombie(pid)
        if "verdict" in m or gone or time.monotonic() > deadline:
            return m
        time.sleep(0.05)


def follow_run(run: RunDir, *, interval: float = 0.5, live: bool | None = None) -> int:
    """Watch ``run`` until its state is final; the exit code its state maps to."""
    live = sys.stdout.isatty() if live is None else live
    typer.echo(f"run {run.run_id} ({run.path}); Ctrl-C stops following, the job keeps running", err=True)
    try:
        if live:
            from rich.live import Live

            view = open_run(run)  # the first frame's read is the loop's first read too
            with Live(_render(view, []), refresh_per_second=4, transient=False, console=text_console(stderr=True)) as lv:
                while True:
                    lv.update(_render(view, run.read_events(limit=50)))
                    if view.is_final:
                        break
                    _sleep_unless_ended(run, interval)
                    view = open_run(run)
        else:
            last = 0.0
            while True:
                view = open_run(run)
                if view.is_final:
                    break
                if time.monotonic() - last >= 2.0:
                    typer.echo(follow_line(view), err=True)  # progress is diagnostics: stdout stays data
                    last = time.monotonic()
                _sleep_unless_ended(run, interval)
    except KeyboardInterrupt:
        typer.echo(f"\nstopped following; the job runs on. `ups status {run.run_id}` or `ups console` shows it.", err=True)
        return 0
    m = _with_verdict(run)
    state = m.get("state")
    typer.echo(f"{run.run_id}: {state}: {m.get('summary') or ''}".rstrip(": "), err=True)
    return EXIT_BY_STATE.get(state or "", 1) if state in FINAL_RUN_STATES else 1
