"""Reporter: the status writer used inside jobs (and, through ups.instrument, any program).

Design points (see docs/design.md, "The run directory"):

* ``advance()`` only bumps counters in memory (it costs well under 2 µs); a daemon thread
  writes the record about once a second. Heartbeat (the write) and progress (``advance``)
  are separate clocks, so a stuck main loop shows as fresh heartbeat + stale progress.
* ``phase()`` writes at once (unless ``flush=False``), so a crash right after a phase change
  shows that phase.
* Writes are atomic (temp file in the same folder, then ``os.replace``): readers never see
  a torn record, and a process that dies leaves its last record behind.
* Reporting never kills or blocks the job: any OSError (run folder gone, disk full) is
  reported once on stderr and the write is retried on the next tick.
* faulthandler is registered for fatal signals and for a stack-dump signal, writing to
  ``stacks/<name>.txt``; the record says which signal, so tools only send it to processes
  that registered it (by default that signal kills a process). The signal is a real-time
  one (``SIGRTMIN+7``), not SIGUSR1: programs own SIGUSR1 (Lightning's teardown resets it
  to its default, SLURM's ``--signal=USR1`` and requeue, servers), and no framework we know
  touches real-time signals. If the program later installs its own handler for that signal,
  or resets it, the record stops naming it (tools also check the live caught-signal mask
  before every send: see ups.runs.signals).
* Every instrumented process pays for importing this module, so it imports only the
  standard library's light modules and :mod:`ups.status.schema` (no dataclasses, pathlib,
  psutil): the record is written as a dict with the keys of
  :class:`ups.status.record.StatusRecord` (a test keeps the two the same).
"""

from __future__ import annotations

import _signal  # signal's constants and getsignal, without the enums signal.py builds at import
import faulthandler
import json
import os
import sys
import threading
import time
from collections import deque

from ups.status.confined import in_folder, make_dirs, open_append
from ups.status.exceptions import describe_exception
from ups.status.files import folder_identity, write_atomic
from ups.status.host import boot_id, hostname
from ups.status.procs import process_start_time
from ups.status.schema import COLL_RANKS_MAX, LOSS_TRACE, SCHEMA_VERSION, process_name

ENV_ATTEMPT = "UPS_ATTEMPT"  # 1 for a run's first attempt; a restart after a hang counts up

ENV_RUN_DIR = "UPS_RUN_DIR"
ENV_RUN_ID = "UPS_RUN_ID"
ENV_WORKER_ID = "UPS_WORKER_ID"
ENV_ROLE = "UPS_ROLE"
ENV_STACK_SIGNAL = "UPS_STACK_SIGNAL"
DEFAULT_STACK_SIGNAL = int(_signal.SIGRTMIN) + 7  # see the module's docstring: not SIGUSR1
RATE_WINDOW_S = 10.0
INTERVALS_KEPT = 256  # recent gaps between progress, for the learned stall limit (p99)
TRACE_KEPT = 4096  # losses read and not yet in the series (a tick without a series drops the oldest)
# Entering one of these breaks the current progress interval: an eval or a checkpoint between
# two steps has a limit of its own and must not teach the process that steps are that slow.
LONG_PHASES = frozenset(("eval", "checkpoint", "load", "dist.init", "ddp.wrap", "model.build", "data.load"))

_monotonic = time.monotonic

TYPE_CHECKING = False  # typing costs ~10 ms to import; annotations here are strings
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from ups.status.series import SeriesWriter


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        return None


def _catches_self(signum: int) -> bool | None:
    """Whether this process has a handler for ``signum`` (its SigCgt mask), None if unknown."""
    # os.open, not builtins.open: the heartbeat thread calls this, and in a DataLoader worker
    # the instrumentation's open() hook would take /proc/self/status for the sample's file.
    try:
        fd = os.open("/proc/self/status", os.O_RDONLY)
        try:
            data = os.read(fd, 1 << 16)
        finally:
            os.close(fd)
        for line in data.splitlines():
            if line.startswith(b"SigCgt:"):
                return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except (OSError, ValueError, IndexError):
        return None
    return None





