"""Reporter: the status writer used inside jobs.

Design points (see DESIGN.md, "the run directory"):

* ``advance()`` only bumps counters in memory (it costs well under 2 µs); a daemon thread
  writes the record about once a second. Heartbeat (the write) and progress (``advance``)
  are separate clocks, so a stuck main loop shows as fresh heartbeat + stale progress.
* ``phase()`` writes at once, so a crash right after a phase change shows that phase.
* Writes are atomic (temp file in the same folder, then ``os.replace``): readers never see
  a torn record, and a process that dies leaves its last record behind.
* Reporting never kills or blocks the job: any OSError (run folder gone, disk full) is
  reported once on stderr and the write is retried on the next tick.
* faulthandler is registered for fatal signals and for a user signal (SIGUSR1 by default),
  writing to ``stacks/<name>.txt``; the record says which signal, so tools only send it to
  processes that registered it (by default that signal kills a Python process).
"""

from __future__ import annotations

import collections
import faulthandler
import os
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ups.status.procs import this_process_start
from ups.status.record import GpuMemory, StatusRecord, process_name

ENV_RUN_DIR = "UPS_RUN_DIR"
ENV_RUN_ID = "UPS_RUN_ID"
ENV_WORKER_ID = "UPS_WORKER_ID"
ENV_ROLE = "UPS_ROLE"
ENV_STACK_SIGNAL = "UPS_STACK_SIGNAL"
DEFAULT_STACK_SIGNAL = signal.SIGUSR1
RATE_WINDOW_S = 10.0


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        return None


