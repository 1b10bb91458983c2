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

A run lasts days, and a DataLoader with non-persistent workers makes new ones every epoch:
the watcher's work per tick depends on the processes alive now, never on every process the
run has had. A process whose end is noted leaves every list (only the latest end of each
record name is kept, for the run's final state), and a record file is parsed only when it
changed (its inode, size and mtime), not every scan.

A worker's record file is reused by the next epoch's worker of the same slot, maybe before
this watcher reads the old one's end (a loaded box): the new record carries its
predecessor's final state (``metrics.previous``, written by ups.instrument.torch.data), so
a healthy end is never taken for a death. A worker that ended while its record still says
running is given a few seconds for its rank's word (the DataLoader knows a worker's exit
code and writes its final record, with the signal that killed it) before its end is noted
as it stands.
"""

from __future__ import annotations

import dataclasses
import os
import select
import threading
import time

from ups.runs.exits import ProcessExit
from ups.runs.rundir import RunDir
from ups.runs.signals import signal_name
from ups.status.host import boot_id, hostname
from ups.status.procs import process_start_time, same_start
from ups.status.reader import read_record_file
from ups.status.record import RecordError, StatusRecord

SCAN_S = 0.25  # how often new records are looked for (a few files for a small run)
SLOW_SCAN_S = 2.0  # above LARGE records: reading thousands of files 4 times a second is waste
LARGE = 128
WORKER_WORD_S = 10.0  # how long a worker's end waits for its rank's word (the DataLoader joins for 5 s)


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)  # type: ignore[attr-defined]
    except (AttributeError, OSError):
        return None


def predecessor(current: StatusRecord | None, seen: StatusRecord) -> StatusRecord | None:
    """``seen``'s final record as its successor in the same record file says it
    (``metrics.previous``: a DataLoader worker's slot reused by the next epoch's worker)."""
    prev = current.metrics.get("previous") if current is not None else None
    if not isinstance(prev, dict) or prev.get("pid") != seen.pid or not same_start(prev.get("pid_start"), seen.pid_start):
        return None
    return dataclasses.replace(seen, state=prev["state"], phase=prev.get("phase") or seen.phase,
                               step=prev.get("step", seen.step), error=prev.get("error"), exit_code=prev.get("exit_code"))


@dataclasses.dataclass
class _Pending:
    """An end whose record still said running: waiting for a word on how it ended."""

    seen: StatusRecord
    at: float
    exact: bool
    until: float  # monotonic deadline


class ExitWatcher:
    """Watches from a daemon thread of the supervisor; ``stop()`` it and read ``exits``."""

    def __init__(self, run: RunDir, *, actor: str = "launcher", worker_word_s: float = WORKER_WORD_S) -> None:
        self.run = run
        self.actor = actor
        self.worker_word_s = worker_word_s
        self.exits: dict[str, ProcessExit] = {}  # the latest end of each record name
        self._by_fd: dict[int, StatusRecord] = {}  # live processes watched through a pidfd
        self._polled: dict[tuple[str, int], StatusRecord] = {}  # live processes without a pidfd
        self._pending: dict[tuple[str, int], _Pending] = {}  # ended, record still running
        self._files: dict[str, tuple[tuple[int, int, int], StatusRecord | None]] = {}  # name -> (stat, record)
        self._halt = threading.Event()
        self._lock = threading.Lock()
        self._tick_lock = threading.Lock()
        self._poll = select.poll()
        self._next_scan = 0.0
        self._thread = threading.Thread(target=self._watch, name="ups-exit-watcher", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop watching; one last scan finds processes that ended since the last one."""
        self._halt.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        with self._tick_lock:
            for fd, _ in self._poll.poll(0):  # ends that happened during the last poll
                self._ended(fd)
            self.scan()
            self._check_polled()
            self._check_pending(final=True)

    def watching(self) -> int:
        """How many processes this watcher holds now (alive, or ended and awaiting a word):
        what each tick costs, and what a long run must keep flat."""
        return len(self._by_fd) + len(self._polled) + len(self._pending)

    def _watch(self) -> None:
        while not self._halt.is_set():
            self.tick()

    def tick(self, timeout_ms: int = 100) -> None:
        """One round: look for new records when due, wait up to ``timeout_ms`` for an end."""
        with self._tick_lock:
            now = time.monotonic()
            if now >= self._next_scan:
                n = self.scan()
                self._next_scan = now + (SLOW_SCAN_S if n > LARGE else SCAN_S)
        for fd, _ in self._poll.poll(timeout_ms):
            with self._tick_lock:
                if fd in self._by_fd:
                    self._ended(fd)
        with self._tick_lock:
            self._check_polled()
            self._check_pending()

    # -- reading records, once per change --------------------------------------------------
    def _record(self, name: str) -> StatusRecord | None:
        """The record of ``name`` as it is now (parsed again only when the file changed)."""
        path = self.run.status_dir / f"{name}.json"
        try:
            st = os.stat(path, follow_symlinks=False)
        except OSError:
            self._files.pop(name, None)
            return None
        return self._read(name, path, (st.st_ino, st.st_size, st.st_mtime_ns))[1]

    def _read(self, name: str, path: object, key: tuple[int, int, int]) -> tuple[bool, StatusRecord | None]:
        """(changed since last read, the record)."""
        cached = self._files.get(name)
        if cached is not None and cached[0] == key:
            return False, cached[1]
        try:
            rec: StatusRecord | None = read_record_file(path)  # type: ignore[arg-type]
        except RecordError:
            rec = None
        self._files[name] = (key, rec)
        return True, rec

    # -- discovering processes ---------------------------------------------------------
    def scan(self) -> int:
        """Look at each record that changed since the last scan; how many records there are."""
        here = hostname()
        names: set[str] = set()
        try:
            entries = list(os.scandir(self.run.status_dir))
        except OSError:
            entries = []
        for entry in entries:
            if entry.name.startswith(".") or not entry.name.endswith(".json"):
                continue
            name = entry.name[:-5]
            names.add(name)
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            changed, rec = self._read(name, entry.path, (st.st_ino, st.st_size, st.st_mtime_ns))
            if changed and rec is not None and rec.role != "launcher" and rec.host == here:
                self._found(rec)  # another node's processes are that node's launcher's to watch
        for gone in set(self._files) - names:
            del self._files[gone]
        return len(names)

    def _known(self, rec: StatusRecord) -> bool:
        key = (rec.name, rec.pid)
        if key in self._polled or key in self._pending:
            return True
        if any(seen.pid == rec.pid and seen.name == rec.name for seen in self._by_fd.values()):
            return True
        ended = self.exits.get(rec.name)
        return ended is not None and ended.pid == rec.pid

    def _found(self, rec: StatusRecord) -> None:
        if self._known(rec) or self._renamed(rec):
            return
        self._unseen_predecessor(rec)
        if rec.state != "running":
            # Ended normally before we ever saw it running: a clean exit, time from its record.
            self._note(rec, rec, at=rec.heartbeat_at, exact=False)
            return
        fd = _pidfd(rec.pid)
        if fd is not None and same_start(process_start_time(rec.pid), rec.pid_start):
            self._by_fd[fd] = rec
            self._poll.register(fd, select.POLLIN)
            return
        if fd is not None:
            os.close(fd)
        self._polled[(rec.name, rec.pid)] = rec  # gone already, or no pidfd: polled

    def _unseen_predecessor(self, rec: StatusRecord) -> None:
        """A worker that lived and died between two scans (a loaded box: killed moments after
        it started) was never watched, but its successor in the same record file says how it
        ended (``metrics.previous``). A death is noted from that word; a normal end is churn
        and noted nowhere (the healthy epochs of a long run log nothing)."""
        prev = rec.metrics.get("previous")
        if not isinstance(prev, dict) or not isinstance(prev.get("pid"), int) or prev["pid"] == rec.pid:
            return
        code = prev.get("exit_code")
        if prev.get("state") != "failed" and not (isinstance(code, int) and code != 0):
            return
        ghost = dataclasses.replace(rec, pid=prev["pid"], pid_start=prev.get("pid_start"), metrics={})
        if self._known(ghost):
            return
        told = predecessor(rec, ghost)
        if told is not None:
            self._note(ghost, told, at=rec.started_at or rec.heartbeat_at, exact=False)

    def _renamed(self, rec: StatusRecord) -> bool:
        """A process watched under its old name took a new one (a helper that became a rank
        when it joined a process group, mp.spawn's parent that stopped being rank 0): the same
        watch goes on under the new name, so its end is noted once, as what it turned out to be."""
        for fd, seen in list(self._by_fd.items()):
            if seen.pid == rec.pid and seen.name != rec.name and seen.pid_start == rec.pid_start:
                self._by_fd[fd] = rec
                return True
        return False

    def _check_polled(self) -> None:
        """Processes without a pidfd (gone when found, or an old kernel): polled instead."""
        for key, seen in list(self._polled.items()):
            if same_start(process_start_time(seen.pid), seen.pid_start):
                continue
            del self._polled[key]
            # Gone before we could watch it (an adopter arriving late, a loaded box): it
            # ended after its last heartbeat, and maybe long before now. Its last sign of
            # life keeps the order against peers whose exact ends came after it (ranks
            # that torchrun stopped because this one left); "now" could put it after them.
            rec = self._record(seen.name)
            latest = rec if rec is not None and rec.pid == seen.pid else seen
            self._end(latest, at=min(time.time(), latest.heartbeat_at), exact=False)

    # -- an end ---------------------------------------------------------------------------
    def _ended(self, fd: int) -> None:
        at = time.time()
        rec = self._by_fd.pop(fd)
        try:
            self._poll.unregister(fd)
        finally:
            os.close(fd)
        self._end(rec, at=at, exact=True)

    def _final(self, seen: StatusRecord) -> tuple[StatusRecord, StatusRecord | None]:
        """(who ended, its final record if one is found)."""
        current = self._record(seen.name)
        if current is not None and current.pid == seen.pid:
            return seen, current
        told = predecessor(current, seen)
        if told is not None:
            return seen, told
        # renamed since the last scan: find it by pid
        self.scan()
        for name, (_, rec) in self._files.items():
            if rec is not None and rec.pid == seen.pid and rec.pid_start == seen.pid_start:
                return (rec if name != seen.name else seen), rec
        return seen, None

    def _end(self, seen: StatusRecord, *, at: float, exact: bool) -> None:
        who, final = self._final(seen)
        if (final is None or final.state == "running") and who.role == "worker" and self.worker_word_s > 0:
            # A DataLoader worker: its rank knows how it ended and says so in a moment.
            self._pending[(who.name, who.pid)] = _Pending(who, at, exact, time.monotonic() + self.worker_word_s)
            return
        self._note(who, final if final is not None else who, at=at, exact=exact)

    def _check_pending(self, *, final: bool = False) -> None:
        for key, p in list(self._pending.items()):
            who, told = self._final(p.seen)
            if told is not None and told.state != "running":
                del self._pending[key]
                self._note(who, told, at=p.at, exact=p.exact)
            elif final or time.monotonic() >= p.until:
                del self._pending[key]
                self._note(who, told if told is not None else who, at=p.at, exact=p.exact)

    def _note(self, seen: StatusRecord, final: StatusRecord, *, at: float, exact: bool) -> None:
        with self._lock:
            if seen.name in self.exits and self.exits[seen.name].pid == seen.pid:
                return
            mono = time.monotonic() - (time.time() - at)
            code = final.exit_code
            end = ProcessExit(seen.name, seen.pid, seen.role, seen.rank, at, exact, final.state, final.phase,
                              final.step, final.error, code, mono, boot_id(),
                              signal_name(-code) if seen.role == "worker" and code is not None and code < 0 else None)
            self.exits[seen.name] = end
        if not end.clean or end.record_state == "failed" or seen.role in ("rank", "agent"):
            # Every rank's end is a fact worth keeping; workers and helpers only when abnormal
            # (a DataLoader's workers end at every epoch).
            self.run.append_event("process.exit", actor=self.actor, **end.to_dict())
