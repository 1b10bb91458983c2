"""Xid lines from the kernel log (``NVRM: Xid (PCI:0000:3b:00): 79, ...``), read as they come.

NVML's event set (:mod:`ups.gpu.xid`) sees only the Xids reported after it was opened; the
driver also writes every Xid to the kernel log, where the ones from before the watcher opened
are still in the ring buffer. ``/dev/kmsg`` hands the buffer out one record per read, from the
oldest record still held, and then each new one: a long-lived reader (the launcher's hang
watch, the console) keeps it open and reads only what is new at each snapshot, never the
whole buffer again. A kernel line names the GPU by its PCI address; a snapshot maps that to
the NVML index through the device's PCI bus id.

Reading ``/dev/kmsg`` needs root or ``kernel.dmesg_restrict = 0``, and a container may not
see the host's log: then the reader is empty with a reason, never an exception. Nothing here
writes to the kernel log.
"""

from __future__ import annotations

import errno
import os
import re
import threading
import time
from collections import deque
from typing import NamedTuple

KMSG = "/dev/kmsg"
MAX_EVENTS = 256  # bounded: an Xid storm must not grow a long-lived process without end
MAX_RECORDS_PER_POLL = 20_000  # one poll never reads for long (the ring buffer is a few MB at most)
RECENT_S = 6 * 3600.0  # an Xid older than this is history, not a sign about the job running now

# "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."
XID_LINE = re.compile(r"NVRM: Xid \(PCI:(?P<pci>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})(?:\.\d)?\): (?P<xid>\d+)\b(?P<rest>.*)")


class KernelXid(NamedTuple):
    pci: str  # "0000:3b:00": domain:bus:device, lower case
    xid: int
    text: str  # the driver's own words after the code
    at: float | None  # wall time of the kernel record, when it could be told


def pci_key(bus_id: str | bytes | None) -> str | None:
    """A PCI address as the kernel log prints it (domain:bus:device, 4-digit domain, lower
    case) from NVML's bus id ("00000000:3B:00.0") or the log's own ("0000:3b:00")."""
    if isinstance(bus_id, bytes):
        bus_id = bus_id.decode("ascii", "replace")
    if not bus_id:
        return None
    m = re.fullmatch(r"\s*([0-9A-Fa-f]{1,8}):([0-9A-Fa-f]{1,2}):([0-9A-Fa-f]{1,2})(?:\.[0-7])?\s*", bus_id)
    if m is None:
        return None
    domain, bus, dev = (int(x, 16) for x in m.groups())
    return f"{domain:04x}:{bus:02x}:{dev:02x}"


def parse_xid(message: str, at: float | None = None) -> KernelXid | None:
    """The Xid a kernel message reports, or None."""
    m = XID_LINE.search(message)
    if m is None:
        return None
    key = pci_key(m.group("pci"))
    if key is None:
        return None
    return KernelXid(key, int(m.group("xid")), m.group("rest").lstrip(" ,").strip()[:200], at)


def parse_kmsg_record(record: bytes, boot_wall: float) -> KernelXid | None:
    """One ``/dev/kmsg`` record ("pri,seq,usec,flags;message\\n KEY=VALUE...") as an Xid."""
    head, sep, body = record.partition(b";")
    if not sep:
        return None
    fields = head.split(b",")
    at = None
    if len(fields) >= 3 and fields[2].isdigit():
        at = boot_wall + int(fields[2]) / 1e6
    message = body.split(b"\n", 1)[0].decode("utf-8", "replace")
    return parse_xid(message, at)


def _boot_wall() -> float:
    """The wall time the kernel's record clock counts from (CLOCK_MONOTONIC's zero, which is
    what /dev/kmsg's timestamps use)."""
    return time.time() - time.monotonic()


class KernelXidWatcher:
    """``/dev/kmsg`` kept open; :meth:`poll` reads the records written since the last poll."""

    def __init__(self, path: str = KMSG, max_events: int = MAX_EVENTS) -> None:
        self.events: deque[KernelXid] = deque(maxlen=max_events)
        self.reason: str | None = None
        self._lock = threading.Lock()
        self._boot = _boot_wall()
        try:
            self._fd: int | None = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            self._fd = None
            self.reason = f"kernel log not readable ({path}: {exc.strerror or exc}; needs root or kernel.dmesg_restrict=0)"

    def poll(self) -> list[KernelXid]:
        """The Xids of the records written since the last poll (the first poll: every record the
        ring buffer still holds)."""
        new: list[KernelXid] = []
        with self._lock:
            if self._fd is None:
                return new
            for _ in range(MAX_RECORDS_PER_POLL):
                try:
                    record = os.read(self._fd, 8192)
                except BlockingIOError:
                    break
                except OSError as exc:
                    if exc.errno == errno.EPIPE:  # records overwritten before we read them: go on
                        continue
                    self.reason = f"kernel log read failed: {exc.strerror or exc}"
                    self.close_locked()
                    break
                if not record:
                    break
                x = parse_kmsg_record(record, self._boot)
                if x is not None:
                    new.append(x)
        self.events.extend(new)
        return new

    def by_pci(self, *, now: float | None = None, recent_s: float = RECENT_S) -> dict[str, tuple[int, ...]]:
        """The Xids of the last ``recent_s`` seconds held (and those whose time is not known),
        per PCI address, oldest first: a GPU that faulted yesterday and was reset since is not
        this job's hardware sign."""
        now = time.time() if now is None else now
        out: dict[str, list[int]] = {}
        for e in self.events:
            if e.at is None or now - e.at <= recent_s:
                out.setdefault(e.pci, []).append(e.xid)
        return {k: tuple(v) for k, v in out.items()}

    def close_locked(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def close(self) -> None:
        with self._lock:
            self.close_locked()


_process: dict[str, KernelXidWatcher | None] = {"watcher": None}
_process_lock = threading.Lock()


def process_watcher() -> KernelXidWatcher:
    """This process's one kernel-log watcher (opened on first use, kept for its life)."""
    with _process_lock:
        if _process["watcher"] is None:
            _process["watcher"] = KernelXidWatcher()
        return _process["watcher"]


def use_process_watcher(watcher: KernelXidWatcher | None) -> None:
    """Make ``watcher`` this process's kernel-log watcher (None: open the real one on next use);
    how a rehearsal or a test hands the snapshot a kernel log of its own."""
    with _process_lock:
        old = _process["watcher"]
        if old is not None and old is not watcher:
            old.close()
        _process["watcher"] = watcher
