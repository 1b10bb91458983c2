"""/proc, read in one place: one function per file, as psutil's ``_pslinux.py`` does, so a parse
bug is fixed once. Every part of ups asks here (the process table of health, the attach's
finder, the proofs before a signal, the launcher's sweep, the observer's windows); psutil is not
used because every instrumented process imports this module, and reads its own /proc and its
parent's on the hot path of a start (a psutil import costs more than the whole start-up).

Light on purpose: no typing, no dataclasses at run time. Each function returns None when the
process is gone or the file cannot be read; a zombie's ``stat`` is returned (its ``state`` is
``Z``): whether a zombie counts as alive is the caller's decision.
"""

from __future__ import annotations

import os

_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_BOOT_TIME: float | None = None


def _read(path: str, limit: int = 1 << 20) -> bytes | None:
    # os.open, not builtins.open: instrumented processes read here (the heartbeat, a rank's
    # start), and in a DataLoader worker the instrumentation's open() hook would take a /proc
    # file for the sample's file.
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        parts, size = [], 0
        while size < limit:
            part = os.read(fd, min(limit - size, 1 << 16))
            if not part:
                break
            parts.append(part)
            size += len(part)
        return b"".join(parts)
    except OSError:
        return None
    finally:
        os.close(fd)


def clock_ticks() -> int:
    """Clock ticks a second (``stat``'s times are in ticks)."""
    return _CLK_TCK


def busy_ticks() -> int | None:
    """The whole machine's busy CPU time since boot, in ticks (``/proc/stat``'s first line: user,
    nice, system, irq, softirq; idle, iowait and steal left out); None without /proc."""
    first = (_read("/proc/stat", 4096) or b"").split(b"\n", 1)[0].split()
    try:
        v = [int(x) for x in first[1:8]]
        return v[0] + v[1] + v[2] + v[5] + v[6]
    except (ValueError, IndexError):
        return None


def boot_time() -> float | None:
    """When the machine booted, UNIX seconds (``/proc/stat``'s btime); None without /proc."""
    global _BOOT_TIME
    if _BOOT_TIME is None:
        for line in (_read("/proc/stat") or b"").splitlines():
            if line.startswith(b"btime"):
                _BOOT_TIME = float(line.split()[1])
                break
    return _BOOT_TIME


class Stat:
    """``/proc/PID/stat``'s fields ups reads (proc(5)): times in clock ticks."""

    __slots__ = ("comm", "cstime", "cutime", "pgrp", "ppid", "session", "starttime", "state", "stime", "utime")

    def __init__(self, comm: str, state: str, ppid: int, pgrp: int, session: int, utime: int, stime: int,
                 starttime: int, cutime: int = 0, cstime: int = 0) -> None:
        self.comm, self.state, self.ppid, self.pgrp, self.session = comm, state, ppid, pgrp, session
        self.utime, self.stime, self.starttime = utime, stime, starttime
        self.cutime, self.cstime = cutime, cstime  # its reaped children's

    def cpu_s(self, children: bool = False) -> float:
        """CPU seconds (user + system), with its reaped children's when asked."""
        ticks = self.utime + self.stime + ((self.cutime + self.cstime) if children else 0)
        return ticks / clock_ticks()

    @property
    def gone(self) -> bool:
        """Exited, not yet reaped (a zombie) or being reaped: gone for every purpose of ours."""
        return self.state in ("Z", "X")

    def __repr__(self) -> str:
        return f"Stat(comm={self.comm!r}, state={self.state!r}, ppid={self.ppid}, session={self.session})"


def parse_stat(data: bytes) -> Stat | None:
    """One ``stat`` file's text. The command name is between the first ``(`` and the *last*
    ``)``: it may hold spaces and parentheses of its own."""
    try:
        close = data.rindex(b")")
        f = data[close + 2:].split()
        return Stat(data[data.index(b"(") + 1: close].decode(errors="replace"), f[0].decode(), int(f[1]), int(f[2]),
                    int(f[3]), int(f[11]), int(f[12]), int(f[19]), int(f[13]), int(f[14]))
    except (ValueError, IndexError):
        return None


