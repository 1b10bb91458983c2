"""Reporter: the status writer used inside jobs (and, through ups.instrument, any program).

The Reporter is a facade composed by idea (see docs/architecture.md):

* :mod:`ups.status.counters` — the record's counters in memory (step, phase, collective,
  metrics) and their hot path: a base class of the Reporter, so ``advance()`` stays attribute
  stores on the Reporter itself (it costs well under 2 µs), no I/O, no lock.
* :mod:`ups.status.limits` — what the process learns of its rhythm: the learned stall limit
  (p99 of the gaps between progress) and the recent rate.
* :mod:`ups.status.samplers` — the metric and GPU samplers and the metrics history.
* :mod:`ups.status.heartbeat` — the daemon thread that writes the record about once a second,
  atomically, and never kills or blocks the job. Heartbeat (the write) and progress
  (``advance``) are separate clocks, so a stuck main loop shows as fresh heartbeat + stale
  progress.
* :mod:`ups.status.stackdump` — faulthandler for fatal signals and the stack-dump signal,
  writing to ``stacks/<name>.txt``; the record says which signal.

``phase()`` writes at once (unless ``flush=False``), so a crash right after a phase change
shows that phase (see docs/design.md, "The run directory").

Every instrumented process pays for importing this module, so it and its parts import only
the standard library's light modules and :mod:`ups.status.schema` (no dataclasses, pathlib,
psutil): the record is written as a dict with the keys of
:class:`ups.status.record.StatusRecord` (a test keeps the two the same).
"""

from __future__ import annotations

import os
import time

from ups.status.counters import RecordCounters, collective_dict
from ups.status.exceptions import describe_exception
from ups.status.heartbeat import HeartbeatWriter
from ups.status.identity import (
    ProcessIdentity,
    env_int,
    placement_from_env,
    record_identity,
    relabel_identity,
)
from ups.status.limits import RateWindow, learned_p99
from ups.status.samplers import Samplers
from ups.status.schema import process_name
from ups.status.stackdump import DEFAULT_STACK_SIGNAL, ENV_STACK_SIGNAL, StackDumps
from ups.status.steptime import StepWindow

ENV_RUN_DIR = "UPS_RUN_DIR"
ENV_RUN_ID = "UPS_RUN_ID"
ENV_WORKER_ID = "UPS_WORKER_ID"
ENV_ROLE = "UPS_ROLE"

TYPE_CHECKING = False  # typing costs ~10 ms to import; annotations here are strings
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any


