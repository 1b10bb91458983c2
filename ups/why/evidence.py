"""Everything a verdict may rest on, read once and lazily: the run's view (records + health),
its events (the launcher's process exits, automatic stack dumps, kills), each process's
stack file, the job's and the ranks' logs, and for a live stuck process on this host what
the kernel says it is blocked in (``/proc/<pid>/syscall``, ``wchan``, the file behind the fd).
"""

from __future__ import annotations

import os
import platform
import re
import time
from dataclasses import dataclass, field
from functools import cached_property

from ups.runs.exits import ProcessExit, read_exits
from ups.runs.rundir import RunDir
from ups.runs.view import ProcessView, RunView
from ups.status.host import hostname
from ups.status.record import StatusRecord
from ups.why import stacks

LOG_TAIL_BYTES = 200_000
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


def proc_facts(pid: int) -> ProcFacts | None:
    base = f"/proc/{pid}"
    try:
        with open(f"{base}/stat", "rb") as fh:
            data = fh.read()
        state = data[data.rindex(b")") + 2 : data.rindex(b")") + 3].decode()
    except (OSError, ValueError):
        return None
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


@dataclass
class Evidence:
    view: RunView
    now: float = field(default_factory=time.time)
    _stacks: dict[str, stacks.Section | None] = field(default_factory=dict)
    _texts: dict[str, str] = field(default_factory=dict)

    @property
    def run(self) -> RunDir:
        return self.view.run

    @property
    def manifest(self) -> dict:
        return self.view.manifest or {}

    @cached_property
    def events(self) -> list[dict]:
        return self.run.read_events()

    @cached_property
    def exits(self) -> dict[str, ProcessExit]:
        """The current attempt's process ends: a restarted run's earlier attempts ended their
        processes too (killed for the restart), under the same names as this attempt's."""
        exits = read_exits(self.run)
        restarted = [a.get("ended_at") for a in self.manifest.get("attempts") or []
                     if isinstance(a, dict) and a.get("records") and isinstance(a.get("ended_at"), int | float)]
        if not restarted:
            return exits
        since = max(restarted)
        return {name: ex for name, ex in exits.items() if ex.at > since}

    def stack_text(self, record: StatusRecord) -> str:
        if record.name not in self._texts:
            self._texts[record.name] = _tail(self.run.path / (record.stack_file or f"stacks/{record.name}.txt"), 256_000)
        return self._texts[record.name]

    def stack(self, record: StatusRecord, kind: str | None = None) -> stacks.Section | None:
        """The latest stack section of a process (of ``kind``: dump, fatal, exception)."""
        key = f"{record.name}:{kind}"
        if key not in self._stacks:
            self._stacks[key] = stacks.latest(self.stack_text(record), kind)
        return self._stacks[key]

    @cached_property
    def job_log(self) -> str:
        return _tail(self.run.log_path("job"), LOG_TAIL_BYTES)

    def rank_log(self, rank: int) -> str:
        from ups.runs.actions import find_logs

        try:
            return "\n".join(_tail(p, LOG_TAIL_BYTES // 2) for p in find_logs(self.run, rank))
        except Exception:  # noqa: BLE001 - no per-rank log is no evidence, not an error
            return ""

    @cached_property
    def gpus(self):  # noqa: ANN201 - a GpuSnapshot, or None without GPUs (NVML, or UPS_FAKE_GPU's fake)
        try:
            from ups.gpu.snapshot import get_provider

            snap = get_provider().snapshot()
        except Exception:  # noqa: BLE001 - no GPU layer is no evidence, not an error
            return None
        return snap if snap.available and snap.devices else None

    def gpu_of(self, record: StatusRecord):  # noqa: ANN201
        """The device a process of this host runs on: the one its record names, else its local
        rank's (torchrun's convention, one GPU a rank)."""
        snap = self.gpus
        if snap is None or record.host != hostname():
            return None
        index = record.gpu.device if record.gpu is not None and record.gpu.device is not None else record.local_rank
        return next((d for d in snap.devices if d.index == index), None)

    def proc(self, record: StatusRecord) -> ProcFacts | None:
        """Kernel facts of a live process of this host (None elsewhere)."""
        if record.host != hostname() or record.is_final:
            return None
        return proc_facts(record.pid)

    def processes(self, *roles: str) -> list[ProcessView]:
        return [p for p in self.view.processes if not roles or p.record.role in roles]


def _tail(path, limit: int) -> str:  # noqa: ANN001
    # Regular files only, never blocking (a FIFO named job.log is no evidence, and no hang).
    from ups.status.safeio import try_tail

    return try_tail(path, limit) or ""
