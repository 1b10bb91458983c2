"""An attached job's log: read through the job's own open file, copied bounded into the run.

``ups attach`` often runs as root, watching another user's job; the job's owner can rename,
replace or link anything under the log's path at any moment. So the log is never read by its
path (docs/safety.md, "Another user's job, attached"):

* **At the attach** (:func:`held_log`) the file is named by the process that writes it: which
  process, which descriptor (its stdout or stderr), the file's device and inode, its owner and
  mode, all from ``/proc/PID/fd/N`` (a ``stat`` that follows the kernel's link to the open file,
  never an ``open``), recorded in ``run.json`` (``attached.log_file``). A file that does not
  belong to the job's owner (a root-only file handed to the job's stdout) is recorded refused.
* **The observer** (:class:`JobLog`) opens that same file once, through the job's descriptor
  (``/proc/PID/fd/N``) with ``O_PATH`` (no open of a FIFO or device ever happens: nothing blocks,
  nothing is triggered), proves it (a regular file, the recorded device and inode, the job
  owner's) and only then reopens it for reading through its own descriptor. Where the job's
  process is gone by then, the path is used once, ``O_NOFOLLOW``, with the same proof. It keeps
  that descriptor: whatever the path names later (a link to a root-only file, a FIFO,
  ``/dev/zero``, a folder renamed away), it reads the file the job writes, and says once, in an
  event, that the path or the job's descriptor now names something else, which it never reads.
* **Bounded**: at most :data:`LOG_CHUNK` a tick; holes (a sparse file) are skipped, never
  copied as zeros; a file more than the cap ahead of the copy (a 1 TB sparse file, a writer
  faster than the copy) is skipped to its last :data:`LOG_BACKLOG`, said once; the copy
  ``logs/job.log`` is rotated to ``job.log.1`` past the cap (``attached.log_cap`` in
  ``run.json``), so the copy never takes more than twice the cap.
* **No wider than the source**: the copy is readable by others only while the job's file is
  (mode 0644 for a file others can read, else 0600; ``job.log.1`` too).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable
from typing import Any

from ups.attach.find import Job, uid_of
from ups.attach.pane import PaneReader
from ups.runs.rundir import RunDir
from ups.status import procfs
from ups.status.confined import open_append
from ups.status.procs import process_start_time, same_start

LOG_BACKLOG = 64 << 10  # what the job wrote before the attach, copied from its end
LOG_CHUNK = 1 << 20  # at most this much a tick
LOG_CAP = 64 << 20
"""The default cap of the log copy: past it ``job.log`` becomes ``job.log.1`` (one kept), so an
attached job's log never takes more than 128 MiB of the runs folder's disk."""
LOG_CAP_MIN = 64 << 10
PATH_FLAGS = os.O_PATH | os.O_CLOEXEC
READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC

Event = Callable[..., None]  # RunDir.append_event's signature: (name, **fields)


class Unproven(Exception):
    """The file at hand is not the job's log as recorded at the attach; nothing is read."""


def held_log(job: Job) -> dict[str, Any] | None:
    """The file the job's log is, as the process writing it holds it: ``{"pid", "pid_start",
    "fd", "dev", "ino", "uid", "mode", "owner"}`` (``owner``: the job's user), with ``refused``
    (why it will not be read) when the file is not the job owner's. None without a log."""
    if not job.log:
        return None
    holders = [(p.pid, p.start, (1, 2)) for p in [job.top_proc, *job.ranks] if p.log == job.log]
    if job.log_holder is not None:  # outside the job's tree: a SLURM step's batch script, tee behind a pipe
        fds = procfs.fd_targets(job.log_holder) or {}
        holders.append((job.log_holder, process_start_time(job.log_holder), sorted(fds)))
    job_owner = uid_of(job.top)
    for pid, start, fds in holders:
        if uid_of(pid) != job_owner:  # a reader outside the job that is not the job's user's: never read through it
            continue
        for fd in fds:
            link = f"/proc/{pid}/fd/{fd}"
            try:
                if os.readlink(link) != job.log:
                    continue
                st = os.stat(link)  # the open file itself (the kernel's link), never opened here
            except OSError:
                continue
            if not stat.S_ISREG(st.st_mode):
                continue
            owner = uid_of(pid)
            held = {"pid": pid, "pid_start": start, "fd": fd, "dev": st.st_dev, "ino": st.st_ino,
                    "uid": st.st_uid, "mode": stat.S_IMODE(st.st_mode), "owner": owner}
            if owner is None or st.st_uid != owner:
                held["refused"] = (f"{job.log} belongs to uid {st.st_uid}, not to the job's user (uid {owner}): "
                                   "its owner may not be able to read it, so ups does not read it")
            return held
    return None


