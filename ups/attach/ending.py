"""How an attached job ended, as far as is known from outside (ups.attach.observe writes it once
every process of the job is gone): its state and summary from the job's log (ups.why.logread),
each process's last record, the run's end and its final verdict. Exit codes reach an observer
only where the kernel's taskstats told them (ups.status.taskstats: root); elsewhere they are not
visible from outside, and are never invented."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from typing import Any

from ups.runs.rundir import RunDir
from ups.status.record import StatusRecord

ACTOR = "attach"


def write_end(run: RunDir, seen: Mapping[str, Any], record: Callable[[Any, float, float], StatusRecord], *,
              ended: list[dict[str, Any]] = (), exit_of: Callable[[int, float | None], Any] | None = None,
              top: tuple[int, float | None] | None = None) -> None:
    """Settle ``run`` from its job's log: ``seen`` maps each process's name to what the observer
    saw of it (``proc``, ``gone_at``, ``inproc``); ``record`` makes its record at a time.
    ``ended``: processes seen gone earlier and no longer held (name, pid, gone_at, start).
    ``exit_of(pid, start)``: the kernel's word on a process's end (ups.status.taskstats.Exit), where
    the observer could listen; ``top``: the job's top process (pid, start), whose exit status is
    the job's."""
    from ups.runs.signals import signal_name
    from ups.status.lineprefix import strip_prefixes
    from ups.status.safeio import try_tail
    from ups.why.logread import read_log

    text = try_tail(run.log_path("job"), 200_000) or ""
    ends = sorted([*ended, *({"name": n, "pid": s.proc.pid, "gone_at": s.gone_at, "start": s.proc.start}
                             for n, s in seen.items())], key=lambda e: e["name"])
    told = {}  # pid -> the kernel's Exit
    if exit_of is not None:
        for e in ends:
            got = exit_of(e["pid"], e.get("start"))
            if got is not None:
                told[e["pid"]] = got
                e["exit_code"] = got.code
    for e in ends:
        e.pop("start", None)
    reading = read_log(text) if text else None
    seen_end = "every process of the job was seen to end; their exit codes are not visible from outside"
    top_exit = told.get(top[0]) if top is not None else None
    failure = None
    failure_read = reading if reading is not None and reading.failed else None
    if failure_read is not None:
        state = "failed"
        who = f"rank {reading.rank}: " if reading.rank is not None else ""
        summary = f"{who}{reading.summary} (read from the job's log: {reading.line.strip()[:200]})"
        line = strip_prefixes(reading.line.strip()).strip()
        failure = {"rank": reading.rank, "error": line[:500] or reading.summary,
                   "error_site": reading.site, "clean": None}
    elif top_exit is not None:
        # The kernel said how the job's top process ended (taskstats): its exit status is the job's.
        how = f"the job's top process (pid {top_exit.pid}, {top_exit.comm}) {top_exit.describe()}"
        others = [f"{e['name']} {told[e['pid']].describe()}" for e in ends
                  if e["pid"] in told and e["pid"] != top_exit.pid and told[e["pid"]].code != 0][:4]
        said = f"{how}{'; ' + ', '.join(others) if others else ''} (exit statuses from the kernel's taskstats)"
        if top_exit.code == 0:
            state, summary = "succeeded", said
        else:
            # A signal from outside (the OOM killer, a scheduler, someone's kill -9) is a failure of
            # the job, not a stop by an operator of ups ("killed" is ups kill's word).
            state, summary = "failed", said
            failure = {"rank": None, "error": None, "error_site": None, "clean": None, "exit_code": top_exit.code,
                       **({"signal": signal_name(-top_exit.code)} if top_exit.code < 0 else {})}
    elif text:
        # Never "succeeded": a job SIGKILLed as a whole, or one that called exit(1) after its
        # last line, leaves the same log. What is known is said, and no more.
        state, summary = "ended", f"{seen_end}; its log names no failure"
    else:
        state, summary = "lost", f"{seen_end}, and it wrote no log ups could read: how it ended is not known"
    for s in seen.values():
        # The last word on a process: done (its end seen) when the job ended with no failure in its log;
        # failed, with the log's words, for the rank the log names; the others stay as last
        # seen (running, now gone): how they ended is not known from outside.
        named = reading is not None and reading.failed and reading.rank is not None and s.proc.rank == reading.rank \
            and s.proc.role == "rank"
        # the kernel's word on each process, where it decided the run (a failure the log names
        # stays the reading: its records as before)
        kernel = told.get(s.proc.pid) if top_exit is not None and failure_read is None else None
        if s.gone_at is None or s.inproc or not (state == "ended" or named or kernel is not None):
            continue  # (an injected process wrote its own last word)
        rec = record(s, s.gone_at, time.monotonic())
        if named:
            rec = rec.with_changes(state="failed", error=failure["error"], error_site=reading.site)
        elif kernel is not None and kernel.code != 0:
            rec = rec.with_changes(state="failed")
        else:
            rec = rec.with_changes(state="done")
        if kernel is not None:
            rec = rec.with_changes(exit_code=kernel.code)
        with contextlib.suppress(OSError):
            run.write_file(f"status/{rec.name}.json", rec.to_json().encode())  # never through a link
    codes = {"exit_code": top_exit.code} if top_exit is not None else {}
    if top_exit is not None and top_exit.code < 0:
        codes["signal"] = signal_name(-top_exit.code)
    run.settle(state, summary=summary, failure=failure, ended=ends, **codes)
    run.append_event("exit", actor=ACTOR, state=state, summary=summary)
    from ups.launch.ending import record_verdict

    record_verdict(run)