def write_atomic(path: Path, data: bytes, *, write: Callable[[int, Any], int] = os.write) -> None:
    """Write ``data`` to ``path`` via a temp file in the same folder and ``os.replace``.

    On failure the temp file is removed and the OSError propagates; ``path`` keeps its old
    content. ``write`` is the low-level write call (fault injection replaces it).
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:
                written = write(fd, view)
                view = view[written:]
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


class Reporter:
    """Writes this process's status record to ``<run_dir>/status/<name>.json``.

    Use as a context manager; leaving it normally marks the record ``done``, leaving with
    an exception marks it ``failed`` with the exception text.
    """

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
        total: int | None = None,
        unit: str = "items",
        phase: str = "start",
        interval: float = 1.0,
        stack_signal: int | None = DEFAULT_STACK_SIGNAL,
        gpu_sampler: Callable[[], GpuMemory | None] | None = None,
        stderr: Any = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.role = role
        self.name = process_name(role, rank, worker)
        self.path = self.run_dir / "status" / f"{self.name}.json"
        self.interval = interval
        self._stderr = stderr if stderr is not None else sys.stderr
        self._gpu_sampler = gpu_sampler
        now = time.time()
        self._static = dict(
            run_id=run_id or os.environ.get(ENV_RUN_ID) or self.run_dir.name,
            role=role,
            name=self.name,
            pid=os.getpid(),
            pid_start=this_process_start(),
            host=socket.gethostname(),
            rank=rank,
            local_rank=local_rank,
            world_size=world_size,
            worker=worker,
            started_at=now,
            heartbeat_interval=interval,
        )
        # Mutable state: plain attributes, updated by the job's thread, read by the writer.
        self._phase = phase
        self._phase_at = now
        self._state = "running"
        self._step = 0
        self._total = total
        self._unit = unit
        self._progress_at = now
        self._item: str | None = None
        self._metrics: dict[str, Any] = {}
        self._gpu: GpuMemory | None = None
        self._error: str | None = None
        self._exit_code: int | None = None
        self._rate: float | None = None
        self._samples: collections.deque[tuple[float, int]] = collections.deque()
        # Writer machinery.
        self._lock = threading.Lock()
        self._dirty = False
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._warned = False
        self._stack_fh: Any = None
        self._stack_signal: int | None = None
        self._stack_rel: str | None = None
        if stack_signal is not None:
            env_sig = _env_int(ENV_STACK_SIGNAL)
            self._install_stack_dumps(env_sig if env_sig is not None else stack_signal)

    # -- construction from the environment ----------------------------------------------
    @classmethod
    def from_env(
        cls,
        *,
        role: str | None = None,
        worker: int | None = None,
        **kwargs: Any,
    ) -> Reporter | NullReporter:
        """A Reporter for this process from ``UPS_RUN_DIR``, ``RANK``, ``LOCAL_RANK``,
        ``WORLD_SIZE`` (and ``UPS_WORKER_ID`` or ``worker`` for DataLoader workers).

        Without ``UPS_RUN_DIR`` (a job run by hand, outside ``ups launch``) this returns a
        :class:`NullReporter` with the same methods, so job code never needs a branch.
        """
        run_dir = os.environ.get(ENV_RUN_DIR)
        if not run_dir:
            return NullReporter()
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

    # -- faulthandler ---------------------------------------------------------------------
    def _install_stack_dumps(self, signum: int) -> None:
        stacks = self.run_dir / "stacks"
        try:
            stacks.mkdir(parents=True, exist_ok=True)
            self._stack_fh = open(stacks / f"{self.name}.txt", "a", buffering=1)  # noqa: SIM115
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

    def advance(self, n: int = 1) -> None:
        """Count ``n`` units of work done. Cheap: no I/O, no lock."""
        self._step += n
        self._progress_at = time.time()

    def set_step(self, step: int) -> None:
        """Set the absolute step (e.g. after resuming); counts as progress."""
        self._step = step
        self._progress_at = time.time()

    def set_total(self, total: int | None, unit: str | None = None) -> None:
        self._total = total
        if unit is not None:
            self._unit = unit

    def phase(self, name: str, *, flush: bool = True) -> None:
        """Enter a phase (``dist.init``, ``data.open``, ``encode`` ...).

        Written at once by default, so a crash right after the change shows it. Phases that
        change many times a second (one per sample or per batch) pass ``flush=False``: the
        heartbeat thread writes them within ``interval``, and the hot path does no I/O.
        """
        now = time.time()
        self._phase = name
        self._phase_at = now
        self._progress_at = now  # a phase change is progress: the loop moved on
        if flush:
            self.flush()

    def item(self, desc: str | None) -> None:
        """The item being worked on now, e.g. ``"burgers1d_train.h5#17"``."""
        self._item = desc

    def metrics(self, **values: Any) -> None:
        """Merge free-form metrics (loss, lr, ...) into the record."""
        self._metrics.update(values)

    def gpu_memory(self, gpu: GpuMemory | None) -> None:
        self._gpu = gpu

    def fail(self, error: str | BaseException, exit_code: int | None = None) -> None:
        """Mark the process failed with ``error`` and write the record at once."""
        if isinstance(error, BaseException):
            error = _describe_exception(error)
        self._error = error
        self._state = "failed"
        self._exit_code = exit_code
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
                self._phase_at = time.time()
        self.flush()

    def close(self) -> None:
        """Stop the heartbeat thread and write the final record (state as set)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2 * self.interval + 1)
        self.flush()

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
    def stack_signal(self) -> int | None:
        return self._stack_signal

    def snapshot(self) -> StatusRecord:
        """The record as it would be written now."""
        return StatusRecord(
            **self._static,
            phase=self._phase,
            phase_at=self._phase_at,
            state=self._state,
            step=self._step,
            total=self._total,
            unit=self._unit,
            rate=self._rate,
            progress_at=self._progress_at,
            heartbeat_at=time.time(),
            item=self._item,
            gpu=self._gpu,
            metrics=dict(self._metrics),
            error=self._error,
            stack_file=self._stack_rel,
            stack_signal=self._stack_signal,
            exit_code=self._exit_code,
        )

    # -- writing ----------------------------------------------------------------------------
    def flush(self) -> bool:
        """Write the record now. Never raises, never waits for another writer."""
        if not self._lock.acquire(blocking=False):
            # The heartbeat thread is writing this very moment; have it write once more.
            self._dirty = True
            self._wake.set()
            return False
        try:
            self._dirty = False
            return self._write()
        finally:
            self._lock.release()

    def _write(self) -> bool:
        try:
            data = self.snapshot().to_json().encode()
            try:
                write_atomic(self.path, data)
            except FileNotFoundError:
                # status/ may not exist yet for a fresh run dir; never recreate a vanished run.
                if not self.run_dir.is_dir():
                    raise
                self.path.parent.mkdir(exist_ok=True)
                write_atomic(self.path, data)
        except Exception as exc:  # noqa: BLE001 - reporting must never kill the job
            self._warn(f"cannot write status record {self.path}: {exc}; the job continues")
            return False
        if self._warned:
            self._warned = False
            self._say(f"status record {self.path} is being written again")
        return True

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

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval)
            self._wake.clear()
            if self._stop.is_set():
                break
            self._update_rate(time.time())
            self._sample_gpu()
            with self._lock:
                self._dirty = False
                self._write()

    def _warn(self, message: str) -> None:
        if not self._warned:
            self._warned = True
            self._say(message)

    def _say(self, message: str) -> None:
        try:
            print(f"ups: {message}", file=self._stderr, flush=True)
        except Exception:  # noqa: BLE001
            pass


class NullReporter:
    """Same interface as :class:`Reporter`, does nothing (job run outside ``ups``)."""

    name = "null"
    step = 0
    stack_signal = None

    def __getattr__(self, _name: str) -> Callable[..., None]:
        return lambda *a, **k: None

    def start(self) -> NullReporter:
        return self

    def __enter__(self) -> NullReporter:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


def _describe_exception(exc: BaseException) -> str:
    """``Type: message`` plus the innermost frame, short enough for a table cell."""
    text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    tb = exc.__traceback__
    last = None
    while tb is not None:
        last = tb
        tb = tb.tb_next
    if last is not None:
        code = last.tb_frame.f_code
        text += f" (at {Path(code.co_filename).name}:{last.tb_lineno} in {code.co_name})"
    return text
