"""``ups kill``, ``ups stacks`` and ``ups logs``: acting on a run's processes and looking
into them. Every signal goes through the proof that the process is the run's
(:mod:`ups.runs.ownership`, :mod:`ups.runs.signals`).
"""

from __future__ import annotations

import os
import sys
import time
from typing import TYPE_CHECKING, Annotated

import typer

from ups.cli.common import (
    JsonOption,
    RankOption,
    RunArgument,
    RunsDirOption,
    WorkerOption,
    cli_actor,
    default_runs_dir,
    print_json,
    remote_option,
)
from ups.errors import UpsError

if TYPE_CHECKING:  # the run/status modules load only when a command runs (fast --help)

    from ups.runs.rundir import RunDir
    from ups.runs.view import RunView
    from ups.status.record import StatusRecord

from ups.cli.remote import relay_remote

commands = typer.Typer()  # registered by ups.cli.app, the root


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
    remote: Annotated[list[str] | None, remote_option("Do it on that node of a multi-node run, over SSH "
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
        relay_remote(remote, ["kill", run, *(["--rank", str(rank)] if rank is not None else []),
                               *(["--worker", str(worker)] if worker is not None else []), *(["--force"] if force else []),
                               "--grace", str(grace), "--reason", reason, *(["--json"] if json else [])])
        return
    from ups.actions import kill_run
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


@commands.command("stacks")
def stacks_cmd(
    run: RunArgument = None,
    rank: RankOption = None,
    worker: WorkerOption = None,
    group: Annotated[bool, typer.Option("--group", help="Fold processes with the same top frames into one line each.")] = False,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for each dump.")] = 5.0,
    runs_dir: RunsDirOption = default_runs_dir(),
    json: JsonOption = False,
    remote: Annotated[list[str] | None, remote_option("Dump them on that node of a multi-node run, over "
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
        relay_remote(remote, ["stacks", *([run] if run else []), *(["--rank", str(rank)] if rank is not None else []),
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
    keep = None  # an attached run's rank: its lines of the job's one log
    if rank is not None and rd.read_manifest().get("kind") == "attached" and not rd.log_path(f"rank-{rank}").exists():
        from ups.attach.logs import rank_filter

        keep = rank_filter(rd, rank)
    paths = [rd.log_path("job")] if keep else find_logs(rd, rank)
    budget = max(1, lines) * 4096 * (16 if keep else 1)  # the last N lines, read from no more than ~4 KB a line
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
        tail = [line for line in fh.read().splitlines(keepends=True) if keep is None or keep(line)][-lines:]
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
                        show(b"".join(line for line in pending[:cut].splitlines(keepends=True) if keep is None or keep(line)))
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
