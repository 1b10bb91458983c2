"""What this machine says, for the rules of ``ups why``: the one place in ``ups.why`` that reads
the host (``/proc``, cgroup files, ``statvfs``, psutil, NVML).

:class:`HostFacts` asks each fact at its first use and keeps the answer for the verdict, so a
rule that never needs one costs nothing. :class:`GivenHost` is a host whose facts are given
(a test, a verdict on facts gathered elsewhere): nothing is read, what is not given is unknown.
"""

from __future__ import annotations

import os
import platform
import re
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

from ups.status import procfs
from ups.status.host import hostname

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ups.gpu.snapshot import GpuSnapshot

# x86_64 syscall numbers of the calls a stuck process is usually in (others are shown by number).
_SYSCALLS_X86_64 = {0: "read", 1: "write", 2: "open", 7: "poll", 17: "pread64", 18: "pwrite64", 19: "readv", 20: "writev",
                    23: "select", 35: "nanosleep", 42: "connect", 43: "accept", 45: "recvfrom", 47: "recvmsg",
                    61: "wait4", 74: "fsync", 202: "futex", 230: "clock_nanosleep", 232: "epoll_wait", 257: "openat",
                    270: "pselect6", 271: "ppoll", 281: "epoll_pwait", 288: "accept4", 441: "epoll_pwait2"}
_FD_SYSCALLS = {"read", "write", "pread64", "pwrite64", "readv", "writev", "fsync", "recvfrom", "recvmsg"}


@dataclass(frozen=True)
class ProcFacts:
    """What the kernel says of a live process."""

    state: str | None  # R running, S sleeping, D uninterruptible (I/O), T stopped, Z zombie
    wchan: str | None
    syscall: str | None
    fd_path: str | None  # the file the blocking call is on (read on a hung mount)
    nofile: int | None  # soft limit of open files
    open_fds: int | None

    def describe(self) -> str:
        bits = []
        if self.syscall:
            bits.append(f"blocked in {self.syscall}()" + (f" on {self.fd_path}" if self.fd_path else ""))
        if self.wchan and self.wchan != "0":
            bits.append(f"kernel wait {self.wchan}")
        if self.state in ("D", "T"):
            bits.append({"D": "uninterruptible (D state: I/O that does not return)", "T": "stopped (SIGSTOP)"}[self.state])
        return ", ".join(bits)


class HostFacts:
    """This machine's facts, each read at its first use and kept (one verdict's worth)."""

    def __init__(self) -> None:
        self._procs: dict[int, ProcFacts | None] = {}
        self._listeners: dict[int, tuple[int, str] | None] = {}
        self._free: dict[str, int | None] = {}

    @cached_property
    def hostname(self) -> str | None:
        """This host's name as records write it (``$UPS_HOSTNAME`` or the node name): a record
        of another host has no process here to ask about."""
        return hostname()

    @cached_property
    def oom_kills(self) -> int | None:
        """The kernel OOM killer's count for this cgroup (cgroup v2 memory.events), where readable."""
        return read_oom_kills()

    @cached_property
    def shm(self) -> tuple[int, int] | None:
        """(size, free) of /dev/shm in bytes, where it exists."""
        return shm_figures()

    @cached_property
    def gpus(self) -> GpuSnapshot | None:
        """This host's GPUs (NVML, or UPS_FAKE_GPU's fake); None without any."""
        try:
            from ups.gpu.snapshot import get_provider

            snap = get_provider().snapshot()
        except Exception:  # noqa: BLE001 - no GPU layer is no evidence, not an error
            return None
        return snap if snap.available and snap.devices else None

    def proc(self, pid: int) -> ProcFacts | None:
        """What the kernel says of a live process of this host (its state, kernel wait, the call
        it is blocked in and on which file, its open-file limit)."""
        if pid not in self._procs:
            self._procs[pid] = proc_facts(pid)
        return self._procs[pid]

    def port_holder(self, port: int) -> tuple[int, str] | None:
        """(pid, command line) of who listens on a TCP port of this host (the holder of a busy
        rendezvous port)."""
        if port not in self._listeners:
            self._listeners[port] = tcp_listener(port)
        return self._listeners[port]

    def free_bytes(self, folder: str) -> int | None:
        """Bytes free to this user on the disk of a folder (where a write failed)."""
        if folder not in self._free:
            self._free[folder] = disk_free(folder)
        return self._free[folder]


