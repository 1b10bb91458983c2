"""The record's counters, kept by the Reporter (:mod:`ups.status.reporter`) in memory: the
step, total and unit, the phase, the collective the process is in, the item and the metrics,
and the gaps between progress that the learned stall limit is drawn from
(:mod:`ups.status.limits`).

These are the hot path: the instrumentation (ups.instrument.torch) calls them on every
batch, backward, optimizer step and collective of a program, and jobs on every step. One
monotonic clock read, attribute stores on the Reporter itself (this class is a base of it, so
a call costs what a method of the Reporter costs), nothing else: the heartbeat thread derives
the rest when it writes. Imported by every instrumented process: standard library only.
"""

from __future__ import annotations

import threading
import time
from collections import deque

from ups.status.limits import INTERVALS_KEPT, LONG_PHASES
from ups.status.schema import COLL_RANKS_MAX
from ups.status.steptime import STEP_PARTS_KEPT

_monotonic = time.monotonic
_native_id = threading.get_native_id

TYPE_CHECKING = False  # typing costs ~10 ms to import; annotations here are strings
if TYPE_CHECKING:
    from typing import Any

PHASE_WRITE_WAIT_S = 0.2  # at most, and only while the heartbeat thread is writing


class RecordCounters:
    """The record's counters and their hot-path updates (a base of the Reporter)."""

    def __init__(self, *, phase: str, total: int | None, unit: str, mono: float) -> None:
        # Mutable state: plain attributes, updated by the job's thread, read by the writer.
        # Times of the hot path are CLOCK_MONOTONIC only (one clock read); the record's wall
        # times are derived from them when it is written (Reporter.record_dict).
        self._phase = phase
        self._phase_mono = mono
        self._state = "running"
        self._step = 0
        self.explicit_progress = False  # the job reports its own progress: automatic counting stops
        self._intervals: deque[float] = deque(maxlen=INTERVALS_KEPT)
        self._interval_from: float | None = None  # monotonic start of the current interval
        self._p99: float | None = None
        self._total = total
        self._unit = unit
        self._progress_mono = mono
        self.current_item: Any = None  # a str, or an object whose str() the heartbeat thread takes
        self._metrics: dict[str, Any] = {}
        self._rate: float | None = None
        # (op, seq, site, since_mono, previous tuple or None, info or None): a tuple on the hot
        # path, the record's dict built by the writer. info: what the instrumentation knows of
        # the group and the framework (ups.instrument.torch.collectives: group name, description and
        # global ranks, context, a new call site, the p2p peer, whether it waits for async work).
        self._collective: tuple | None = None
        self._last_collective: tuple | None = None
        self._coll_seq = 0
        # Where each optimizer step's time goes (ups.status.steptime): seconds waiting for the
        # next batch, inside collectives, and in backward() less the collectives inside it,
        # summed over the step in progress; each finished step's sums are appended to
        # ``step_parts`` as (end, step, data, collective, backward) by the optimizer hook.
        self.t_data = self.t_coll = self.t_bwd = 0.0
        self.step_mark: float | None = None
        self.step_tid: int | None = None  # the thread that steps (its run-queue wait is read)
        self.step_parts: deque[tuple[float, float, float, float, float]] = deque(maxlen=STEP_PARTS_KEPT)

    def flush(self, *, wait: float = 0.0) -> bool:  # the Reporter's: it writes the record
        raise NotImplementedError

    def _progressed(self) -> None:
        now = time.monotonic()
        start = self._interval_from
        if start is not None:
            self._intervals.append(now - start)
        self._interval_from = self._progress_mono = now

    def advance(self, n: int = 1) -> None:
        """Count ``n`` units of work done. Cheap: no I/O, no lock."""
        self.explicit_progress = True
        self._step += n
        self._progressed()

    def set_step(self, step: int) -> None:
        """Set the absolute step (e.g. after resuming); counts as progress."""
        self.explicit_progress = True
        self._step = step
        self._progressed()

    def auto_progress(self, *, step: int | None = None, add: int = 0, unit: str | None = None) -> None:
        """Progress seen by the instrumentation (an optimizer step, a batch, samples fetched).

        It sets the count only while the job has reported none of its own (``advance``,
        ``set_step``): a job that counts its own steps (resumed from a checkpoint, skipping
        OOM steps) knows better. It always counts as progress in time. (On every step of the
        program: _progressed inlined.)"""
        if not self.explicit_progress:
            if step is not None:
                self._step = step
            self._step += add
            if unit is not None:
                self._unit = unit
        now = time.monotonic()
        start = self._interval_from
        if start is not None:
            self._intervals.append(now - start)
        self._interval_from = self._progress_mono = now

    def set_total(self, total: int | None, unit: str | None = None) -> None:
        self._total = total
        if unit is not None:
            self._unit = unit

    def set_unit(self, unit: str) -> None:
        self._unit = unit

    def phase(self, name: str, *, flush: bool = True) -> None:
        """Enter a phase (``dist.init``, ``data.open``, ``encode`` ...).

        Written at once by default, so a crash right after the change shows it: waiting up to
        :data:`PHASE_WRITE_WAIT_S` for a heartbeat write under way, whose record, made before the
        change, would otherwise be the last one (CI: a SIGSEGV right after ``model.build`` left
        ``data.load`` in the record). Phases that change many times a second (one per sample or
        per batch) pass ``flush=False``: the heartbeat thread writes them within ``interval``,
        and the hot path does no I/O.
        """
        mono = time.monotonic()
        self._phase = name
        if name in LONG_PHASES:
            self._interval_from = None
        # A phase change is progress: the loop moved on.
        self._phase_mono = self._progress_mono = mono
        if flush:
            self.flush(wait=PHASE_WRITE_WAIT_S)

    @property
    def current_phase(self) -> str:
        return self._phase

    # -- the instrumentation's hot path (ups.instrument.torch): every batch, backward,
    # optimizer step and collective of a program. One monotonic clock read, attribute stores,
    # nothing else: the heartbeat thread derives the rest when it writes.
    def enter(self, name: str) -> str:
        """Enter phase ``name`` for the duration of a wrapped call (not written now); returns
        the phase it found, for :meth:`leave`."""
        prev = self._phase
        self._phase = name
        self._phase_mono = self._progress_mono = _monotonic()
        return prev

    def auto_step(self, step: int) -> None:
        """``auto_progress(step=step, unit="steps")``: an optimizer step, which ends a step's
        accounting of where its time went."""
        now = _monotonic()
        mark = self.step_mark
        if mark is not None:
            self.step_parts.append((now, now - mark, self.t_data, self.t_coll, self.t_bwd))
        else:
            self.step_tid = _native_id()
        self.t_data = self.t_coll = self.t_bwd = 0.0
        self.step_mark = now
        if not self.explicit_progress:
            self._step = step
            self._unit = "steps"
        start = self._interval_from
        if start is not None:
            self._intervals.append(now - start)
        self._interval_from = self._progress_mono = now

    def enter_collective(self, op: str, site: str | None, phase: str, seq: int | None = None,
                         info: tuple | None = None, *, counted: bool = True) -> str:
        """:meth:`collective` (``op``) and :meth:`enter` (``phase``) with one clock read.
        ``seq``: the collective's own sequence number in its group (else the per-rank count);
        ``info``: (group name, group description, global ranks, context, new call site, peer,
        waiting for async work), see :func:`collective_dict`; ``counted``: False for the
        wait of an async collective already counted when it was issued."""
        now = _monotonic()
        if counted:
            self._coll_seq += 1
        self._collective = (op, self._coll_seq if seq is None else seq, site, now, self._last_collective, info)
        prev = self._phase
        self._phase = phase
        self._phase_mono = self._progress_mono = now
        return prev

    def leave_collective(self, name: str) -> None:
        """:meth:`collective` (None) and :meth:`phase` (``name``, not written now)."""
        current = self._collective
        now = _monotonic()
        if current is not None:
            self._last_collective = current[:3]  # (op, seq, site): not a chain of every collective
            self.t_coll += now - current[3]
        self._collective = None
        self._phase = name
        if name in LONG_PHASES:
            self._interval_from = None
        self._phase_mono = self._progress_mono = now

    def leave(self, name: str, add: int = 0) -> None:
        """Back to phase ``name`` after a wrapped call, which was progress: as :meth:`phase`
        (not written now) then :meth:`auto_progress` (``add``) with one clock read."""
        now = _monotonic()
        if self._phase == "data":
            self.t_data += now - self._phase_mono
        self._phase = name
        self._phase_mono = now
        start = None if name in LONG_PHASES else self._interval_from
        if add and not self.explicit_progress:
            self._step += add
        if start is not None:
            self._intervals.append(now - start)
        self._interval_from = self._progress_mono = now

    def item(self, desc: Any) -> None:
        """The item being worked on now, e.g. ``"burgers1d_train.h5#17"``: a str, or an object
        whose ``str()`` says it, taken when the record is written (the instrumentation's
        DataLoader hook passes one, so the training thread formats nothing)."""
        self.current_item = desc

    def metrics(self, **values: Any) -> None:
        """Merge free-form metrics (loss, lr, ...) into the record."""
        self._metrics.update(values)

    def collective(self, op: str | None, site: str | None = None) -> None:
        """Enter (``op``) or leave (None) a collective; entering counts the per-rank sequence.
        The record keeps the previous one's op and site beside the current one: a rank whose
        op just changed while its peers' did not is the odd one out."""
        if op is None:
            current = self._collective
            if current is not None:
                self._last_collective = current[:3]  # (op, seq, site): not a chain of every collective
            self._collective = None
            return
        self._coll_seq += 1
        self._collective = (op, self._coll_seq, site, time.monotonic(), self._last_collective, None)

    # -- state ------------------------------------------------------------------------------
    @property
    def step(self) -> int:
        return self._step

    @property
    def state(self) -> str:
        return self._state

    @property
    def quiet_since(self) -> float:
        """The monotonic time of the process's last progress or phase change (a collective
        entered or left counts): what a watcher in the process compares with the clock."""
        return max(self._progress_mono, self._phase_mono)

    @property
    def interval_p99(self) -> float | None:
        """The learned p99 of the gaps between steps (seconds), None until there are enough."""
        return self._p99

    def has_metric(self, name: str) -> bool:
        return name in self._metrics


def collective_dict(current: tuple | None, wall: float) -> dict[str, Any] | None:
    """The record's ``collective``: op, per-rank sequence number, call site, since when, and
    the previous collective's op and site."""
    if current is None:
        return None
    op, seq, site, mono, prev, info = current
    out = {"op": op, "seq": seq, "site": site, "since": mono + wall, "since_mono": mono,
           "prev_op": prev[0] if prev else None, "prev_site": prev[2] if prev else None}
    if info is not None:
        group, desc, ranks, context, new, peer, waiting = info
        out.update(group=group, group_desc=desc, ranks=list(ranks) if ranks is not None and len(ranks) <= COLL_RANKS_MAX else None, context=context,
                   new=new, peer=peer, waiting=waiting)
    return out
