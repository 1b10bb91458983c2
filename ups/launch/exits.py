"""Exit truth: when each process of a run ended, and whether it ended normally.

torchrun blames the rank that failed *first as torchrun saw it*. When rank 1 leaves with
``os._exit(0)`` mid-training, its exit code is 0, rank 0 then dies in its next collective,
and torchrun names rank 0. The supervisor knows better: it watches every process that has
a status record and notes the moment each one ends (``pidfd``: the kernel says so at once,
no polling), and reads its record right then. A record that still says ``running`` after
its process ended means the interpreter never exited normally (``os._exit``, a signal).
The root cause is the earliest process to end abnormally.

Each end is appended to the run's event log as ``process.exit`` (so ``ups why``, the console
and a later reader see the same facts) and kept in memory for the run's final state.
"""

from __future__ import annotations

import os
import select
import threading
import time

from ups.runs.exits import ProcessExit
from ups.runs.rundir import RunDir
from ups.status.host import boot_id, hostname
from ups.status.procs import process_start_time, same_start
from ups.status.reader import read_record_file, read_status_dir
from ups.status.record import RecordError, StatusRecord

SCAN_S = 0.25  # how often new records are looked for (a few files for a small run)
SLOW_SCAN_S = 2.0  # above LARGE records: reading thousands of files 4 times a second is waste
LARGE = 128


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)  # type: ignore[attr-defined]
    except (AttributeError, OSError):
        return None


class ExitWatcher:
    """Watches from a daemon thread of the supervisor; ``stop()`` it and read ``exits``."""

    def __init__(self, run: RunDir, *, actor: str = "launcher") -> None:
        self.run = run
        self.actor = actor
        self.exits: dict[str, ProcessExit] = {}
        self._watched: dict[tuple[str, int], int | None] = {}  # (name, pid) -> pidfd
        self._halt = threading.Event()
        self._lock = threading.Lock()
        self._poll = select.poll()
        self._by_fd: dict[int, StatusRecord] = {}
        self._thread = threading.Thread(target=self._watch, name="ups-exit-watcher", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop watching; one last scan finds processes that ended since the last one."""
        self._halt.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        for fd, _ in self._poll.poll(0):  # ends that happened during the last poll
            self._ended(fd)
        self.scan()
        self._check_unwatchable()

    def _watch(self) -> None:
        next_scan = 0.0
        while not self._halt.is_set():
            now = time.monotonic()
            if now >= next_scan:
                n = self.scan()
                next_scan = now + (SLOW_SCAN_S if n > LARGE else SCAN_S)
            for fd, _ in self._poll.poll(100):
                self._ended(fd)
            self._check_unwatchable()

    # -- discovering processes ---------------------------------------------------------
    def scan(self) -> int:
        snap = read_status_dir(self.run.status_dir)
        here = hostname()
        for rec in snap.records:
            if rec.role == "launcher" or (rec.name, rec.pid) in self._watched or rec.host != here:
                continue  # another node's processes are that node's launcher's to watch
            if self._renamed(rec):
                continue
            if rec.state != "running":
                # Ended normally before we ever saw it running: a clean exit, time from its record.
                self._note(rec, rec, at=rec.heartbeat_at, exact=False)
                self._watched[(rec.name, rec.pid)] = None
                continue
            fd = _pidfd(rec.pid)
            if fd is not None and same_start(process_start_time(rec.pid), rec.pid_start):
                self._watched[(rec.name, rec.pid)] = fd
                self._by_fd[fd] = rec
                self._poll.register(fd, select.POLLIN)
            else:
                if fd is not None:
                    os.close(fd)
                self._watched[(rec.name, rec.pid)] = None  # gone already, or no pidfd: polled
        return len(snap.records)

    def _renamed(self, rec: StatusRecord) -> bool:
        """A process watched under its old name took a new one (a helper that became a rank
        when it joined a process group, mp.spawn's parent that stopped being rank 0): the same
        watch goes on under the new name, so its end is noted once, as what it turned out to be."""
        for fd, seen in list(self._by_fd.items()):
            if seen.pid == rec.pid and seen.name != rec.name and seen.pid_start == rec.pid_start:
                del self._watched[(seen.name, seen.pid)]
                self._watched[(rec.name, rec.pid)] = fd
                self._by_fd[fd] = rec
                return True
        return False

    def _check_unwatchable(self) -> None:
        """Processes without a pidfd (gone when found, or an old kernel): polled instead."""
        for (name, pid), fd in list(self._watched.items()):
            if fd is not None or name in self.exits and self.exits[name].pid == pid:
                continue
            rec = self._fresh_record(name)
            if rec is None or rec.pid != pid:
                continue
            if not same_start(process_start_time(pid), rec.pid_start):
                # Gone before we could watch it (an adopter arriving late, a loaded box): it
                # ended after its last heartbeat, and maybe long before now. Its last sign of
                # life keeps the order against peers whose exact ends came after it (ranks
                # that torchrun stopped because this one left); "now" could put it after them.
                self._note(rec, rec, at=min(time.time(), rec.heartbeat_at), exact=False)

    # -- an end ---------------------------------------------------------------------------
    def _ended(self, fd: int) -> None:
        at = time.time()
        rec = self._by_fd.pop(fd)
        try:
            self._poll.unregister(fd)
        finally:
            os.close(fd)
        self._watched[(rec.name, rec.pid)] = None
        final = self._fresh_record(rec.name)
        if final is None or final.pid != rec.pid:  # renamed since the last scan: find it by pid
            final = next((r for r in read_status_dir(self.run.status_dir).records
                          if r.pid == rec.pid and r.pid_start == rec.pid_start), None)
            if final is not None and final.name != rec.name:
                self._watched[(final.name, final.pid)] = None
                rec = final
        self._note(rec, final if final is not None and final.pid == rec.pid else rec, at=at, exact=True)

    def _fresh_record(self, name: str) -> StatusRecord | None:
        try:
            return read_record_file(self.run.status_dir / f"{name}.json")
        except RecordError:
            return None

    def _note(self, seen: StatusRecord, final: StatusRecord, *, at: float, exact: bool) -> None:
        with self._lock:
            if seen.name in self.exits and self.exits[seen.name].pid == seen.pid:
                return
            mono = time.monotonic() - (time.time() - at)
            end = ProcessExit(seen.name, seen.pid, seen.role, seen.rank, at, exact, final.state, final.phase,
                              final.step, final.error, final.exit_code, mono, boot_id())
            self.exits[seen.name] = end
        if not end.clean or end.record_state == "failed" or seen.role in ("rank", "agent"):
            # Every rank's end is a fact worth keeping; workers and helpers only when abnormal
            # (a DataLoader's workers end at every epoch).
            self.run.append_event("process.exit", actor=self.actor, **end.to_dict())


