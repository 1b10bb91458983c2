"""Exit statuses of processes ups did not start, from the kernel's taskstats (the one reader of it).

An observer that is not a process's parent never sees its exit status: the parent reaps it
(torchrun's agent its ranks, init a job killed as a whole). Linux's taskstats interface (generic
netlink family ``TASKSTATS``, Documentation/accounting/taskstats.rst) sends a record of every
task that exits on the CPUs a listener registered for, with the task's exit status
(``ac_exitcode``, in wait(2)'s encoding) and flags (``AXSIG``: ended by a signal; ``ACORE``:
dumped core). Registering needs CAP_NET_ADMIN (root); elsewhere :func:`start` returns None and
exit statuses stay unknown.

:class:`ExitListener` keeps the last :data:`KEPT` exits of whole processes (a record whose pid is
its thread group's leader), keyed by pid, with the process's start (``ac_btime``, whole seconds)
so that a reused pid is never taken for the one watched. Records dropped by the kernel under a
burst of exits (``ENOBUFS``) are lost; the statuses they held stay unknown.
"""

from __future__ import annotations

import contextlib
import errno
import socket
import struct
import threading
import time
from collections import OrderedDict

NETLINK_GENERIC = 16
GENL_ID_CTRL = 0x10
CTRL_CMD_GETFAMILY, CTRL_ATTR_FAMILY_ID, CTRL_ATTR_FAMILY_NAME = 3, 1, 2
TASKSTATS_CMD_GET, TASKSTATS_CMD_NEW = 1, 2
TASKSTATS_CMD_ATTR_REGISTER_CPUMASK = 3
TASKSTATS_TYPE_PID, TASKSTATS_TYPE_STATS, TASKSTATS_TYPE_AGGR_PID = 1, 3, 4
NLM_F_REQUEST = 1
NLMSG_ERROR = 2
# struct taskstats (include/uapi/linux/taskstats.h): the offsets ups reads, the same in every version
OFF_EXITCODE, OFF_FLAG, OFF_COMM, OFF_PID, OFF_BTIME = 4, 8, 80, 128, 136
AXSIG, ACORE = 0x10, 0x08
KEPT = 4096


class Exit:
    """One process's end as the kernel told it."""

    __slots__ = ("comm", "core", "pid", "started", "status")

    def __init__(self, pid: int, status: int, flags: int, started: int, comm: str) -> None:
        self.pid, self.status, self.started, self.comm = pid, status, started, comm
        self.core = bool(flags & ACORE)

    @property
    def code(self) -> int:
        """As subprocess says it: the exit code, or minus the signal that ended it."""
        return -(self.status & 0x7F) if self.status & 0x7F else self.status >> 8

    def describe(self) -> str:
        if self.status & 0x7F:
            import signal

            try:
                name = signal.Signals(self.status & 0x7F).name
            except ValueError:
                name = f"signal {self.status & 0x7F}"
            return f"killed by {name}" + (" (core dumped)" if self.core else "")
        return f"exited with code {self.status >> 8}"

    def __repr__(self) -> str:
        return f"Exit(pid={self.pid}, code={self.code}, comm={self.comm!r})"


def _attr(kind: int, payload: bytes) -> bytes:
    data = struct.pack("HH", 4 + len(payload), kind) + payload
    return data + b"\0" * (-len(data) % 4)


def _attrs(data: bytes) -> dict[int, bytes]:
    """A netlink message's attributes (type -> payload), the first of each type."""
    out: dict[int, bytes] = {}
    at = 0
    while at + 4 <= len(data):
        length, kind = struct.unpack_from("HH", data, at)
        if length < 4:
            break
        out.setdefault(kind & 0x3FFF, data[at + 4:at + length])
        at += (length + 3) & ~3
    return out


def _messages(data: bytes) -> list[tuple[int, bytes]]:
    """(type, payload after the netlink header) of each message in one read."""
    out = []
    at = 0
    while at + 16 <= len(data):
        length, kind = struct.unpack_from("IH", data, at)
        if length < 16:
            break
        out.append((kind, data[at + 16:at + length]))
        at += (length + 3) & ~3
    return out


