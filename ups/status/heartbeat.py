"""The heartbeat writer: the Reporter's record (:mod:`ups.status.reporter`) written about once
a second by a daemon thread, and at once on demand.

Writes are atomic (temp file in the same folder, then ``os.replace``): readers never see a
torn record, and a process that dies leaves its last record behind. Reporting never kills or
blocks the job: any OSError (run folder gone, disk full) is reported once on stderr and the
write is retried on the next tick. Imported by every instrumented process: standard library's
light modules only.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

from ups.status.confined import in_folder, make_dirs
from ups.status.files import folder_identity, write_atomic

TYPE_CHECKING = False  # typing costs ~10 ms to import; annotations here are strings
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any


class HeartbeatWriter:
    """Writes ``record()`` to ``path`` (inside ``run_dir``): from its thread every ``interval``
    seconds after ``tick()``, or now (:meth:`flush`). ``lock`` is held by whoever writes."""

    def __init__(self, run_dir: str, path: str, interval: float, *, record: Callable[[], dict[str, Any]],
                 tick: Callable[[], None], stderr: Any = None) -> None:
        self.run_dir = run_dir
        self.run_dir_id = folder_identity(run_dir)  # a run folder replaced by another is not ours to write
        self.path = path
        self.interval = interval
        self.record = record
        self.tick = tick
        self.stderr = stderr
        self.lock = threading.Lock()
        self.dirty = False
        self.wake = threading.Event()
        self.stopping = threading.Event()
        self.thread: threading.Thread | None = None
        self.tid: int | None = None  # the thread's native id, once it runs
        self.warned = False
        self.written_mono = 0.0

    def start(self, name: str) -> None:
        """Start the thread (once)."""
        if self.thread is None:
            self.thread = threading.Thread(target=self.run, name=name, daemon=True)
            self.thread.start()

    def stop(self) -> None:
        """Stop the thread, waiting for it a bounded time (never for itself)."""
        self.stopping.set()
        self.wake.set()
        thread = self.thread
        if thread is not None and thread is not threading.current_thread() and thread.is_alive():
            thread.join(timeout=2 * self.interval + 1)

    def flush(self, *, wait: float = 0.0) -> bool:
        """Write the record now. Never raises. By default never waits for another writer: the
        heartbeat thread writes once more instead. ``wait`` (seconds) is for a write that must
        not be skipped because the heartbeat thread was writing at that moment: the last write
        of a process on its way out (``os._exit``), and the record written before a call that
        may block holding the GIL (h5py on a hung mount), after which the heartbeat thread
        cannot run to "write once more". Bounded, so a runs folder on a hung disk cannot stop
        the job."""
        if not (self.lock.acquire(timeout=wait) if wait > 0 else self.lock.acquire(blocking=False)):
            # The heartbeat thread is writing this very moment; have it write once more.
            self.dirty = True
            self.wake.set()
            return False
        try:
            self.dirty = False
            return self.write()
        finally:
            self.lock.release()

    def flush_if_older(self, seconds: float) -> bool:
        """Write now unless the record was written less than ``seconds`` ago: for a call that
        may block with the GIL held (a file write), at a bounded cost when it is frequent."""
        if time.monotonic() - self.written_mono < seconds:
            return False
        return self.flush()

    def write(self) -> bool:
        """Write the record (the caller holds ``lock``); never raises."""
        self.written_mono = time.monotonic()
        if self.run_dir_id is not None and folder_identity(self.run_dir) not in (self.run_dir_id, None):
            self.warn(f"run folder {self.run_dir} was replaced by another folder: this process's record is no "
                      "longer written; the job continues")
            return False
        try:
            data = json.dumps(self.record(), separators=(",", ":"), default=str).encode()
            # status/ made when missing, and opened, never through a link (ups.status.confined);
            # a vanished run folder is never made again.
            status = make_dirs(self.run_dir, "status")
            try:
                write_atomic(in_folder(status, os.path.basename(self.path)), data)
            finally:
                os.close(status)
        except Exception as exc:  # noqa: BLE001 - reporting must never kill the job
            self.warn(f"cannot write status record {self.path}: {exc}; the job continues")
            return False
        if self.warned:
            self.warned = False
            self.say(f"status record {self.path} is being written again")
        return True

    def run(self) -> None:
        # An observer from outside (ups.launch.proof) leaves this thread's own CPU and I/O out
        # of what the process does: its id is in the record, and its name says what it is.
        self.tid = threading.get_native_id()
        name_this_thread(b"ups-heartbeat")
        while not self.stopping.is_set():
            self.wake.wait(self.interval)
            self.wake.clear()
            if self.stopping.is_set():
                break
            self.tick()
            with self.lock:
                self.dirty = False
                self.write()

    def warn(self, message: str) -> None:
        """Say ``message`` once, until a write succeeds again."""
        if not self.warned:
            self.warned = True
            self.say(message)

    def say(self, message: str) -> None:
        try:
            print(f"ups: {message}", file=self.stderr or sys.stderr, flush=True)
        except Exception:  # noqa: BLE001
            pass


def name_this_thread(name: bytes) -> None:
    """The calling thread's name in /proc (Linux only, best effort), written to its own
    ``/proc/thread-self/comm``: no import here. This runs first in the heartbeat thread, while
    the program's main thread may be importing torch, which imports ctypes: on Python < 3.15 two
    threads importing the same module can hand one of them a partly initialised module (CPython
    gh-83065), and torchrun's agent once failed with "module 'ctypes' has no attribute 'CDLL'"
    when this thread imported ctypes to call prctl."""
    try:
        with open("/proc/thread-self/comm", "wb", buffering=0) as f:
            f.write(name[:15])
    except OSError:
        pass
