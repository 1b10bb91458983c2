"""How a launcher writes its run's end: the outcome from this node's records and the job's
exit (:func:`ups.runs.kinds.finalize`), what the job left running and what its output lost,
the hang restarts (:mod:`ups.launch.restarts`), the verdict of ``ups why``, the end kept until
the disk has room, and the notification after it. A launcher whose run folder is gone says so
on stderr and syslog (:func:`say_gone`)."""

from __future__ import annotations

import errno
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from ups.launch import leftovers
from ups.launch.pending import LauncherRun
from ups.launch.restarts import Restarts
from ups.runs import space
from ups.runs.kinds import finalize
from ups.runs.outcome import End, Outcome, describe_returncode
from ups.runs.rundir import RunDir
from ups.runs.signals import signal_name
from ups.runs.view import load_run_view, node_view
from ups.status.files import append_opener

ACTOR = "launcher"
STOP_WRITE_S = 3.0  # a launcher asked to stop while its end cannot be written: how long it still tries


def write_end(run: RunDir, returncode: int | None, *, exits: dict[str, Any], survivors: list[leftovers.Leftover],
              dropped: dict[str, Any] | None, restarts: Restarts, asked_to_stop: Callable[[], bool]) -> int:
    """The run's end in run.json and the event log; the launcher's exit code."""
    disk_full = disk_full_evidence(run, dropped)
    view = node_view(load_run_view(run))  # this node's processes: each node finishes its own
    outcome = finalize(view, End(returncode, asked_to_stop(), exits, disk_full))
    if survivors:
        outcome = Outcome(outcome.state, f"{outcome.summary}; {leftovers.describe(survivors)}", outcome.failure,
                          {**outcome.extra, "leftovers": [s.__dict__ for s in survivors]})
    outcome = restarts.outcome(outcome)
    extra = dict(outcome.extra)
    summary = outcome.summary
    if dropped:
        extra["output_dropped"] = dropped
        summary += f"; {dropped['dropped']} bytes of its output could not be written to the log ({dropped.get('error') or 'see the log'})"
        run.append_event("log.dropped", actor=ACTOR, **dropped)
    run.set_state(
        outcome.state,
        exit_code=returncode if returncode is None or returncode >= 0 else None,
        signal=signal_name(-returncode) if returncode is not None and returncode < 0 else None,
        summary=summary,
        failure=outcome.failure,
        **extra,
    )
    run.append_event(
        "exit",
        actor=ACTOR,
        state=outcome.state,
        returncode=returncode,
        detail=describe_returncode(returncode),
        summary=summary,
    )
    wait_for_space(run, asked_to_stop)
    if dropped and dropped.get("error"):
        note_dropped_in_log(run, dropped)
    record_verdict(run)
    restarts.record_last(outcome.state)
    return {"succeeded": 0, "partial": 3}.get(outcome.state, 1)


def disk_full_evidence(run: RunDir, dropped: dict[str, Any] | None) -> str | None:
    """Evidence that the run folder's disk was full during the run (None: none seen)."""
    failure = getattr(run, "write_failure", None)
    if failure and failure.get("errno") in (errno.ENOSPC, errno.EDQUOT):
        return f"{failure['error']} (the launcher's writes, from {time.strftime('%H:%M:%S', time.localtime(failure['at']))})"
    if dropped and any(e in str(dropped.get("error")) + str(dropped.get("episodes"))
                       for e in (os.strerror(errno.ENOSPC), os.strerror(errno.EDQUOT))):
        return f"{dropped.get('dropped')} bytes of the job's output dropped ({os.strerror(errno.ENOSPC)})"
    return space.disk_full(run.path)


def note_dropped_in_log(run: RunDir, dropped: dict[str, Any]) -> None:
    """The relay ended while the disk was still full, so its own note never reached the
    log: say at the log's end what is missing from it (best effort)."""
    told = sum(e.get("bytes", 0) for e in dropped.get("episodes") or [])
    note = (f"\n[ups: {dropped['dropped'] - told} bytes of the job's output were dropped up to its end: "
            f"{dropped['error']}]\n")
    try:
        fd = append_opener(str(run.log_path("job")), os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, note.encode())
        finally:
            os.close(fd)
    except OSError:
        pass


def wait_for_space(run: RunDir, asked_to_stop: Callable[[], bool]) -> None:
    """The run's end is written, or kept until the disk has room again: the launcher
    stays (its record says so) until the truth is on disk, unless it is asked to stop
    (`ups kill`): then it tries for STOP_WRITE_S more and leaves, and a reader settles
    the run's state from the records once there is room."""
    if not isinstance(run, LauncherRun):
        return
    give_up: float | None = None
    while not run.flush_pending():
        if asked_to_stop():
            give_up = give_up or time.monotonic() + STOP_WRITE_S
            if time.monotonic() > give_up:
                print(f"ups: asked to stop; the run's end could not be written ({(run.write_failure or {}).get('error')})",
                      flush=True)
                return
        time.sleep(0.5)


def all_final(run: RunDir) -> bool:
    """Every record of the job's processes says done or failed (the launcher's aside)."""
    try:
        records = [p.record for p in load_run_view(run).processes if p.record.role != "launcher"]
    except Exception:  # noqa: BLE001 - unreadable now: wait out the moment as before
        return False
    return bool(records) and all(r.is_final for r in records)


def record_verdict(run: RunDir) -> None:
    """The verdict of ``ups why`` on the ended run, kept in run.json beside the summary."""
    try:
        from ups.why import diagnose_view

        run.update_manifest(verdict=diagnose_view(load_run_view(run)).to_dict())
    except Exception as exc:  # noqa: BLE001 - the run's state is written; a verdict is a bonus
        print(f"ups: no verdict for the ended run: {exc!r}", flush=True)


def say_gone(message: str) -> None:
    """A launcher's word when its run folder is gone: stderr (its log, if anything still
    reads it) and syslog, where an operator looks for a process that has no folder left."""
    print(message, file=sys.stderr, flush=True)
    try:
        import syslog

        syslog.openlog("ups", syslog.LOG_PID, syslog.LOG_USER)
        syslog.syslog(syslog.LOG_WARNING, message)
    except (ImportError, OSError):
        pass


def notify_end(run: RunDir, notifier: Any) -> None:
    """The run's end, told after its state is written: a slow notifier delays only this
    process's exit, by at most its time limit, never the run's record or exit code."""
    if notifier is None:
        return
    m = run.read_manifest()
    notifier.on_end(m.get("state") or "?", m.get("summary") or "", m.get("verdict"))
    notifier.drain(notifier.timeout + 1.0)
