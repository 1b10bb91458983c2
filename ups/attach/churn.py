"""A DataLoader worker's end, seen from outside: a generation's normal end, or a death.

A DataLoader made anew every epoch (torch's default, ``persistent_workers=False``) ends all its
workers together and starts new ones in the same slots: churn, not death (for launched runs,
the rank says so: ups.instrument.torch.data). From outside, a worker's end is that churn when
its rank lives on and no worker of its own generation (its rank's workers started with it)
that it ran beside outlives it; it is a death when the job's log says so (torch's own words: ``DataLoader worker
(pid 123) is killed by signal: Killed.``, ``DataLoader worker (pid(s) 123) exited
unexpectedly``) or when it ended alone while its generation's other workers went on. An exit
code is never visible to an observer that is not the parent.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

LOADER_DEATH = re.compile(r"DataLoader worker \(pid\(?s?\)? ?([\d, ]+)\)\s*(?:is killed by signal: ([^.\n]+)|exited unexpectedly)")
LOG_WORD_S = 6.0  # how long a normal-looking end waits for the log's word of a death
TOLD_KEPT = 256


class WorkerEnds:
    """What the job's log says of its DataLoader workers' deaths, by pid (the latest few)."""

    def __init__(self) -> None:
        self.told: OrderedDict[int, str] = OrderedDict()

    def feed(self, line: str) -> None:
        if "DataLoader worker" not in line:
            return
        for m in LOADER_DEATH.finditer(line):
            how = f"killed by signal: {m.group(2).strip()}" if m.group(2) else "exited unexpectedly"
            for pid in re.findall(r"\d+", m.group(1)):
                self.told[int(pid)] = how
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
