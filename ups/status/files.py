"""Writing a run's files: atomically, never through a link, with the modes ups promises.

Every writer of a run folder (the Reporter in each process of a job, the launcher, the
series of training metrics, the cache and data writers) goes through here: a record or a
manifest is written to a fresh temp file in the same folder and renamed into place, so a
reader never sees a torn file and a process that dies leaves the last whole one; a log or a
stack file is opened for appending only when it is a regular file. Light on purpose (the
standard library only): every instrumented process imports it.
"""

from __future__ import annotations

import errno
import os
import stat
import threading

TYPE_CHECKING = False  # typing costs ~10 ms to import; annotations here are strings
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any


def append_opener(path: str, flags: int) -> int:
    """``open(..., opener=append_opener)``: a log or stack file of a run, created 0o644 whatever
    the umask, never through a symlink, and never a FIFO or device found under its name (the
    open does not block on one; it is refused)."""
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, f"{path} is not a regular file")
    os.set_blocking(fd, True)
    return fd


def write_atomic(path: str | os.PathLike[str], data: bytes, *, write: Callable[[int, Any], int] = os.write) -> None:
    """Write ``data`` to ``path`` via a temp file in the same folder and ``os.replace``.

    On failure the temp file is removed and the OSError propagates; ``path`` keeps its old
    content. ``write`` is the low-level write call (fault injection replaces it).
    """
    path = os.fspath(path)
    head, tail = os.path.split(path)
    tmp = os.path.join(head, f".{tail}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        # A fresh temp file, never one found there: a symlink or FIFO planted under the temp
        # name must not redirect or block the write (a stale temp of ours is removed first).
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(tmp, flags, 0o644)
        except FileExistsError:
            os.unlink(tmp)
            fd = os.open(tmp, flags, 0o644)
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


def folder_identity(path: str | os.PathLike[str]) -> tuple[int, int] | None:
    """A folder's (device, inode): the same path naming another folder is another folder."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino
