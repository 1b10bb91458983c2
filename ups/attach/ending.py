"""How an attached job ended, as far as is known from outside (ups.attach.observe writes it once
every process of the job is gone): its state and summary from the job's log (ups.why.logread),
each process's last record, the run's end and its final verdict. Exit codes are not visible from
outside and are never invented."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from typing import Any

from ups.runs.rundir import RunDir
from ups.status.record import StatusRecord

ACTOR = "attach"


def write_end(run: RunDir, seen: Mapping[str, Any], record: Callable[[Any, float, float], StatusRecord], *,
              ended: list[dict[str, Any]] = ()) -> None:
    """Settle ``run`` from its job's log: ``seen`` maps each process's name to what the observer
    saw of it (``proc``, ``gone_at``, ``inproc``); ``record`` makes its record at a time.
    ``ended``: processes seen gone earlier and no longer held (name, pid, gone_at)."""
    from ups.status.lineprefix import strip_prefixes
    from ups.status.safeio import try_tail
    from ups.why.logread import read_log

    text = try_tail(run.log_path("job"), 200_000) or ""
    ends = sorted([*ended, *({"name": n, "pid": s.proc.pid, "gone_at": s.gone_at} for n, s in seen.items())],
                  key=lambda e: e["name"])
    reading = read_log(text) if text else None
    seen_end = "every process of the job was seen to end; their exit codes are not visible from outside"
    failure = None
    if reading is not None and reading.failed:
        state = "failed"
        who = f"rank {reading.rank}: " if reading.rank is not None else ""
        summary = f"{who}{reading.summary} (read from the job's log: {reading.line.strip()[:200]})"
        line = strip_prefixes(reading.line.strip()).strip()
        failure = {"rank": reading.rank, "error": line[:500] or reading.summary,
                   "error_site": reading.site, "clean": None}
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
        if s.gone_at is None or s.inproc or not (state == "ended" or named):
            continue  # (an injected process wrote its own last word)
        rec = record(s, s.gone_at, time.monotonic())
        if named:
            rec = rec.with_changes(state="failed", error=failure["error"], error_site=reading.site)
        else:
            rec = rec.with_changes(state="done")
        with contextlib.suppress(OSError):
            run.write_file(f"status/{rec.name}.json", rec.to_json().encode())  # never through a link
    run.settle(state, summary=summary, failure=failure, ended=ends)
    run.append_event("exit", actor=ACTOR, state=state, summary=summary)
    from ups.launch.ending import record_verdict

    record_verdict(run)