def parse_exit(payload: bytes) -> Exit | None:
    """A TASKSTATS_CMD_NEW message (after the netlink header): the exit of a process (a thread
    group's leader), or None (another thread, another command, a record too short)."""
    if len(payload) < 4 or payload[0] != TASKSTATS_CMD_NEW:
        return None
    aggr = _attrs(payload[4:]).get(TASKSTATS_TYPE_AGGR_PID)
    if aggr is None:
        return None
    inner = _attrs(aggr)
    pid_raw, stats = inner.get(TASKSTATS_TYPE_PID), inner.get(TASKSTATS_TYPE_STATS)
    if pid_raw is None or stats is None or len(stats) < OFF_BTIME + 4 or len(pid_raw) < 4:
        return None
    (pid,) = struct.unpack_from("I", pid_raw)
    (tgid,) = struct.unpack_from("I", stats, OFF_PID)  # ac_pid: the thread group's id
    if pid != tgid:
        return None  # a thread of a process, not the process
    (status,) = struct.unpack_from("I", stats, OFF_EXITCODE)
    comm = stats[OFF_COMM:OFF_COMM + 32].split(b"\0", 1)[0].decode(errors="replace")
    (started,) = struct.unpack_from("I", stats, OFF_BTIME)
    return Exit(pid, status, stats[OFF_FLAG], started, comm)


def _family_id(sock: socket.socket) -> int | None:
    request = struct.pack("BBH", CTRL_CMD_GETFAMILY, 1, 0) + _attr(CTRL_ATTR_FAMILY_NAME, b"TASKSTATS\0")
    sock.send(struct.pack("IHHII", 16 + len(request), GENL_ID_CTRL, NLM_F_REQUEST, 1, 0) + request)
    for kind, payload in _messages(sock.recv(65536)):
        if kind == GENL_ID_CTRL:
            raw = _attrs(payload[4:]).get(CTRL_ATTR_FAMILY_ID)
            return struct.unpack_from("H", raw)[0] if raw and len(raw) >= 2 else None
    return None


class ExitListener:
    """A daemon thread that keeps the exits the kernel reports (see the module's text)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.exits: OrderedDict[int, Exit] = OrderedDict()
        self.lock = threading.Lock()
        self.closed = False
        self.thread = threading.Thread(target=self._run, name="ups-taskstats", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.closed:
            try:
                data = self.sock.recv(1 << 16)
            except TimeoutError:
                continue
            except OSError as exc:
                if exc.errno == errno.ENOBUFS and not self.closed:
                    continue  # a burst of exits overran the buffer: those records are lost
                return
            for kind, payload in _messages(data):
                ended = parse_exit(payload) if kind != NLMSG_ERROR else None
                if ended is not None:
                    with self.lock:
                        self.exits[ended.pid] = ended
                        self.exits.move_to_end(ended.pid)
                        while len(self.exits) > KEPT:
                            self.exits.popitem(last=False)

    def exit_of(self, pid: int, started: float | None = None, wait_s: float = 0.0) -> Exit | None:
        """The kernel's record of ``pid``'s end, if it came: ``started`` (the process's start, in
        seconds since the epoch, as ups recorded it) rules out another process of the same pid.
        ``wait_s``: how long to wait for it (the record may reach this thread a moment after
        /proc lost the process)."""
        deadline = time.monotonic() + wait_s
        while True:
            with self.lock:
                ended = self.exits.get(pid)
            if ended is not None and (started is None or abs(ended.started - started) <= 2):
                return ended
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.02)

    def close(self) -> None:
        self.closed = True
        with contextlib.suppress(OSError):
            self.sock.close()


def start() -> ExitListener | None:
    """Listen for every exit on every CPU; None where the kernel has no taskstats or this process
    may not register (not root)."""
    sock = None
    try:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_GENERIC)
        sock.bind((0, 0))
        sock.settimeout(5)
        family = _family_id(sock)
        if family is None:
            sock.close()
            return None
        try:
            with open("/sys/devices/system/cpu/possible", "rb") as f:
                cpus = f.read().strip() + b"\0"
        except OSError:
            cpus = b"0-4095\0"
        request = struct.pack("BBH", TASKSTATS_CMD_GET, 1, 0) + _attr(TASKSTATS_CMD_ATTR_REGISTER_CPUMASK, cpus)
        sock.send(struct.pack("IHHII", 16 + len(request), family, NLM_F_REQUEST | 4, 2, 0) + request)  # NLM_F_ACK
        for kind, payload in _messages(sock.recv(65536)):
            if kind == NLMSG_ERROR and struct.unpack_from("i", payload)[0] != 0:
                sock.close()
                return None  # EPERM without CAP_NET_ADMIN
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        sock.settimeout(1.0)  # the listener's reads: close() is seen within a second
        return ExitListener(sock)
    except (OSError, struct.error, ValueError, AttributeError):  # AttributeError: no AF_NETLINK (not Linux)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()
        return None
