"""Deciding a finished run's state from the job's exit status and its processes' records.

A job never reports success unless it exited 0 **and** every rank's final record says done:
an ``os._exit(0)`` in the middle of training leaves a record that still says running, and
that run is ``failed``, not ``succeeded``.

Each job kind has its rule (e.g. precompute maps exit code 3 to ``partial``): the table is
:data:`ups.runs.kinds.RULES`, and :func:`ups.runs.kinds.finalize` applies it. The launcher
decides a run's end with them, and a reader settles a run nobody is left to finish with the
same rules (:mod:`ups.runs.settle`), in memory.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ups.runs.exits import ProcessExit
from ups.runs.view import RunView
from ups.status.record import StatusRecord


@dataclass(frozen=True)
class Outcome:
    state: str  # succeeded | partial | failed | killed
    summary: str
    failure: dict[str, Any] | None = None  # first failing process: name, rank, phase, error/signal
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class End:
    """How the job's top process ended, and what the supervisor saw of every other one."""

    returncode: int | None  # None: not known (the run was adopted, or settled by a reader)
    terminated: bool = False  # the operator (or a signal to the launcher) stopped it
    exits: Mapping[str, ProcessExit] = field(default_factory=dict)
    disk_full: str | None = None  # evidence that the run folder's disk was full during the run


def describe_returncode(rc: int | None) -> str:
    if rc is None:
        return "exit status unknown"
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit code {rc}"


def first_failure(view: RunView) -> StatusRecord | None:
    """The process that failed first: a failed record (earliest), else one that never finished."""
    ranks = [p.record for p in view.processes if p.record.role in ("rank", "worker")]
    failed = sorted((r for r in ranks if r.state == "failed"), key=lambda r: r.heartbeat_at)
    if failed:
        return failed[0]
    unfinished = sorted((r for r in ranks if r.state == "running" and r.role == "rank"), key=lambda r: r.heartbeat_at)
    return unfinished[0] if unfinished else None


def failure_dict(rec: StatusRecord | None) -> dict[str, Any] | None:
    if rec is None:
        return None
    return {
        "name": rec.name,
        "rank": rec.rank,
        "worker": rec.worker,
        "pid": rec.pid,
        "phase": rec.phase,
        "error": rec.error,
        "record_state": rec.state,
    }


def default_finalizer(view: RunView, end: End) -> Outcome:
    returncode = end.returncode
    if end.terminated:
        return Outcome("killed", f"stopped by request ({describe_returncode(returncode)})")
    ranks = view.ranks()
    not_done = [p.record for p in ranks if p.record.state != "done"]
    if returncode == 0 and ranks and not not_done:
        return Outcome("succeeded", "every process exited 0 and says done")
    bad = first_failure(view)
    if returncode == 0:
        if not ranks:
            return Outcome("failed", "exited 0 but no process ever wrote a status record")
        rec = not_done[0]
        return Outcome(
            "failed",
            f"exited 0 but {rec.label}'s last record says {rec.state} in phase {rec.phase}",
            failure_dict(rec),
        )
    what = describe_returncode(returncode)
    if bad is not None:
        detail = bad.error or f"no final record, last phase {bad.phase}"
        return Outcome("failed", f"{what}; first failure: {bad.label} in {bad.phase}: {detail}", failure_dict(bad))
    return Outcome("failed", what)