class GivenHost(HostFacts):
    """A host whose facts are given, not read: what is not given is unknown (None)."""

    def __init__(self, *, hostname: str | None = None, oom_kills: int | None = None, shm: tuple[int, int] | None = None,
                 gpus: GpuSnapshot | None = None, procs: Mapping[int, ProcFacts] | None = None,
                 listeners: Mapping[int, tuple[int, str]] | None = None, free: Mapping[str, int] | None = None) -> None:
        super().__init__()
        self.hostname = hostname
        self.oom_kills = oom_kills
        self.shm = shm
        self.gpus = gpus
        self._procs.update(procs or {})
        self._listeners.update(listeners or {})
        self._free.update(free or {})

    def proc(self, pid: int) -> ProcFacts | None:
        return self._procs.get(pid)

    def port_holder(self, port: int) -> tuple[int, str] | None:
        return self._listeners.get(port)

    def free_bytes(self, folder: str) -> int | None:
        return self._free.get(folder)


# ----------------------------------------------------------------- reading this machine
def proc_facts(pid: int) -> ProcFacts | None:
    base = f"/proc/{pid}"
    st = procfs.stat(pid)
    if st is None:
        return None
    state = st.state
    wchan = _read(f"{base}/wchan")
    syscall = fd_path = None
    raw = _read(f"{base}/syscall")
    if raw and raw.split()[0].isdigit():
        parts = raw.split()
        nr = int(parts[0])
        syscall = _SYSCALLS_X86_64.get(nr, f"syscall {nr}") if platform.machine() == "x86_64" else f"syscall {nr}"
        if syscall in _FD_SYSCALLS and len(parts) > 1:
            try:
                fd_path = os.readlink(f"{base}/fd/{int(parts[1], 16)}")
            except (OSError, ValueError):
                fd_path = None
    nofile = None
    limits = _read(f"{base}/limits") or ""
    m = re.search(r"^Max open files\s+(\d+|unlimited)", limits, re.M)
    if m and m.group(1).isdigit():
        nofile = int(m.group(1))
    try:
        open_fds = len(os.listdir(f"{base}/fd"))
    except OSError:
        open_fds = None
    return ProcFacts(state, wchan, syscall, fd_path, nofile, open_fds)


def _read(path: str) -> str | None:
    try:
        with open(path) as fh:
            return fh.read().strip()
    except OSError:
        return None


def shm_figures() -> tuple[int, int] | None:
    """(size, free) of /dev/shm in bytes, where it exists."""
    try:
        st = os.statvfs("/dev/shm")
    except OSError:
        return None
    return st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize


def disk_free(folder: str) -> int | None:
    """Bytes free to this user on the disk of a folder."""
    try:
        st = os.statvfs(folder)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def read_oom_kills() -> int | None:
    """The kernel OOM killer's count for this cgroup (cgroup v2 memory.events), where readable."""
    try:
        with open("/proc/self/cgroup") as fh:
            rel = next((ln.split(":", 2)[2].strip() for ln in fh if ln.startswith("0::")), None)
    except OSError:
        rel = None
    for path in ([f"/sys/fs/cgroup{rel}/memory.events"] if rel else []) + ["/sys/fs/cgroup/memory.events"]:
        try:
            with open(path) as fh:
                m = re.search(r"^oom_kill (\d+)", fh.read(), re.M)
            if m:
                return int(m.group(1))
        except OSError:
            continue
    return None


def tcp_listener(port: int) -> tuple[int, str] | None:
    """Who listens on a TCP port of this host: (pid, command line)."""
    try:
        import psutil

        for conn in psutil.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
                proc = psutil.Process(conn.pid)
                return conn.pid, " ".join(proc.cmdline())[:80]
    except Exception:  # noqa: BLE001 - a lookup that is not allowed tells nothing
        return None
    return None
