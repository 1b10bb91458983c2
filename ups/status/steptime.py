"""Where a rank's step time goes, kept by the rank itself: the rolling window of its recent
optimizer steps, split into waiting for input, waiting in collectives, backward, and the rest.

The hot path (:class:`ups.status.counters.RecordCounters`) sums three parts of the step in
progress with the clock reads its hooks make anyway (the DataLoader's ``next``, a collective's
enter and leave, ``backward()``'s start and end) and appends each finished step's sums. The
heartbeat thread summarizes the steps of the last ``WINDOW_S`` seconds (or, for a job slower than
three steps a second, its last ``MIN_STEPS`` steps) once a second into the
record's ``metrics.step_parts``: median and p90 of each part, the share of wall time the
rank's main thread spent runnable but not running (``/proc/.../schedstat``: another task had
its core), and the same for the processes that thread started (its DataLoader's workers, read
from ``/proc/PID/task/TID/children``): the share of the time they were runnable that they
waited for a core (``workers_runq``), so a rank whose input is slow because its workers are
crowded off their cores is told from one whose data loading is slower. ``ups.status.straggler``
compares the ranks' summaries. Standard library only.
"""

from __future__ import annotations

import os
import time
from collections import deque

from ups.status import procfs

STEP_PARTS_KEPT = 512  # steps: at 100 steps/s the window is the last 5 s
WINDOW_S = 10.0
LONGEST_S = 300.0  # a slow job's window: its last MIN_STEPS steps, if they all ended within this long
MIN_STEPS = 30  # fewer steps in the window say nothing: a start, a checkpoint would weigh in the median
PARTS = ("step", "data", "collective", "backward", "other")


def _med_p90(values: list[float]) -> list[float]:
    values.sort()
    n = len(values)
    mid = values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2
    return [round(mid, 6), round(values[min(n - 1, int(0.9 * n))], 6)]


class StepWindow:
    """The heartbeat thread's side: the summary of the recent steps, and the main thread's
    run-queue share over the same window."""

    def __init__(self) -> None:
        self._sched: deque[tuple[float, int, int]] = deque()
        self._tid: int | None = None
        self._pid: int | None = None
        # The stepping thread's child processes: their (run, wait) ns when last read, by pid,
        # and each read's increments summed over them, (time, run, wait), for the window.
        self._kids: dict[int, tuple[int, int]] = {}
        self._kid_sched: deque[tuple[float, int, int]] = deque()
        self._first: float | None = None  # when its first step (the first one seen) began

    def summary(self, parts: deque, tid: int | None = None, now: float | None = None) -> dict | None:
        """``{"n", "window_s", "stepping_s", "step_mean", "step": [median, p90], "data", "collective",
        "backward", "other", "runq", "cpu"}`` in seconds a step (stepping_s: since its first step;
        runq, cpu: shares of wall time of thread ``tid``, the one that steps), None with too few
        steps in the window."""
        now = time.monotonic() if now is None else now
        runq, cpu = self._sched_shares(now, tid)
        kept = list(parts)
        if self._first is None and kept:
            self._first = kept[0][0] - kept[0][1]
        recent = [p for p in kept if p[0] >= now - WINDOW_S]
        if len(recent) < MIN_STEPS:
            # A slow job (a step a second, or ten): its last MIN_STEPS steps, while they are recent.
            recent = kept[-MIN_STEPS:]
            if len(recent) < MIN_STEPS or recent[0][0] < now - LONGEST_S:
                return None
        step, data, coll, bwd, other = [], [], [], [], []
        for _, s, d, c, b in recent:
            step.append(s)
            data.append(d)
            coll.append(c)
            bwd.append(b)
            other.append(max(0.0, s - d - c - b))
        out = {"n": len(recent), "window_s": round(now - recent[0][0] + recent[0][1], 3)}
        if self._first is not None:
            out["stepping_s"] = round(max(0.0, now - self._first), 3)
        out["step_mean"] = round(sum(step) / len(step), 6)  # what the step rate sees (an epoch's start included)
        for name, values in zip(PARTS, (step, data, coll, bwd, other), strict=True):
            out[name] = _med_p90(values)
        out["runq"] = runq
        out["cpu"] = cpu
        workers = self._workers_runq(now, tid)
        if workers is not None:
            out["workers_runq"], out["workers_wait"] = workers
        return out

    def _workers_runq(self, now: float, tid: int | None) -> tuple[float, float | None] | None:
        """Of the time the stepping thread's child processes were runnable over the window, the
        share they waited for a core, and the share of wall time each waited (their mean): None
        when no child ran in it. A worker that sleeps most of the time (waiting on a slow disk)
        may wait for a core most of the little time it is runnable on a busy box, and still lose
        little time to it: the second share says how much. A child born since the last read
        counts from its start; one that ended between two reads, its last interval lost."""
        if tid is None:
            return None
        kids: dict[int, tuple[int, int]] = {}
        run = wait = 0
        for pid in procfs.children(os.getpid(), tid):
            got = procfs.schedstat(pid)
            if got is None:
                continue
            kids[pid] = got
            before = self._kids.get(pid, (0, 0))
            run += max(0, got[0] - before[0])
            wait += max(0, got[1] - before[1])
        self._kids = kids
        samples = self._kid_sched
        dt = now - samples[-1][0] if samples else 0.0
        samples.append((now, run, wait, dt * len(kids)))  # child-seconds of wall time since the last read
        while samples and samples[0][0] <= now - WINDOW_S:
            samples.popleft()
        ran = sum(s[1] for s in samples)
        waited = sum(s[2] for s in samples)
        lived = sum(s[3] for s in samples)
        if ran + waited <= 0:
            return None
        return round(waited / (ran + waited), 4), (round(min(1.0, waited / 1e9 / lived), 4) if lived > 0 else None)

    def _sched_shares(self, now: float, tid: int | None) -> tuple[float | None, float | None]:
        pid = os.getpid()
        if tid is None:
            return None, None
        if (pid, tid) != (self._pid, self._tid):  # a new thread steps, or a forked child: start over
            self._pid, self._tid = pid, tid
            self._sched.clear()
        got = procfs.schedstat(pid, tid)
        if got is None:
            return None, None
        samples = self._sched
        samples.append((now, got[0], got[1]))
        while len(samples) > 2 and samples[1][0] <= now - WINDOW_S:
            samples.popleft()
        t0, run0, wait0 = samples[0]
        wall = now - t0
        if wall < 1.0:
            return None, None
        return round((got[1] - wait0) / 1e9 / wall, 4), round((got[0] - run0) / 1e9 / wall, 4)