def copy_mode(source_mode: int) -> int:
    """The copy's mode: its owner's alone, unless others could read the job's own file."""
    return 0o644 if source_mode & stat.S_IROTH else 0o600


def _check(st: os.stat_result, held: dict[str, Any], where: str) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise Unproven(f"{where} is not a regular file")
    if (st.st_dev, st.st_ino) != (held.get("dev"), held.get("ino")):
        raise Unproven(f"{where} is not the file the job held at the attach (another device and inode)")
    if st.st_uid != held.get("owner"):
        raise Unproven(f"{where} belongs to uid {st.st_uid}, not to the job's user (uid {held.get('owner')})")


def _open_proven(where: str, flags: int, held: dict[str, Any]) -> int:
    """``where`` opened ``O_PATH`` (no FIFO or device is opened: nothing blocks, nothing is
    triggered), proven the job's file, then reopened for reading through that descriptor (the
    same inode, whatever ``where`` names by then)."""
    pfd = os.open(where, PATH_FLAGS | flags)
    try:
        _check(os.fstat(pfd), held, where)
        fd = os.open(f"/proc/self/fd/{pfd}", READ_FLAGS)
    finally:
        os.close(pfd)
    try:
        _check(os.fstat(fd), held, where)
    except Unproven:
        os.close(fd)
        raise
    return fd


def open_held(held: dict[str, Any], path: str | None) -> int:
    """The job's log as a descriptor of our own: through the job's descriptor while the process
    that held it at the attach lives, else its path (``O_NOFOLLOW``), each proven; Unproven
    (with every reason) otherwise."""
    reasons = []
    pid = held.get("pid")
    if isinstance(pid, int) and same_start(process_start_time(pid), held.get("pid_start")):
        where = f"/proc/{pid}/fd/{held.get('fd')}"
        try:
            fd = _open_proven(where, 0, held)
            if same_start(process_start_time(pid), held.get("pid_start")):
                return fd  # the pid was still that process after the open: its descriptor it was
            os.close(fd)
            reasons.append(f"pid {pid} ended meanwhile")
        except Unproven as exc:
            reasons.append(f"pid {pid}'s descriptor {held.get('fd')}: {exc}")
        except OSError as exc:
            reasons.append(f"{where}: {exc.strerror or exc}")
    if path:
        try:
            return _open_proven(path, os.O_NOFOLLOW, held)
        except Unproven as exc:
            reasons.append(str(exc))
        except OSError as exc:
            reasons.append(f"{path}: {'a link (not followed)' if exc.errno == errno.ELOOP else exc.strerror or exc}")
    raise Unproven("; ".join(reasons) or "no process holds it and no path names it")


def _what(path: str) -> str:
    """What a path names now, for an event: never opened, a link never followed."""
    try:
        st = os.lstat(path)
    except OSError:
        return "nothing"
    if stat.S_ISLNK(st.st_mode):
        try:
            return f"a link to {os.readlink(path)!r}"
        except OSError:
            return "a link"
    if stat.S_ISFIFO(st.st_mode):
        return "a FIFO"
    if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
        return "a device"
    return "another file" if stat.S_ISREG(st.st_mode) else "not a file"