class Reporter(ProcessIdentity, RecordCounters):
    """Writes this process's status record to ``<run_dir>/status/<name>.json``.

    Use as a context manager; leaving it normally marks the record ``done``, leaving with
    an exception marks it ``failed`` with the exception text.
    """

    def __init__(self, run_dir: str | os.PathLike[str], *, role: str = "rank", run_id: str | None = None,
                 rank: int | None = None, local_rank: int | None = None, world_size: int | None = None,
                 worker: int | None = None, loader: int | None = None, node: int | None = None,
                 total: int | None = None, unit: str = "items", phase: str = "start", interval: float = 1.0,
                 stack_signal: int | None = DEFAULT_STACK_SIGNAL, gpu_sampler: Callable[[], Any] | None = None,
                 stderr: Any = None, command: str | None = None, name: str | None = None) -> None:
        self.run_dir = os.fspath(run_dir)
        self.role = role
        pid = os.getpid()
        self.name = name or process_name(role, rank, worker, loader=loader, pid=pid, node=node)
        now, mono = time.time(), time.monotonic()
        self._static = record_identity(
            run_id=run_id or os.environ.get(ENV_RUN_ID) or os.path.basename(os.path.normpath(self.run_dir)),
            role=role, name=self.name, pid=pid, rank=rank, local_rank=local_rank, world_size=world_size,
            worker=worker, loader=loader, node=node, interval=interval, command=command, now=now, mono=mono)
        RecordCounters.__init__(self, phase=phase, total=total, unit=unit, mono=mono)
        self._gpu: Any = None
        self._error: str | None = None
        self._error_site: str | None = None
        self._exit_code: int | None = None
        self._rates = RateWindow()
        self._step_window = StepWindow() if role == "rank" else None
        self.heartbeat = HeartbeatWriter(self.run_dir, os.path.join(self.run_dir, "status", f"{self.name}.json"),
                                         interval, record=self.record_dict, tick=self._tick, stderr=stderr)
        # Training metrics read off the training thread (ups.instrument.metrics), the GPU's
        # memory, and the process's bounded history of them (ups.status.series).
        self.samplers = Samplers(self.run_dir, gpu_sampler, history=role == "rank")
        self.stacks = StackDumps()
        if stack_signal is not None:
            env_sig = env_int(ENV_STACK_SIGNAL)
            problem = self.stacks.install(self.run_dir, self.name, env_sig if env_sig is not None else stack_signal)
            if problem:
                self.heartbeat.warn(problem)

    @property
    def path(self) -> str:
        """The record's file, ``<run_dir>/status/<name>.json``."""
        return self.heartbeat.path

    @property
    def interval(self) -> float:
        """Seconds between heartbeat writes."""
        return self.heartbeat.interval

    @interval.setter
    def interval(self, seconds: float) -> None:
        self.heartbeat.interval = seconds

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
            worker = env_int(ENV_WORKER_ID)
        if role is None:
            role = "worker" if worker is not None else os.environ.get(ENV_ROLE, "rank")
        placement_from_env(kwargs)
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
        with self.heartbeat.lock:
            old_path = self.path
            self.role = role
            relabel_identity(self._static, role=role, name=new_name, rank=rank, local_rank=local_rank,
                             world_size=world_size, command=command)
            if phase is not None:
                self._phase = phase
                self._phase_mono = time.monotonic()
            if unit is not None:
                self._unit = unit
            changed = new_name != self.name
            if changed:
                self.stacks.rename(self.run_dir, new_name)
            self.name = new_name
            self.heartbeat.path = os.path.join(self.run_dir, "status", f"{new_name}.json")
            written = self.heartbeat.write()
            if changed and written:
                try:
                    os.unlink(old_path)
                except OSError:
                    pass
        return changed

    # -- stack dumps (ups.status.stackdump) ---------------------------------------------------
    def rearm_fatal_handler(self) -> None:
        """Put faulthandler back in front for fatal signals, after a library (``import torch``)
        installed its own SIGSEGV handler over it (:meth:`StackDumps.rearm_fatal_handler`)."""
        self.stacks.rearm_fatal_handler()

    def append_stack_text(self, text: str) -> None:
        """Append text (a traceback) to this process's stack file; never raises."""
        self.stacks.append_text(text)

    # -- the job-facing API ---------------------------------------------------------------
    def start(self) -> Reporter:
        """Write the first record and start the heartbeat thread (idempotent)."""
        if self.heartbeat.thread is None:
            self.flush()
            self.heartbeat.start(f"ups-reporter-{self.name}")
        return self

    def add_sampler(self, sampler: Callable[[], dict[str, Any]]) -> None:
        """A function the heartbeat thread calls before each write; what it returns is merged
        into the record's metrics. It must be cheap and must never wait on the training thread."""
        self.samplers.metric_samplers.append(sampler)

    def gpu_memory(self, gpu: Any) -> None:
        self._gpu = gpu

    def set_gpu_sampler(self, sampler: Callable[[], Any] | None) -> None:
        self.samplers.set_gpu_sampler(sampler)

    @property
    def samples_gpu(self) -> bool:
        """Whether the record samples a GPU's memory (a sampler is set)."""
        return self.samplers.samples_gpu

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
        self.samplers.sample_metrics(self._metrics)
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
        self.heartbeat.stop()
        self.samplers.sample_metrics(self._metrics)
        try:
            self.samplers.history_tick(self.name, self._step, self._metrics, self._gpu, self._rate)
        except Exception:  # noqa: BLE001
            pass
        self.flush()
        self.samplers.write_history()

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
    def stack_signal(self) -> int | None:
        return self.stacks.signal

    def record_dict(self) -> dict[str, Any]:
        """The record as it would be written now (the keys of StatusRecord)."""
        gpu = self._gpu
        now, mono = time.time(), time.monotonic()
        wall = now - mono  # CLOCK_MONOTONIC -> UNIX time, for the times the hot path keeps
        phase_mono, progress_mono, item = self._phase_mono, self._progress_mono, self.current_item
        return {
            **self._static,
            "heartbeat_tid": self.heartbeat.tid,
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
            "stack_file": self.stacks.rel,
            "stack_signal": self.stacks.signal,
            "exit_code": self._exit_code,
            "collective": collective_dict(self._collective, wall),
            "coll_seq": self._coll_seq,
            "interval_p99": self._p99,
        }

    def snapshot(self) -> Any:
        """The record as a :class:`~ups.status.record.StatusRecord` (tests, benchmarks)."""
        from ups.status.record import StatusRecord

        return StatusRecord.from_dict(self.record_dict())

    # -- writing (ups.status.heartbeat) ------------------------------------------------------
    def flush(self, *, wait: float = 0.0) -> bool:
        """Write the record now. Never raises; waits at most ``wait`` seconds for the heartbeat
        thread's write (:meth:`HeartbeatWriter.flush`)."""
        return self.heartbeat.flush(wait=wait)

    def flush_if_older(self, seconds: float) -> bool:
        """Write now unless the record was written less than ``seconds`` ago: for a call that
        may block with the GIL held (a file write), at a bounded cost when it is frequent."""
        return self.heartbeat.flush_if_older(seconds)

    def _tick(self) -> None:
        """What the heartbeat thread does before each write."""
        rate = self._rates.update(time.monotonic(), self._step)
        if rate is not None:
            self._rate = rate
        p99 = learned_p99(self._intervals)
        if p99 is not None:
            self._p99 = p99
        self._gpu = self.samplers.sample_gpu(self._gpu)
        self.samplers.sample_metrics(self._metrics)
        if self._step_window is not None and self.step_parts:
            parts = self._step_window.summary(self.step_parts, self.step_tid)
            if parts is None:
                self._metrics.pop("step_parts", None)
            else:
                self._metrics["step_parts"] = parts
        try:
            self.samplers.history_tick(self.name, self._step, self._metrics, self._gpu, self._rate)
        except Exception:  # noqa: BLE001 - history is a bonus; heartbeats are not
            self.samplers.drop_history()
        self.stacks.check_handler()


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

