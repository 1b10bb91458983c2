"""Is it working? What the kernel says a process did, watched from outside: the proof that
an automatic action needs (docs/design.md, "An action is not a display").

Showing "stalled" is cheap; killing or restarting a run needs a hang that is proven. The
launcher watches the processes a verdict points at (the rank the others wait for, the worker
its rank waits on, a process that made no progress) once a second, from ``/proc`` only (no
ptrace, no signal, nothing inside the watched process), in windows of :data:`WINDOW_S`:

* per thread: time on a CPU and time runnable (``schedstat``: the thread's *demand*, near 1
  for a computing thread however loaded the machine is, near 0 for a sleeper), voluntary
  context switches, the kernel wait (``wchan``), bytes read and written (``io``);
* the process and its live descendants (a rank that waits on its child ``curl`` is uploading),
  DataLoader workers aside (they are judged on their own), the Reporter's heartbeat thread
  aside (it writes the record: ~1 ms of CPU and ~2 KB of I/O a second in every process);
* the bytes its TCP sockets moved (``ss``: ``send()`` on a socket is not in ``/proc/PID/io``,
  and a process blocked until a slow server drains it shows no CPU and no I/O at all).

A window is **busy** when a thread's demand is at least 30 %, or the tree used 10 % of a core,
or 4 KiB/s of file or socket I/O moved; **idle** when the tree used at most 2 % of a core,
every thread's demand is at most 5 %, less than 256 B/s of I/O and no socket bytes moved (or
it sat in uninterruptible sleep with nothing moving); **unsure** otherwise. A hang is
**proven** when it was idle for :data:`PROOF_IDLE_S` in a row (two windows of :data:`WINDOW_S`,
or ten short ones) and the process's stack is the same in two dumps at least
:data:`STACK_GAP_S` apart (for a process in D state, which cannot take the dump
signal, the same kernel wait throughout). A busy process is never acted on, however long it
takes; an unsure one neither. Measured on this project's drills: an evaluating rank (demand
99-100 %), a checkpoint to a throttled stream (144 KB/s written), an upload through a child
(133 KB/s acked on its socket) are busy; a rank asleep in its own code, a rank waiting in
gloo's all_reduce (gloo does not busy-poll: 0.3 % of a core, all in its loop threads), a
DataLoader worker asleep in ``__getitem__`` are idle.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

from ups.status import procfs

WINDOW_S = 5.0
SHORT_WINDOW_S = 1.0  # a process that stepped regularly: its silence is judged second by second
PROOF_IDLE_S = 2 * WINDOW_S  # idle this long in a row (every window of it idle) for an action
WINDOWS_KEPT = 32
STACK_GAP_S = 10.0
BUSY_DEMAND = 0.30
BUSY_CPU = 0.10  # of one core, the whole tree
BUSY_IO_BPS = 4096
IDLE_CPU = 0.02
IDLE_DEMAND = 0.05
IDLE_IO_BPS = 256
HEARTBEAT_COMM = "ups-heartbeat"
WORKER_COMM = "pt_data_worker"  # torch names every DataLoader worker's threads so
IO_KEYS = ("rchar", "wchar")


def _read(path: str) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, 1 << 16)
    except OSError:
        return None
    finally:
        os.close(fd)


@dataclass(frozen=True)
class ThreadSample:
    cpu_ns: int
    wait_ns: int
    vcsw: int
    io: int  # rchar + wchar
    state: str
    wchan: str | None
    comm: str


@dataclass(frozen=True)
class TreeSample:
    """One look at a process and its descendants: its threads by (pid, tid)."""

    at: float
    threads: dict[tuple[int, int], ThreadSample]
    procs: dict[int, str]  # pid -> comm
    sockets: frozenset[int]  # socket inodes of the tree
    main_state: str | None
    main_wchan: str | None


def _thread(pid: int, tid: int) -> ThreadSample | None:
    base = f"/proc/{pid}/task/{tid}"
    st = procfs.stat(pid, tid)
    if st is None:
        return None
    ticks = (st.utime + st.stime) * (1_000_000_000 // procfs.clock_ticks())
    sched = (_read(f"{base}/schedstat") or b"").split()
    cpu_ns, wait_ns = (int(sched[0]), int(sched[1])) if len(sched) >= 2 else (ticks, 0)
    vcsw = int((procfs.status(pid, tid) or {}).get("voluntary_ctxt_switches") or 0)
    io = 0
    for line in (_read(f"{base}/io") or b"").splitlines():
        key, _, value = line.partition(b":")
        if key.decode() in IO_KEYS:
            io += int(value)
    wchan = (_read(f"{base}/wchan") or b"").decode(errors="replace").strip()
    return ThreadSample(cpu_ns, wait_ns, vcsw, io, st.state, wchan if wchan not in ("", "0") else None, st.comm)


def children_of(pids: set[int]) -> dict[int, list[int]]:
    """ppid -> pids for every process whose parent is in the tree being built (one /proc scan)."""
    kids: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        st = procfs.stat(int(name))
        if st is not None:
            kids.setdefault(st.ppid, []).append(int(name))
    return kids


def sample_tree(pid: int, *, exclude_tids: set[int] = frozenset(), exclude_pids: set[int] = frozenset(),
                kids: dict[int, list[int]] | None = None) -> TreeSample | None:
    """The process ``pid`` and its live descendants, DataLoader workers and the excluded
    threads (a heartbeat thread) aside; None when the process is gone."""
    kids = children_of({pid}) if kids is None else kids
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        if p in exclude_pids and p != pid:
            continue
        tree.append(p)
        todo.extend(kids.get(p, []))
    threads: dict[tuple[int, int], ThreadSample] = {}
    procs: dict[int, str] = {}
    sockets: set[int] = set()
    main_state = main_wchan = None
    for p in tree:
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{p}/task")]
        except OSError:
            if p == pid:
                return None
            continue
        for tid in tids:
            t = _thread(p, tid)
            if t is None:
                continue
            if p != pid and t.comm == WORKER_COMM:
                break  # a DataLoader worker is judged on its own
            if tid == pid:
                main_state, main_wchan = t.state, t.wchan
            if tid in exclude_tids or t.comm == HEARTBEAT_COMM:
                continue
            threads[(p, tid)] = t
            procs[p] = procs.get(p) or t.comm
        sockets |= _socket_inodes(p)
    return TreeSample(time.monotonic(), threads, procs, frozenset(sockets), main_state, main_wchan)


def _socket_inodes(pid: int) -> set[int]:
    out = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return out
    for fd in fds:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            out.add(int(link[8:-1]))
    return out


_SS = re.compile(rb"\b(bytes_acked|bytes_received|ino):(\d+)")


def tcp_bytes() -> dict[int, int]:
    """Bytes acked + received so far by every TCP socket of this host, by inode (``ss -tinHe``:
    netlink's socket statistics); empty when ss is not there."""
    try:
        out = subprocess.run(["ss", "-tinHe"], capture_output=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    found: dict[int, int] = {}
    ino, moved = None, 0
    for line in out.splitlines():
        if not line.startswith((b"\t", b" ")):
            if ino:
                found[ino] = moved
            ino, moved = None, 0
        for key, value in _SS.findall(line):
            if key == b"ino":
                ino = int(value) or None
            else:
                moved += int(value)
    if ino:
        found[ino] = moved
    return found


@dataclass(frozen=True)
class Window:
    """What a tree did over one window, and what that says."""

    seconds: float
    cpu: float  # cores used by the tree (1.0 = one core)
    demand: float  # the highest demand of one thread
    io_bps: float
    tcp_bps: float
    wakeups: int
    d_state: bool  # the main thread was in uninterruptible sleep in every sample
    main_wchan: str | None
    children: tuple[str, ...]  # "curl (pid 42)": what else of the tree was alive
    verdict: str  # busy | idle | unsure

    def describe(self) -> str:
        bits = [f"CPU {self.cpu * 100:.0f}% (a thread busy {self.demand * 100:.0f}% of the time)"]
        if self.io_bps >= 1:
            bits.append(f"I/O {_rate(self.io_bps)}")
        if self.tcp_bps >= 1:
            bits.append(f"network {_rate(self.tcp_bps)}")
        if self.children:
            bits.append(f"with {', '.join(self.children[:3])}")
        if self.main_wchan:
            bits.append(f"kernel wait {self.main_wchan}")
        return f"{', '.join(bits)} over {self.seconds:.0f} s"

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "seconds": round(self.seconds, 1), "cpu": round(self.cpu, 3),
                "demand": round(self.demand, 3), "io_bps": round(self.io_bps), "tcp_bps": round(self.tcp_bps),
                "wakeups": self.wakeups, "d_state": self.d_state, "wchan": self.main_wchan, "children": list(self.children),
                "text": self.describe()}


def _rate(bps: float) -> str:
    return f"{bps / 1e6:.1f} MB/s" if bps >= 1e6 else f"{bps / 1e3:.0f} KB/s" if bps >= 1e3 else f"{bps:.0f} B/s"


def judge(first: TreeSample, last: TreeSample, *, tcp: tuple[dict[int, int], dict[int, int]] | None, d_state: bool,
          pid: int, ours: int = 0) -> Window:
    """The window between two samples of one tree (a thread or child that appeared in it counts
    from zero: its whole life is inside the window). ``ours``: bytes the process wrote because
    we asked (its stack dumps), which are no work of its own."""
    seconds = max(1e-3, last.at - first.at)
    cpu_ns = io = wakeups = 0
    demand = 0.0
    for key, b in last.threads.items():
        a = first.threads.get(key)
        d_cpu = b.cpu_ns - (a.cpu_ns if a else 0)
        d_wait = b.wait_ns - (a.wait_ns if a else 0)
        cpu_ns += max(0, d_cpu)
        demand = max(demand, max(0, d_cpu + d_wait) / 1e9 / seconds)
        io += max(0, b.io - (a.io if a else 0))
        wakeups += max(0, b.vcsw - (a.vcsw if a else 0))
    tcp_moved = 0
    if tcp is not None:
        before, after = tcp
        for ino in last.sockets | first.sockets:
            if ino not in after:
                continue
            base = before.get(ino)
            if base is None:  # opened inside the window: all its bytes moved in it
                base = 0 if ino not in first.sockets else after[ino]
            tcp_moved += max(0, after[ino] - base)
    cpu = cpu_ns / 1e9 / seconds
    io_bps, tcp_bps = max(0, io - ours) / seconds, tcp_moved / seconds
    children = tuple(f"{comm} (pid {p})" for p, comm in sorted(last.procs.items()) if p != pid)
    if demand >= BUSY_DEMAND or cpu >= BUSY_CPU or io_bps >= BUSY_IO_BPS or tcp_bps >= BUSY_IO_BPS:
        verdict = "busy"
    elif (cpu <= IDLE_CPU and demand <= IDLE_DEMAND and io_bps < IDLE_IO_BPS and not tcp_moved) or (
            d_state and io_bps < IDLE_IO_BPS and not tcp_moved):
        verdict = "idle"
    else:
        verdict = "unsure"
    return Window(seconds, cpu, demand, io_bps, tcp_bps, wakeups, d_state, last.main_wchan, children, verdict)


@dataclass
class Watched:
    """One process being watched: its windows so far and its stack dumps."""

    name: str
    pid: int
    exclude_tids: set[int]
    started: float
    first: TreeSample | None = None
    d_samples: int = 0
    samples: int = 0
    wchans: set[str] = field(default_factory=set)
    tcp_before: dict[int, int] | None = None
    windows: list[Window] = field(default_factory=list)
    stacks: list[tuple[float, tuple]] = field(default_factory=list)  # (when, the main thread's frames)
    stack_file: str | None = None  # where its stack dumps go: their bytes are ours, not its work
    stack_size: int = 0  # at the window's start
    window: float = WINDOW_S  # this process's window (SHORT_WINDOW_S when it stepped regularly)

    @property
    def state(self) -> str:
        if not self.windows:
            return "watching"
        return self.windows[-1].verdict

    def idle_windows(self) -> int:
        n = 0
        for w in reversed(self.windows):
            if w.verdict != "idle":
                break
            n += 1
        return n

    def idle_seconds(self) -> float:
        """Seconds of the latest windows in a row that were all idle."""
        total = 0.0
        for w in reversed(self.windows):
            if w.verdict != "idle":
                break
            total += w.seconds
        return total

    def shown(self, *, peers_wait: bool = False) -> str:
        """What readers may say of it now (its display state): idle once it was idle for a whole
        WINDOW_S, or for one short window when its peers already wait for it in a collective
        (evidence from the run itself); "watching" until then. An action needs :meth:`proven`."""
        state = self.state
        if state == "idle" and self.idle_seconds() < WINDOW_S - 0.05 and not peers_wait:
            return "watching"
        return state

    def same_stack(self) -> bool | None:
        """Two dumps at least STACK_GAP_S apart with the same main-thread frames (None: not
        two dumps yet). A process in uninterruptible sleep throughout cannot take the dump
        signal: the same kernel wait in every sample stands for it."""
        if self.samples and self.d_samples == self.samples and len(self.wchans) <= 1 and self.idle_seconds() >= PROOF_IDLE_S - 0.05:
            return True
        if len(self.stacks) < 2:
            return None
        (t0, a), (t1, b) = self.stacks[0], self.stacks[-1]
        if t1 - t0 < STACK_GAP_S:
            return None
        return a == b and bool(a)

    def proven(self, *, stacks: bool = True) -> bool:
        """Idle for PROOF_IDLE_S in a row (two windows of WINDOW_S) and (``stacks``) the same
        stack in two dumps."""
        return self.idle_seconds() >= PROOF_IDLE_S - 0.05 and (self.same_stack() is True or not stacks)

    def to_dict(self, *, peers_wait: bool = False) -> dict[str, Any]:
        last = self.windows[-1] if self.windows else None
        return {"pid": self.pid, "state": self.shown(peers_wait=peers_wait), "windows": len(self.windows),
                "idle_windows": self.idle_windows(), "idle_s": round(self.idle_seconds(), 1), "peers_wait": peers_wait,
                "same_stack": self.same_stack(), "proven": self.proven(), "since": self.started,
                "last": last.to_dict() if last else None}


def _size(path: str | None) -> int:
    try:
        return os.stat(path).st_size if path else 0
    except OSError:
        return 0


class Observer:
    """Watches the processes it is given, one sample a second, and judges each window.

    The supervisor calls :meth:`tick` from its loop with the processes to watch now (name ->
    (pid, heartbeat thread id)); a process not named any more is forgotten (its episode
    ended), one named again starts afresh."""

    def __init__(self, *, window: float = WINDOW_S, clock=time.monotonic) -> None:
        self.window = window
        self.clock = clock
        self.watched: dict[str, Watched] = {}

    def tick(self, targets: dict[str, tuple[int, int | None, str | None]], *,
             exclude_pids: set[int] = frozenset(), windows: dict[str, float] | None = None) -> dict[str, Watched]:
        """One sample of each target (name -> (pid, heartbeat thread id, stack file)); ``windows``:
        a target's own window length (a process that stepped regularly: SHORT_WINDOW_S)."""
        now = self.clock()
        for name in [n for n, w in self.watched.items() if n not in targets or targets[n][0] != w.pid]:
            del self.watched[name]
        if not targets:
            return {}
        kids = children_of(set())
        need_tcp = False
        samples: dict[str, TreeSample] = {}
        for name, (pid, hb_tid, stack_file) in targets.items():
            w = self.watched.get(name)
            if w is None:
                w = self.watched[name] = Watched(name, pid, {hb_tid} if hb_tid else set(), now, stack_file=stack_file,
                                                 window=(windows or {}).get(name, self.window))
            s = sample_tree(pid, exclude_tids=w.exclude_tids, exclude_pids=exclude_pids, kids=kids)
            if s is None:
                del self.watched[name]
                continue
            samples[name] = s
            w.samples += 1
            w.d_samples += s.main_state == "D"
            if s.main_wchan:
                w.wchans.add(s.main_wchan)
            if w.first is None or now - w.first.at >= w.window:
                need_tcp = True
        tcp_now = tcp_bytes() if need_tcp and any(s.sockets for s in samples.values()) else {}
        for name, s in samples.items():
            w = self.watched[name]
            if w.first is None:
                w.first, w.tcp_before, w.stack_size = s, tcp_now, _size(w.stack_file)
                continue
            if now - w.first.at >= w.window:
                size = _size(w.stack_file)
                w.windows.append(judge(w.first, s, tcp=(w.tcp_before or {}, tcp_now) if s.sockets else None,
                                       d_state=w.d_samples == w.samples and w.samples > 0, pid=w.pid,
                                       ours=max(0, size - w.stack_size) + (1024 if size > w.stack_size else 0)))
                del w.windows[:-WINDOWS_KEPT]
                w.first, w.tcp_before, w.stack_size = s, tcp_now, size
                w.d_samples = w.samples = 0
                w.wchans = set()
        return dict(self.watched)

    def note_stack(self, name: str, frames: tuple) -> None:
        """A dump of the watched process's stacks was taken now: its main thread's frames."""
        w = self.watched.get(name)
        if w is not None:
            w.stacks.append((self.clock(), frames))
            del w.stacks[1:-1]  # the first and the latest are what the proof compares

    def wants_stack(self, name: str) -> bool:
        """A dump is due: the first one when watching starts, the next STACK_GAP_S later."""
        w = self.watched.get(name)
        if w is None:
            return False
        if not w.stacks:
            return True
        return len(w.stacks) == 1 and self.clock() - w.stacks[0][0] >= STACK_GAP_S