def stat(pid: int, tid: int | None = None) -> Stat | None:
    """``/proc/PID/stat``, or a thread's (``/proc/PID/task/TID/stat``)."""
    data = _read(f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat", 4096)
    return parse_stat(data) if data else None


def schedstat(pid: int, tid: int | None = None) -> tuple[int, int] | None:
    """``/proc/PID/schedstat`` (the thread's, with ``tid``): nanoseconds on a CPU and waiting on
    a run queue (runnable, not running: another task had the core), since the thread began."""
    data = _read(f"/proc/{pid}/schedstat" if tid is None else f"/proc/{pid}/task/{tid}/schedstat", 256)
    try:
        f = (data or b"").split()
        return int(f[0]), int(f[1])
    except (ValueError, IndexError):
        return None


def children(pid: int, tid: int) -> list[int]:
    """``/proc/PID/task/TID/children``: the live processes thread TID started (a kernel built
    without CONFIG_PROC_CHILDREN has no such file: none)."""
    data = _read(f"/proc/{pid}/task/{tid}/children", 64 << 10)
    return [int(w) for w in (data or b"").split() if w.isdigit()]


def parse_cmdline(data: bytes) -> list[str]:
    """One ``cmdline`` file's text: the arguments, each ended by a NUL. A process that rewrote
    its command line in place (setproctitle) may leave no NUL at the end, or none at all: the
    text after the last NUL is an argument all the same, and a title (no NUL, or one argument
    with spaces) is read as psutil reads it, its words being the arguments."""
    if not data:
        return []
    if data.endswith(b"\0"):
        data = data[:-1]
    elif b"\0" not in data:
        return [w.decode(errors="replace") for w in data.split()]
    args = data.split(b"\0")
    if len(args) == 1 and b" " in data:
        args = data.split()
    return [a.decode(errors="replace") for a in args]


def cmdline(pid: int) -> list[str] | None:
    """The process's arguments (``/proc/PID/cmdline``); [] for a kernel thread or a zombie."""
    data = _read(f"/proc/{pid}/cmdline")
    return None if data is None else parse_cmdline(data)


def environ(pid: int) -> dict[str, str] | None:
    """The environment the process started with; None where it cannot be read (another user's)."""
    data = _read(f"/proc/{pid}/environ")
    if data is None:
        return None
    out = {}
    for item in data.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            out[key.decode(errors="replace")] = value.decode(errors="replace")
    return out


def comm(pid: int) -> str:
    """The process's short name (``/proc/PID/comm``), "" when gone."""
    return (_read(f"/proc/{pid}/comm") or b"").decode(errors="replace").strip()


def status(pid: int | str, tid: int | None = None) -> dict[str, str] | None:
    """``/proc/PID/status`` (or a thread's) as key -> value text (``Uid``: ``"0\\t0\\t0\\t0"``)."""
    data = _read(f"/proc/{pid}/status" if tid is None else f"/proc/{pid}/task/{tid}/status", 16384)
    if data is None:
        return None
    out = {}
    for line in data.splitlines():
        key, sep, value = line.partition(b":")
        if sep:
            out[key.decode(errors="replace")] = value.decode(errors="replace").strip()
    return out


def fd_targets(pid: int) -> dict[int, str] | None:
    """Every open descriptor of ``pid`` and what the kernel's link names (``/path``, ``pipe:[N]``,
    ``socket:[N]``); None when its ``fd`` folder cannot be read (gone, or another user's)."""
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return None
    out = {}
    for name in names:
        try:
            out[int(name)] = os.readlink(f"/proc/{pid}/fd/{name}")
        except (OSError, ValueError):
            continue
    return out


def fd_access(pid: int, fd: int) -> str | None:
    """How a descriptor was opened (``fdinfo``'s flags): ``r``, ``w`` or ``rw``; None unknown."""
    data = _read(f"/proc/{pid}/fdinfo/{fd}", 4096)
    for line in (data or b"").splitlines():
        if line.startswith(b"flags:"):
            try:
                mode = int(line.split()[1], 8) & 3  # O_ACCMODE
            except (IndexError, ValueError):
                return None
            return {0: "r", 1: "w", 2: "rw"}.get(mode)
    return None
