"""Where a job's output goes, read from ``/proc`` alone (descriptor links and ``fdinfo``; no file
is opened here): a regular file its stdout or stderr is, or, behind a pipe, the regular file
that the pipe's reader writes (``| tee train.log``). The file is later read through the
writer's own open descriptor, never by its path (:mod:`ups.attach.joblog`).
"""

from __future__ import annotations

import os
import stat

from ups.status import procfs


def log_of(pid: int) -> str | None:
    """Where the process's stdout or stderr go, when that is a regular file."""
    for fd in (1, 2):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            st = os.stat(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("/") and stat.S_ISREG(st.st_mode) and not target.endswith(" (deleted)"):
            return target
    return None


def piped_log(pid: int, candidates: list[int] | None = None) -> tuple[str, int, str] | None:
    """Where the process's stdout goes when it is a pipe (``torchrun ... 2>&1 | tee train.log``):
    the regular file that the pipe's reader writes, the reader's pid and its name, as
    ``(path, reader, name)``; None when stdout is no pipe, or its reader writes no file.

    The reader is the process that holds the pipe's read end as its standard input, as every
    command on the right of a shell's ``|`` does (tee, a logger); a process that reads the pipe on
    another descriptor is a parent collecting its child's output (``subprocess`` with
    ``stdout=PIPE``, a test runner, an IDE), and the files it writes are its own, not the job's
    log. ``candidates``: the processes to look among (by default every process whose descriptors
    can be read, the job's user's or, as root, anyone's). Only ``/proc`` is read: descriptors and
    their links, never a file."""
    try:
        pipe = os.readlink(f"/proc/{pid}/fd/1")
    except OSError:
        return None
    if not pipe.startswith("pipe:"):
        return None
    pids = candidates if candidates is not None else [int(n) for n in os.listdir("/proc") if n.isdigit()]
    for q in pids:
        fds = procfs.fd_targets(q) if q != pid else None
        if not fds or fds.get(0) != pipe or procfs.fd_access(q, 0) != "r":
            continue
        for fd, target in sorted(fds.items()):
            if fd < 1 or not target.startswith("/") or target.endswith(" (deleted)"):
                continue
            if procfs.fd_access(q, fd) not in ("w", "rw"):
                continue
            try:
                if stat.S_ISREG(os.stat(f"/proc/{q}/fd/{fd}").st_mode):  # the open file's kind, never opened
                    return target, q, procfs.comm(q) or str(q)
            except OSError:
                continue
    return None
