"""A DataLoader worker's end, seen from outside: a generation's normal end, or a death.

A DataLoader made anew every epoch (torch's default, ``persistent_workers=False``) ends all its
workers together and starts new ones in the same slots: churn, not death (for launched runs,
the rank says so: ups.instrument.torch.data). From outside, a worker's end is that churn when
its rank lives on and no worker it ran beside outlives it; it is a death when the job's log
says so (torch's own words: ``DataLoader worker (pid 123) is killed by signal: Killed.``,
``DataLoader worker (pid(s) 123) exited unexpectedly``) or when it ended alone while its
rank's other workers went on. An exit code is never visible to an observer that is not the
parent."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

from ups.attach.ending import ACTOR
from ups.why.loaderwords import worker_deaths

SHUTDOWN_SIGNALS = (15, 2)  # SIGTERM (a DataLoader's own shutdown of a worker it waited on), SIGINT (Ctrl-C)
LOG_WORD_S = 6.0  # how long a normal-looking end waits for the log's word of a death
TOLD_KEPT = 256


class WorkerEnds:
    """What the job's log says of its DataLoader workers' deaths, by pid (the latest few)."""

    def __init__(self) -> None:
        self.told: OrderedDict[int, str] = OrderedDict()

    def feed(self, line: str) -> None:
        for pids, how in worker_deaths(line):
            for pid in pids:
                self.told[pid] = how
                while len(self.told) > TOLD_KEPT:
                    self.told.popitem(last=False)

    def how(self, pid: int) -> str | None:
        return self.told.get(pid)


def ended_alone(peers: Iterable[int], live: Iterable[Any]) -> bool:
    """A worker its rank ran beside it (``peers``: the pids of its rank's other workers seen
    before it ended, so of its generation or an older one) still lives a look after its end:
    not a DataLoader's normal end, which ends a generation's workers together."""
    alive = {p.pid for p in live if p.role == "worker"}
    return any(pid in alive for pid in peers)


def rank_lives(gone: Any, live: Iterable[Any]) -> bool:
    return any(p.role == "rank" and p.rank == gone.rank for p in live)


class WorkerChurn:
    """The observer's part that decides how its DataLoader workers ended. ``record(seen, now,
    mono)`` is the observer's record of a process (ups.attach.observe)."""

    def __init__(self, run: Any, record: Callable[..., Any]) -> None:
        self.run, self.record = run, record
        self.ends = WorkerEnds()  # the log's word on a worker's death
        self.pending: list[tuple[Any, float]] = []  # ends that looked normal: (its Seen, until when the log may still say)

    def gone(self, s: Any, seen: dict[str, Any], now: float, mono: float, ended: Any = None) -> None:
        """Worker ``s`` ended while its rank lives: churn (its last record says done, no event)
        unless the log says it died, or the kernel does (``ended``: its exit from taskstats,
        ups.status.taskstats, where the observer may read it: a signal other than the SIGTERM
        of a DataLoader's own shutdown); the log's word, or a worker it ran beside outliving
        it, may still come (:meth:`settle`)."""
        s.gone_at = now
        how = self.ends.how(s.proc.pid)
        if how is not None:
            self.died(s, seen, how, "the job's log")
            return
        if ended is not None and ended.code < 0 and -ended.code not in SHUTDOWN_SIGNALS:
            self.died(s, seen, ended.describe(), "the kernel's taskstats")
            return
        self.write_final(s, seen, "done")
        s.extra["peers"] = [x.proc.pid for x in seen.values() if x is not s and x.proc.role == "worker"
                            and x.proc.rank == s.proc.rank and x.started_mono < mono]  # seen before this look
        self.pending.append((s, mono + LOG_WORD_S))

    def settle(self, seen: dict[str, Any], now: float, mono: float, look_s: float = 1.0) -> None:
        live = [x.proc for x in seen.values() if x.gone_at is None]
        keep = []
        for s, until in self.pending:
            how, said = self.ends.how(s.proc.pid), "the job's log"
            if how is None and not s.extra.get("alone_checked") and now - (s.gone_at or 0) >= look_s:
                s.extra["alone_checked"] = True  # a look after its end: its generation's ends are all in by now
                if ended_alone(s.extra.get("peers") or (), live):
                    how, said = "ended while its rank's other DataLoader workers of the same generation went on", "from outside"
            if how is not None:
                self.died(s, seen, how, said)
            elif mono < until:
                keep.append((s, until))
        self.pending = keep

    def gone_detail(self, p: Any, ended: Any = None) -> str:
        """The event's words for a process seen gone with its rank (the log's, for a worker it
        names; the kernel's, where taskstats told its exit: ``ended``)."""
        how = self.ends.how(p.pid) if p.role == "worker" else None
        if how:
            return f"DataLoader worker {how} (the job's log)"
        if ended is not None:
            return f"{ended.describe()} (its exit status from the kernel's taskstats)"
        return "seen gone from outside; its exit code is not visible to an observer"

    def died(self, s: Any, seen: dict[str, Any], how: str, said: str) -> None:
        self.run.append_event("process.gone", actor=ACTOR, name=s.proc.name, pid=s.proc.pid,
                              detail=f"DataLoader worker {how} ({said}); its rank goes on")
        self.write_final(s, seen, "failed", error=f"DataLoader worker (pid {s.proc.pid}) {how} ({said})")

    def write_final(self, s: Any, seen: dict[str, Any], state: str, error: str | None = None) -> None:
        """Its last record, in its slot's file while no newer worker holds the slot."""
        if seen.get(s.proc.name) is not s or s.inproc:
            return
        now, mono = time.time(), time.monotonic()
        rec = dataclasses.replace(self.record(s, now, mono), state=state, phase="done" if state == "done" else s.phase,
                                  error=error)
        with contextlib.suppress(OSError):
            self.run.write_file(f"status/{rec.name}.json", rec.to_json().encode())
