"""Process identity: a pid plus its start time, so a reused pid is never mistaken for ours."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Protocol

# psutil derives create_time from /proc/<pid>/stat in clock ticks (10 ms) plus boot time;
# two reads of the same process agree to well under this tolerance.
START_TIME_TOLERANCE = 0.05


def process_start_time(pid: int) -> float | None:
    """Start time of a live process as UNIX seconds, or None when there is no such process."""
    import psutil

    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            if proc.status() == psutil.STATUS_ZOMBIE:  # exited, not yet reaped: gone for us
                return None
            return round(proc.create_time(), 2)
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied, ValueError):
        return None


def same_start(a: float | None, b: float | None) -> bool:
    return a is not None and b is not None and abs(a - b) <= START_TIME_TOLERANCE


class ProcessTable(Protocol):
    """What health needs to know of the live processes: pid -> start time."""

    def start_time(self, pid: int) -> float | None: ...


class StaticProcessTable:
    """A snapshot of pid -> start time (None for gone), taken once per tick."""

    def __init__(self, table: Mapping[int, float | None]) -> None:
        self._table = dict(table)

    def start_time(self, pid: int) -> float | None:
        return self._table.get(pid)

    @classmethod
    def snapshot(cls, pids: Iterable[int]) -> StaticProcessTable:
        return cls({pid: process_start_time(pid) for pid in set(pids)})


def is_zombie(pid: int) -> bool:
    """True when the pid is a zombie (exited, not yet reaped): dead for our purposes."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
        return data[data.rindex(b")") + 2 : data.rindex(b")") + 3] == b"Z"
    except (OSError, ValueError):
        return False


def this_process_start() -> float:
    start = process_start_time(os.getpid())
    assert start is not None
    return start
