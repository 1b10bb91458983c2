"""Is a run folder's disk full? Asked where records go stale, and at a run's end.

A full disk stops every writer of a run at once: records, stack files, the job's log. A
reader that sees live processes with stale records must say "disk full", not call them
unresponsive (blocked in a C call); a launcher must not blame the job for records it could
not write.
"""

from __future__ import annotations

import os

FULL_BYTES = 64 << 10  # less free than this (for an unprivileged writer): full


def free_bytes(path: str | os.PathLike[str]) -> int | None:
    """Bytes an unprivileged writer may still use on the folder's filesystem (None: unknown)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def disk_full(path: str | os.PathLike[str]) -> str | None:
    """A short description when the folder's disk is full now, else None."""
    free = free_bytes(path)
    if free is None or free >= FULL_BYTES:
        return None
    return f"the disk of {os.fspath(path)} is full ({free} bytes free)"