class Reporter:
    """Writes this process's status record to ``<run_dir>/status/<name>.json``.

    Use as a context manager; leaving it normally marks the record ``done``, leaving with
    an exception marks it ``failed`` with the exception text.
    """

    _current: Reporter | None = None  # the process's own record (see register_current)

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        *,
        role: str = "rank",
        run_id: str | None = None,
        rank: int | None = None,
        local_rank: int | None = None,
        world_size: int | None = None,
        worker: int | None = None,
        loader: int | None = None,
        node: int | None = None,
        total: int | None = None,
        unit: str = "items",
        phase: str = "start",
        interval: float = 1.0,
        stack_signal: int | None = DEFAULT_STACK_SIGNAL,
        gpu_sampler: Callable[[], Any] | None = None,
        stderr: Any = None,
        command: str | None = None,
        name: str | None = None,
    ) -> None:
        self.run_dir = os.fspath(run_dir)
        self._run_dir_id = folder_identity(self.run_dir)  # a run folder replaced by another is not ours to write
        self.role = role
        pid = os.getpid()
        self.name = name or process_name(role, rank, worker, loader=loader, pid=pid, node=node)
        self.path = os.path.join(self.run_dir, "status", f"{self.name}.json")
        self.interval = interval
        self._stderr = stderr
        self._gpu_sampler = gpu_sampler
        now, mono = time.time(), time.monotonic()
        self._static = dict(
            schema=SCHEMA_VERSION,
            run_id=run_id or os.environ.get(ENV_RUN_ID) or os.path.basename(os.path.normpath(self.run_dir)),
            role=role,
            name=self.name,
            pid=pid,
            pid_start=process_start_time(pid) or 0.0,
            host=hostname(),
            rank=rank,
            local_rank=local_rank,
            world_size=world_size,
            worker=worker,
            loader=loader,
            node=node,
            started_at=now,
            heartbeat_interval=interval,
            command=command,
            boot_id=boot_id(),
            started_mono=mono,
            heartbeat_tid=None,  # set by the heartbeat thread when it starts
        )
        # Mutable state: plain attributes, updated by the job's thread, read by the writer.
        # Times of the hot path are CLOCK_MONOTONIC only (one clock read); the record's wall
        # times are derived from them when it is written (see record_dict).
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
        self._gpu: Any = None
        self._error: str | None = None
        self._error_site: str | None = None
        self._exit_code: int | None = None
        self._rate: float | None = None
        # (op, seq, site, since_mono, previous tuple or None, info or None): a tuple on the hot
        # path, the record's dict built by the writer. info: what the instrumentation knows of
        # the group and the framework (ups.instrument.torch_hooks: group name, description and
        # global ranks, context, a new call site, the p2p peer, whether it waits for async work).
        self._collective: tuple | None = None
        self._last_collective: tuple | None = None
        self._coll_seq = 0
        self._samples: deque[tuple[float, int]] = deque()
        # Writer machinery.
        self._lock = threading.Lock()
        self._dirty = False
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._warned = False
        self._written_mono = 0.0
        # Training metrics read off the training thread (ups.instrument.metrics) and the
        # process's bounded history of them (ups.status.series), both kept by the heartbeat thread.
        self._samplers: list[Callable[[], dict[str, Any]]] = []
        # A rank's series is started by the heartbeat thread once there is a point to keep (its
        # module, and the read of an earlier attempt's file, off every process's start-up).
        self._history: SeriesWriter | None = None
        self._history_wanted = role == "rank"
        self._trace: deque[tuple[int, float]] = deque(maxlen=TRACE_KEPT)  # losses read since the last series tick
        self._stack_fh: Any = None
        self._stack_signal: int | None = None
        self._stack_rel: str | None = None
        if stack_signal is not None:
            env_sig = _env_int(ENV_STACK_SIGNAL)
            self._install_stack_dumps(env_sig if env_sig is not None else stack_signal)

    # -- the process's own reporter ------------------------------------------------------
    @classmethod
    def current(cls) -> Reporter | None:
        """The reporter that describes this process (set by ups.instrument), if any."""
        rep = cls._current
        return rep if rep is not None and rep.pid == os.getpid() else None

    def register_current(self) -> Reporter:
        type(self)._current = self
        return self

    # -- construction from the environment ----------------------------------------------
    @classmethod
    def from_env(
        cls,
        *,
        role: str | None = None,
        worker: int | None = None,
        **kwargs: Any,
    ) -> Reporter | NullReporter:
        """The Reporter for this process: the one ups.instrument already started (adjusted to
        ``unit``, ``total`` and ``interval``), else a new one from ``UPS_RUN_DIR``, ``RANK``,
        ``LOCAL_RANK``, ``WORLD_SIZE`` (and ``UPS_WORKER_ID`` or ``worker`` for workers).

        Without ``UPS_RUN_DIR`` (a job run by hand, outside ``ups launch``) this returns a
        :class:`NullReporter` with the same methods, so job code never needs a branch.
        """
        run_dir = os.environ.get(ENV_RUN_DIR)
        if not run_dir:
            return NullReporter()
        current = cls.current()
        if current is not None and worker is None and role in (None, current.role):
            if "total" in kwargs or "unit" in kwargs:
                current.set_total(kwargs.get("total"), kwargs.get("unit"))
            if "interval" in kwargs:
                current.interval = current._static["heartbeat_interval"] = kwargs["interval"]
            return current
        if worker is None:
            worker = _env_int(ENV_WORKER_ID)
        if role is None:
            role = "worker" if worker is not None else os.environ.get(ENV_ROLE, "rank")
        rank = _env_int("RANK")
        world = _env_int("WORLD_SIZE")
        local = _env_int("LOCAL_RANK")
        kwargs.setdefault("rank", 0 if rank is None else rank)
        kwargs.setdefault("world_size", 1 if world is None else world)
        kwargs.setdefault("local_rank", 0 if local is None else local)
        return cls(run_dir, role=role, worker=worker, **kwargs)

    # -- what the process turned out to be ------------------------------------------------
    def relabel(self, role: str, *, rank: int | None = None, local_rank: int | None = None,
                world_size: int | None = None, name: str | None = None, command: str | None = None,
                phase: str | None = None, unit: str | None = None) -> bool:
        """This process is something else than it looked like at start: a helper that turned out
        to be a rank (it initialised a process group, as ``mp.spawn``'s children and Lightning's
        re-executed scripts do), or a rank that turned out to be ``mp.spawn``'s parent.

        The record moves to its new name at once and the old file is removed (a reader never
        sees the process twice for long, and never a stale helper). The stack file is renamed
        with it (faulthandler's open descriptor follows the file), so the next process to take
        the old name (``mp.spawn``'s rank 0 after its parent) starts a file of its own; where
        the new name's file exists already, the old one is kept and the record names it.
        Returns whether the name changed."""
        new_name = name or process_name(role, rank, None, pid=self.pid)
        with self._lock:
            old_path = self.path
            self.role = role
            self._static.update(role=role, name=new_name, rank=rank)
            if local_rank is not None:
                self._static["local_rank"] = local_rank
            if world_size is not None:
                self._static["world_size"] = world_size
            if command is not None:  # "": none any more
                self._static["command"] = command[:300] or None
            if phase is not None:
                self._phase = phase
                self._phase_mono = time.monotonic()
            if unit is not None:
                self._unit = unit
            changed = new_name != self.name
            if changed and self._stack_rel is not None:
                old_stack = os.path.join(self.run_dir, self._stack_rel)
                new_rel = f"stacks/{new_name}.txt"
                new_stack = os.path.join(self.run_dir, new_rel)
                try:
                    if not os.path.exists(new_stack):
                        os.rename(old_stack, new_stack)
                        self._stack_rel = new_rel
                except OSError:
                    pass
            self.name = new_name
            self.path = os.path.join(self.run_dir, "status", f"{new_name}.json")
            written = self._write()
            if changed and written:
                try:
                    os.unlink(old_path)
                except OSError:
                    pass
        return changed

    # -- faulthandler ---------------------------------------------------------------------
    def _install_stack_dumps(self, signum: int) -> None:
        stacks = os.path.join(self.run_dir, "stacks")
        try:
            stacks_fd = make_dirs(self.run_dir, "stacks")  # never through a link (ups.status.confined)
            try:
                self._stack_fh = open(f"{self.name}.txt", "a", buffering=1,
                                      opener=lambda name, _flags: open_append(name, dir_fd=stacks_fd))
            finally:
                os.close(stacks_fd)
            # disable() first: after a fork (DataLoader workers) faulthandler still believes it
            # is enabled and enable() would keep whatever SIGSEGV handler was set since (torch
            # installs its own in workers), so the crash traceback would never be written.
            faulthandler.disable()
            faulthandler.enable(file=self._stack_fh, all_threads=True)
            faulthandler.unregister(signum)
            faulthandler.register(signum, file=self._stack_fh, all_threads=True, chain=False)
        except (OSError, ValueError, RuntimeError) as exc:
            self._warn(f"could not register stack dumps in {stacks}: {exc}")
            return
        self._stack_signal = int(signum)
        self._stack_rel = f"stacks/{self.name}.txt"

    def rearm_fatal_handler(self) -> None:
        """Put faulthandler back in front for fatal signals, after a library (``import torch``)
        installed its own SIGSEGV handler over it. faulthandler dumps, then hands the signal
        on to the handler it replaced."""
        if self._stack_fh is None:
            return
        try:
            faulthandler.disable()
            faulthandler.enable(file=self._stack_fh, all_threads=True)
        except (OSError, ValueError, RuntimeError):
            pass

    def append_stack_text(self, text: str) -> None:
        """Append text (a traceback) to this process's stack file; never raises."""
        if self._stack_fh is None:
            return
        try:
            self._stack_fh.write(text if text.endswith("\n") else text + "\n")
            self._stack_fh.flush()
        except (OSError, ValueError):
            pass

    def _check_stack_handler(self) -> None:
        """A program that installs its own Python handler for our signal replaces faulthandler's,
        and one that resets it (``signal.signal(sig, SIG_DFL)``) leaves the default, deadly
        action: from then on the record must stop inviting tools to send it."""
        sig = self._stack_signal
        if sig is None or threading.current_thread() is threading.main_thread():
            return
        if callable(_signal.getsignal(sig)) or _catches_self(sig) is False:
            self._stack_signal = None

    # -- the job-facing API ---------------------------------------------------------------
    def start(self) -> Reporter:
        """Write the first record and start the heartbeat thread (idempotent)."""
        if self._thread is None:
            self.flush()
            self._thread = threading.Thread(
                target=self._run, name=f"ups-reporter-{self.name}", daemon=True
            )
            self._thread.start()
        return self

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

    def set_world(self, world_size: int) -> None:
        """The world size learnt after start (``init_process_group``)."""
        self._static["world_size"] = world_size

    def phase(self, name: str, *, flush: bool = True) -> None:
        """Enter a phase (``dist.init``, ``data.open``, ``encode`` ...).

        Written at once by default, so a crash right after the change shows it. Phases that
        change many times a second (one per sample or per batch) pass ``flush=False``: the
        heartbeat thread writes them within ``interval``, and the hot path does no I/O.
        """
        mono = time.monotonic()
        self._phase = name
        if name in LONG_PHASES:
            self._interval_from = None
        # A phase change is progress: the loop moved on.
        self._phase_mono = self._progress_mono = mono
        if flush:
            self.flush()

    @property
    def current_phase(self) -> str:
        return self._phase

    # -- the instrumentation's hot path (ups.instrument.torch_hooks): every batch, backward,
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
        """``auto_progress(step=step, unit="steps")``: an optimizer step."""
        now = _monotonic()
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
        waiting for async work), see :func:`_collective_dict`; ``counted``: False for the
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
        if current is not None:
            self._last_collective = current[:3]  # (op, seq, site): not a chain of every collective
        self._collective = None
        now = _monotonic()
        self._phase = name
        if name in LONG_PHASES:
            self._interval_from = None
        self._phase_mono = self._progress_mono = now

    def leave(self, name: str, add: int = 0) -> None:
        """Back to phase ``name`` after a wrapped call, which was progress: as :meth:`phase`
        (not written now) then :meth:`auto_progress` (``add``) with one clock read."""
        now = _monotonic()
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

    def add_sampler(self, sampler: Callable[[], dict[str, Any]]) -> None:
        """A function the heartbeat thread calls before each write; what it returns is merged
        into the record's metrics. It must be cheap and must never wait on the training thread."""
        self._samplers.append(sampler)

    def gpu_memory(self, gpu: Any) -> None:
        self._gpu = gpu

    def set_gpu_sampler(self, sampler: Callable[[], Any] | None) -> None:
        self._gpu_sampler = sampler

    @property
    def samples_gpu(self) -> bool:
        """Whether the record samples a GPU's memory (a sampler is set)."""
        return self._gpu_sampler is not None

    def has_metric(self, name: str) -> bool:
        return name in self._metrics

    @classmethod
    def forget_current(cls) -> None:
        """This process has no reporter of its own any more (a forked child: its parent's is not it)."""
        cls._current = None

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

    def fail(self, error: str | BaseException, exit_code: int | None = None, *, site: str | None = None) -> None:
        """Mark the process failed with ``error`` and write the record at once."""
        if isinstance(error, BaseException):
            error, exc_site = describe_exception(error)
            site = site or exc_site
        self._error = error
        self._error_site = site
        self._state = "failed"
        self._exit_code = exit_code
        # The last loss and logged values too: this may be the process's last write (a peer's
        # failure gets it killed before close()), and the heartbeat may not have sampled since
        # its last steps on a busy box. Samplers never wait (ups.instrument.metrics).
        self._sample_metrics()
        self.flush()

    def done(self, exit_code: int | None = 0) -> None:
        """Mark the process done and write the record at once."""
        if self._state != "failed":
            self._state = "done"
            self._exit_code = exit_code
            elapsed = time.time() - self._static["started_at"]
            if self._step and elapsed > 0:
                self._rate = self._step / elapsed  # the whole run's average, for the summary
            if self._phase != "done":
                self._phase = "done"
                self._phase_mono = time.monotonic()
            self._collective = None
        self.flush()

    def close(self) -> None:
        """Stop the heartbeat thread and write the final record (state as set)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread() and self._thread.is_alive():
            self._thread.join(timeout=2 * self.interval + 1)
        self._sample_metrics()
        try:
            self._history_tick()
        except Exception:  # noqa: BLE001
            pass
        self.flush()
        if self._history is not None:
            self._history.maybe_write(force=True)

    def __enter__(self) -> Reporter:
        return self.start()

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is None or self._state != "running":
            if self._state == "running":
                self.done()
        else:
            code = exc.code if isinstance(exc, SystemExit) and isinstance(exc.code, int) else 1
            if isinstance(exc, SystemExit) and code == 0:
                self.done()
            else:
                self.fail(exc, exit_code=code)
        self.close()

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

    @property
    def stack_signal(self) -> int | None:
        return self._stack_signal

    @property
    def pid(self) -> int:
        return self._static["pid"]

    @property
    def rank(self) -> int | None:
        return self._static["rank"]

    def record_dict(self) -> dict[str, Any]:
        """The record as it would be written now (the keys of StatusRecord)."""
        gpu = self._gpu
        now, mono = time.time(), time.monotonic()
        wall = now - mono  # CLOCK_MONOTONIC -> UNIX time, for the times the hot path keeps
        phase_mono, progress_mono, item = self._phase_mono, self._progress_mono, self.current_item
        return {
            **self._static,
            "phase": self._phase,
            "phase_at": phase_mono + wall,
            "phase_mono": phase_mono,
            "state": self._state,
            "step": self._step,
            "total": self._total,
            "unit": self._unit,
            "rate": self._rate,
            "progress_at": progress_mono + wall,
            "progress_mono": progress_mono,
            "heartbeat_at": now,
            "heartbeat_mono": mono,
            "item": item if item is None or type(item) is str else str(item),
            "gpu": None if gpu is None else {"device": gpu.device, "allocated": gpu.allocated,
                                             "reserved": gpu.reserved, "peak": gpu.peak},
            "metrics": dict(self._metrics),
            "error": self._error,
            "error_site": self._error_site,
            "stack_file": self._stack_rel,
            "stack_signal": self._stack_signal,
            "exit_code": self._exit_code,
            "collective": _collective_dict(self._collective, wall),
            "coll_seq": self._coll_seq,
            "interval_p99": self._p99,
        }

    def snapshot(self) -> Any:
        """The record as a :class:`~ups.status.record.StatusRecord` (tests, benchmarks)."""
        from ups.status.record import StatusRecord

        return StatusRecord.from_dict(self.record_dict())

    # -- writing ----------------------------------------------------------------------------
    def flush(self, *, wait: float = 0.0) -> bool:
        """Write the record now. Never raises. By default never waits for another writer: the
        heartbeat thread writes once more instead. ``wait`` (seconds) is for a write that must
        not be skipped because the heartbeat thread was writing at that moment: the last write
        of a process on its way out (``os._exit``), and the record written before a call that
        may block holding the GIL (h5py on a hung mount), after which the heartbeat thread
        cannot run to "write once more". Bounded, so a runs folder on a hung disk cannot stop
        the job."""
        if not (self._lock.acquire(timeout=wait) if wait > 0 else self._lock.acquire(blocking=False)):
            # The heartbeat thread is writing this very moment; have it write once more.
            self._dirty = True
            self._wake.set()
            return False
        try:
            self._dirty = False
            return self._write()
        finally:
            self._lock.release()

    def flush_if_older(self, seconds: float) -> bool:
        """Write now unless the record was written less than ``seconds`` ago: for a call that
        may block with the GIL held (a file write), at a bounded cost when it is frequent."""
        if time.monotonic() - self._written_mono < seconds:
            return False
        return self.flush()

    def _write(self) -> bool:
        self._written_mono = time.monotonic()
        if self._run_dir_id is not None and folder_identity(self.run_dir) not in (self._run_dir_id, None):
            self._warn(f"run folder {self.run_dir} was replaced by another folder: this process's record is no "
                       "longer written; the job continues")
            return False
        try:
            data = json.dumps(self.record_dict(), separators=(",", ":"), default=str).encode()
            # status/ made when missing, and opened, never through a link (ups.status.confined);
            # a vanished run folder is never made again.
            status = make_dirs(self.run_dir, "status")
            try:
                write_atomic(in_folder(status, os.path.basename(self.path)), data)
            finally:
                os.close(status)
        except Exception as exc:  # noqa: BLE001 - reporting must never kill the job
            self._warn(f"cannot write status record {self.path}: {exc}; the job continues")
            return False
        if self._warned:
            self._warned = False
            self._say(f"status record {self.path} is being written again")
        return True

    def _update_p99(self) -> None:
        if len(self._intervals) >= 8:
            ordered = sorted(self._intervals)
            self._p99 = round(ordered[int(0.99 * (len(ordered) - 1))], 4)

    def _update_rate(self, now: float) -> None:
        samples = self._samples
        samples.append((now, self._step))
        while len(samples) > 2 and now - samples[0][0] > RATE_WINDOW_S:
            samples.popleft()
        t0, s0 = samples[0]
        if now - t0 >= 0.5 and self._step:
            self._rate = max(0.0, (self._step - s0) / (now - t0))

    def _sample_gpu(self) -> None:
        if self._gpu_sampler is None:
            return
        try:
            self._gpu = self._gpu_sampler()
        except Exception:  # noqa: BLE001 - a broken sampler must not stop heartbeats
            self._gpu_sampler = None

    def _sample_metrics(self) -> None:
        for sampler in list(self._samplers):
            try:
                values = sampler()
            except Exception:  # noqa: BLE001 - a broken sampler must not stop heartbeats
                self._samplers.remove(sampler)
                continue
            if values:
                trace = values.pop(LOSS_TRACE, None)
                if trace:
                    self._trace.extend(trace)  # for the series (every step), not the record
                self._metrics.update(values)

    def _history_tick(self) -> None:
        """One point of the process's series per tick in which it moved; the file every few s."""
        history = self._history
        if history is None and not self._history_wanted:
            return
        m, gpu = self._metrics, self._gpu
        loss = m.get("loss")
        if not self._step and loss is None:
            return
        if history is None:
            from ups.status.series import SeriesWriter

            history = self._history = SeriesWriter(self.run_dir, self.name, attempt=_env_int(ENV_ATTEMPT) or 1)
        trace = list(self._trace)
        self._trace.clear()
        history.add({"t": time.time(), "step": self._step, "loss": _number(loss), "lr": _number(m.get("lr")),
                     "grad_norm": _number(m.get("grad_norm")), "rate": self._rate, "sps": m.get("samples_per_s"),
                     "tps": m.get("tokens_per_s"), "mem": getattr(gpu, "allocated", None)}, steps=trace)
        if isinstance(m.get("loss_nonfinite"), dict):
            history.note_nonfinite(m["loss_nonfinite"])
        history.maybe_write()

    def _run(self) -> None:
        # An observer from outside (ups.launch.proof) leaves this thread's own CPU and I/O out
        # of what the process does: its id is in the record, and its name says what it is.
        self._static["heartbeat_tid"] = threading.get_native_id()
        _name_this_thread(b"ups-heartbeat")
        while not self._stop.is_set():
            self._wake.wait(self.interval)
            self._wake.clear()
            if self._stop.is_set():
                break
            self._update_rate(time.monotonic())
            self._update_p99()
            self._sample_gpu()
            self._sample_metrics()
            try:
                self._history_tick()
            except Exception:  # noqa: BLE001 - history is a bonus; heartbeats are not
                self._history, self._history_wanted = None, False
            self._check_stack_handler()
            with self._lock:
                self._dirty = False
                self._write()

    def _warn(self, message: str) -> None:
        if not self._warned:
            self._warned = True
            self._say(message)

    def _say(self, message: str) -> None:
        try:
            print(f"ups: {message}", file=self._stderr or sys.stderr, flush=True)
        except Exception:  # noqa: BLE001
            pass


def _collective_dict(current: tuple | None, wall: float) -> dict[str, Any] | None:
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


def _number(value: Any) -> Any:
    """A metric as a series cell: numbers as they are, ``"nan"``/``"inf"`` kept, else None."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value
    if value in ("nan", "inf", "-inf"):
        return float(value)
    return None


class NullReporter:
    """Same interface as :class:`Reporter`, does nothing (job run outside ``ups``)."""

    name = "null"
    step = 0
    state = "running"
    stack_signal = None
    current_phase = "start"

    def __getattr__(self, _name: str) -> Callable[..., None]:
        return lambda *a, **k: None

    def start(self) -> NullReporter:
        return self

    def __enter__(self) -> NullReporter:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


def _name_this_thread(name: bytes) -> None:
    """The calling thread's name in /proc (prctl PR_SET_NAME; Linux only, best effort)."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(15, ctypes.c_char_p(name[:15]), 0, 0, 0)
    except (OSError, AttributeError, ImportError):
        pass