class JobLog:
    """The observer's reader of the job's log and writer of its copy (``logs/job.log``)."""

    def __init__(self, run: RunDir, attached: dict[str, Any], event: Event) -> None:
        self.run = run
        self.path: str | None = attached.get("log") if isinstance(attached.get("log"), str) else None
        held = attached.get("log_file")
        self.held: dict[str, Any] | None = held if isinstance(held, dict) else None
        cap = attached.get("log_cap")
        self.cap = max(LOG_CAP_MIN, cap) if isinstance(cap, int) else LOG_CAP
        self.event = event
        self.fd: int | None = None
        self.pos: int | None = None
        self.said: set[str] = set()
        self.mode = copy_mode(int(self.held.get("mode") or 0)) if self.held else 0o600
        pane = attached.get("log_pane")
        self.pane = PaneReader(pane) if isinstance(pane, dict) and not self.path else None  # a terminal's tmux pane or screen window

    def say(self, what: str, **fields: Any) -> None:
        """One event of each kind for the run's whole watch."""
        if what not in self.said:
            self.said.add(what)
            self.event(what, **fields)

    def open(self) -> bool:
        if self.fd is not None:
            return True
        if not self.path or "attach.log_refused" in self.said:
            return False
        if self.held is None or self.held.get("refused"):
            why = (self.held or {}).get("refused") or "the file the job held at the attach was not recorded"
            self.say("attach.log_refused", log=self.path, reason=why, detail="the job's log is not read")
            return False
        try:
            self.fd = open_held(self.held, self.path)
        except Unproven as exc:
            self.say("attach.log_refused", log=self.path, reason=str(exc), detail="the job's log is not read")
            return False
        return True

    def watch(self) -> None:
        """Says once when the log's path, or the job's descriptor, names another file than the
        one read: that one is never read."""
        if self.fd is None or self.held is None:
            return
        mine = os.fstat(self.fd)
        if self.path and "attach.log_moved" not in self.said:
            try:
                st = os.lstat(self.path)
                moved = (st.st_dev, st.st_ino) != (mine.st_dev, mine.st_ino)
            except OSError:
                moved = True
            if moved:
                self.say("attach.log_moved", log=self.path, now=_what(self.path),
                         detail="the path no longer names the file the job writes; ups reads on the file the job "
                                "holds open, never what the path names now")
        pid, fd = self.held.get("pid"), self.held.get("fd")
        if "attach.log_changed" not in self.said and isinstance(pid, int) and \
                same_start(process_start_time(pid), self.held.get("pid_start")):
            try:
                st = os.stat(f"/proc/{pid}/fd/{fd}")  # the open file, never opened
                changed = (st.st_dev, st.st_ino) != (mine.st_dev, mine.st_ino)
            except OSError:
                changed = True
            if changed:
                self.say("attach.log_changed", pid=pid, fd=fd,
                         detail="the job's descriptor now holds another file (or none): it is not read; ups reads "
                                "on the file it proved at the attach")

    def read(self) -> tuple[bytes, bool]:
        """What the job wrote since the last read (at most :data:`LOG_CHUNK`), and whether it is
        the backlog (written before the attach)."""
        if self.pane is not None:
            return self.pane.read()
        if not self.open():
            return b"", False
        assert self.fd is not None
        try:
            self.watch()
            st = os.fstat(self.fd)
            size = st.st_size
            if copy_mode(st.st_mode) != self.mode:  # its owner changed who may read it: so does the copy
                self.mode = copy_mode(st.st_mode)
                self.apply_mode()
            backlog = self.pos is None
            if self.pos is None:
                self.pos = max(0, size - LOG_BACKLOG)
            elif size < self.pos:
                self.pos = 0  # the job truncated its own file: from its beginning
            elif size - self.pos > self.cap:
                skip_to = size - LOG_BACKLOG
                self.say("attach.log_skipped", bytes=skip_to - self.pos,
                         detail=f"the job's log grew more than the copy's cap ({self.cap} bytes) ahead of the copy "
                                "(a sparse file, or a writer faster than the copy): the part between was not copied")
                self.pos = skip_to
            self.pos = min(self.skip_hole(self.pos, size), size)
            want = min(LOG_CHUNK, self.cap, size - self.pos)
            data = os.pread(self.fd, want, self.pos) if want > 0 else b""
        except OSError:
            return b"", False
        self.pos += len(data)
        return data, backlog

    def skip_hole(self, pos: int, size: int) -> int:
        """The first byte at or after ``pos`` the job wrote: a hole (a sparse file) reads as zeros
        the job never wrote, and is not copied."""
        try:
            return max(pos, os.lseek(self.fd, pos, os.SEEK_DATA))  # type: ignore[arg-type]
        except OSError as exc:
            return size if exc.errno == errno.ENXIO else pos  # ENXIO: nothing but a hole to its end

    def apply_mode(self) -> None:
        """The copy and its rotated part made :attr:`mode` (opened relative to the run folder,
        no link followed, nothing blocking)."""
        name = self.run.log_path("job").name
        with contextlib.suppress(OSError), self.run.folder("logs") as logs:
            for each in (name, f"{name}.1"):
                with contextlib.suppress(OSError):
                    fd = os.open(each, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=logs)
                    try:
                        os.fchmod(fd, self.mode)
                    finally:
                        os.close(fd)

    def append(self, data: bytes) -> None:
        """``data`` appended to the copy, in the run folder opened again (never through a link),
        rotated past the cap, its mode no wider than the job's file."""
        name = self.run.log_path("job").name
        try:
            with self.run.folder("logs", make=True) as logs:
                out = open_append(name, dir_fd=logs)
                try:
                    st = os.fstat(out)
                    if st.st_size and st.st_size + len(data) > self.cap:
                        os.close(out)
                        out = -1
                        os.replace(name, f"{name}.1", src_dir_fd=logs, dst_dir_fd=logs)
                        self.say("attach.log_rotated", cap=self.cap,
                                 detail=f"the copy reached its cap: {name}.1 keeps the part before, one such part kept")
                        out = open_append(name, dir_fd=logs)
                        st = os.fstat(out)
                    if stat.S_IMODE(st.st_mode) != self.mode:
                        os.fchmod(out, self.mode)
                    os.write(out, data)
                finally:
                    if out >= 0:
                        os.close(out)
        except OSError:
            pass
