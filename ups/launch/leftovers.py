"""Nothing of a job is left behind when its run ends.

A job's top process can end while processes it started live on: ``mp.spawn``'s ranks after
their parent was killed, DataLoader workers of a rank that died, torch.compile's compile
workers, multiprocessing's resource tracker, anything that double-forked. Linux gives the
launcher two handles on all of them, both proof that a process is the job's:

* the launcher is a **child subreaper** (``prctl(PR_SET_CHILD_SUBREAPER)``): an orphan of the
  job is re-parented to the launcher, not to init, so it stays the launcher's descendant;
* the launcher leads a **session** of its own (``ups launch`` starts it with ``setsid``):
  every process the job started is in that session unless it made a session of its own
  (and then it is still a descendant, see above). No process outside can join a session.

At the run's end the launcher finds every process of its session and every descendant,
waits a moment for them to leave on their own (the resource tracker leaves once the last
process holding its pipe is gone), then SIGTERM, then SIGKILL, reaps them, looks again, and
names any survivor in the run's end. Every signal is logged as an event with its evidence;
an observe-only run logs what would be done and does nothing.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
from collections.abc import Collection
from dataclasses import asdict, dataclass

from ups.runs.rundir import RunDir
from ups.status import procfs
from ups.status.procs import process_start_time, same_start

PR_SET_CHILD_SUBREAPER = 36
SETTLE_S = 1.0  # the job's own clean-up (workers joined, the resource tracker's pipe closed)
TERM_GRACE_S = 3.0
STOPPING_GRACE_S = 0.5  # the run is being stopped: its processes had their SIGTERM already
KILL_WAIT_S = 2.0


def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants (Linux 3.4+)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


@dataclass(frozen=True)
class Leftover:
    pid: int
    start: float | None
    ppid: int
    command: str
    why: str  # "session" | "descendant": the proof that it is the job's


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, session) of a process (a zombie's too), None if gone or unreadable."""
    st = procfs.stat(pid)
    return None if st is None else (st.state, st.ppid, st.session)


def _command(pid: int) -> str:
    argv = procfs.cmdline(pid)
    return "?" if argv is None else " ".join(argv).strip()[:200]


def find(me: int | None = None, keep: Collection[int] = ()) -> list[Leftover]:
    """The live processes that are provably this launcher's job: its session (when it leads
    one) and its descendants, but ``keep`` (the launcher's own helpers: the job's output relay,
    which ends by itself once the job's pipe is closed). Zombies are not alive (``reap``
    collects ours)."""
    me = os.getpid() if me is None else me
    session = os.getsid(me) if os.getsid(me) == me else None
    table: dict[int, tuple[str, int, int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != me and int(entry) not in keep:
            st = _stat(int(entry))
            if st is not None:
                table[int(entry)] = st
    found: list[Leftover] = []
    for pid, (state, ppid, sid) in table.items():
        if state in ("Z", "X"):
            continue
        why = "session" if session is not None and sid == session else None
        if why is None:
            seen, up = set(), ppid
            while up not in (0, 1) and up not in seen and up in table:
                if up == me:
                    break
                seen.add(up)
                up = table[up][1]
            why = "descendant" if up == me or ppid == me else None
        if why is not None:
            found.append(Leftover(pid, process_start_time(pid), ppid, _command(pid), why))
    return found


def reap() -> None:
    """Collect the exit status of every ended child (orphans re-parented to us included)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _signal(proc: Leftover, signum: int) -> bool:
    """Signal ``proc`` only if it is still the process we found (pidfd: no PID reuse race)."""
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        return False
    try:
        if not same_start(process_start_time(proc.pid), proc.start):
            return False
        signal.pidfd_signal(fd, signum) if hasattr(signal, "pidfd_signal") else signal.pidfd_send_signal(fd, signum)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _alive(procs: list[Leftover]) -> list[Leftover]:
    reap()
    out = []
    for p in procs:
        st = _stat(p.pid)
        if st is not None and st[0] not in ("Z", "X") and same_start(process_start_time(p.pid), p.start):
            out.append(p)
    return out


def _wait_gone(procs: list[Leftover], seconds: float) -> list[Leftover]:
    deadline = time.monotonic() + seconds
    left = _alive(procs)
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = _alive(left)
    return left


def sweep(run: RunDir, *, actor: str, observe_only: bool, stopping: bool = False, keep: Collection[int] = ()) -> list[Leftover]:
    """End whatever the job left running; returns the survivors (to be named in the run's end).

    ``stopping``: the run is being killed, its processes were told to stop already: no
    settling time before the signals."""
    left = _wait_gone(find(keep=keep), 0.0 if stopping else SETTLE_S)
    if not left:
        return []
    evidence = [asdict(p) for p in left]
    if observe_only:
        run.append_event("leftovers", actor=actor, processes=evidence, action="observe-only: not signalled")
        return left
    grace = STOPPING_GRACE_S if stopping else TERM_GRACE_S
    for p in left:
        _signal(p, signal.SIGTERM)
    after_term = _wait_gone(left, grace)
    for p in after_term:
        _signal(p, signal.SIGKILL)
    survivors = _wait_gone(after_term, KILL_WAIT_S)
    # A process started by a leftover while we waited is the job's too: one more look.
    late = [p for p in find(keep=keep) if p.pid not in {q.pid for q in left}]
    for p in late:
        _signal(p, signal.SIGKILL)
    survivors += _wait_gone(late, KILL_WAIT_S)
    run.append_event("leftovers", actor=actor, processes=evidence, action=f"SIGTERM, then SIGKILL after {grace:g} s", terminated=[p.pid for p in left if p not in after_term],
                     killed=[p.pid for p in after_term + late if p not in survivors],
                     survivors=[asdict(p) for p in survivors])
    return survivors


def describe(survivors: list[Leftover]) -> str:
    shown = ", ".join(f"pid {p.pid} ({p.command[:60]})" for p in survivors[:4])
    more = f" and {len(survivors) - 4} more" if len(survivors) > 4 else ""
    return f"{len(survivors)} process(es) of the job still alive after its end: {shown}{more}"
