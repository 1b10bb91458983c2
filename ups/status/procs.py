"""Process identity: a pid plus its start time, so a reused pid is never mistaken for ours."""

from __future__ import annotations

import os

from ups.status import procfs

TYPE_CHECKING = False  # every instrumented process imports this module: no typing at run time
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import Protocol

    class ProcessTable(Protocol):
        """What health needs to know of the live processes: pid -> start time."""

        def start_time(self, pid: int) -> float | None: ...
else:

    class ProcessTable:
        """What health needs to know of the live processes: pid -> start time (an interface:
        any object with ``start_time`` will do)."""

        def start_time(self, pid: int) -> float | None:
            raise NotImplementedError

# Start times are boot time (an integer in /proc/stat) + start ticks (10 ms each), rounded to
# 0.01 s: two reads of one process give the same value. One tick of slack, for rounding.
START_TIME_TOLERANCE = 0.015


def _proc_start_time(pid: int) -> float | None | bool:
    """Start time from /proc/<pid>/stat as psutil computes it (boot time + start ticks), None
    for a gone or zombie process, False when /proc cannot tell (not Linux)."""
    boot = procfs.boot_time()
    if boot is None:
        return False
    st = procfs.stat(pid)
    if st is None or st.gone:  # exited, not yet reaped (or being reaped): gone for us
        return None
    return round(boot + st.starttime / procfs.clock_ticks(), 2)


def process_start_time(pid: int) -> float | None:
    """Start time of a live process as UNIX seconds, or None when there is no such process.

    Read from /proc directly where it exists (a few microseconds, and no psutil import in
    every instrumented process); psutil elsewhere. Both give boot time + start ticks."""
    if pid <= 0:
        return None
    fast = _proc_start_time(pid)
    if fast is not False:
        return fast  # type: ignore[return-value]
    import psutil

    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            if proc.status() == psutil.STATUS_ZOMBIE:
                return None
            return round(proc.create_time(), 2)
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied, ValueError):
        return None


def same_start(a: float | None, b: float | None) -> bool:
    return a is not None and b is not None and abs(a - b) <= START_TIME_TOLERANCE


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
    st = procfs.stat(pid)
    return st is not None and st.state == "Z"


def this_process_start() -> float:
    start = process_start_time(os.getpid())
    assert start is not None
    return start
