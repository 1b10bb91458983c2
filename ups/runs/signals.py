"""Safe signalling: only processes a run's records name, only when their identity holds.

A pid alone is not an identity: after a process exits its pid can be handed to a stranger.
Every signal here is sent only when the live process's start time equals the start time the
record carries, and every action is appended to the run's event log with who and why.
"""

from __future__ import annotations

import errno
import os
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ups.errors import RefusedSignal
from ups.runs.rundir import RunDir
from ups.status.host import hostname
from ups.status.procs import process_start_time, same_start
from ups.status.record import StatusRecord

DEFAULT_GRACE_S = 5.0


def signal_name(signum: int | None) -> str | None:
    if signum is None:
        return None
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def own_lineage() -> set[int]:
    """This process and its ancestors: never to be signalled by a command it runs (an
    operator's `ups kill` from inside a job, a test runner whose own record is in a run)."""
    pids, pid = set(), os.getpid()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                data = fh.read()
            pid = int(data[data.rindex(b")") + 2 :].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return pids


def check_identity(record: StatusRecord) -> None:
    """Raise RefusedSignal unless ``record.pid`` is alive and is the process the record names,
    and is not this command's own process or one of its ancestors."""
    if record.host != hostname():
        raise RefusedSignal(f"{record.label} runs on {record.host}, not on this host ({hostname()}): act on it "
                            f"there, or with --remote {record.host}", exit_code=1)
    if record.pid in own_lineage():
        raise RefusedSignal(f"pid {record.pid} ({record.label}) is this command's own process or one of its "
                            "parents: refusing to signal it")
    live = process_start_time(record.pid)
    if live is None:
        raise RefusedSignal(f"{record.label} (pid {record.pid}) is not running", exit_code=1)
    if not same_start(live, record.pid_start):
        raise RefusedSignal(
            f"pid {record.pid} is not {record.label} of this run any more "
            f"(started {live:.2f}, record says {record.pid_start:.2f}): refusing to signal it"
        )


def is_alive(record: StatusRecord) -> bool:
    """The record's process lives on this host (another host's pid says nothing here)."""
    if record.host != hostname():
        return False
    return same_start(process_start_time(record.pid), record.pid_start)


def send_signal(run: RunDir, record: StatusRecord, signum: int, *, actor: str, reason: str) -> None:
    """Send one signal after the identity check, and log it."""
    check_identity(record)
    try:
        os.kill(record.pid, signum)
    except ProcessLookupError:
        raise RefusedSignal(f"{record.label} (pid {record.pid}) exited before the signal", exit_code=1) from None
    except PermissionError:
        raise RefusedSignal(f"not allowed to signal pid {record.pid} ({record.label})", exit_code=1) from None
    run.append_event(
        "signal",
        actor=actor,
        reason=reason,
        target=record.name,
        pid=record.pid,
        signal=signal_name(signum),
    )


@dataclass(frozen=True)
class KillResult:
    name: str
    pid: int
    outcome: str  # "terminated", "killed", "already gone", "refused: ...", "survived SIGKILL"


def terminate(
    run: RunDir,
    records: Iterable[StatusRecord],
    *,
    actor: str,
    reason: str,
    grace: float = DEFAULT_GRACE_S,
    force: bool = False,
) -> list[KillResult]:
    """SIGTERM (SIGKILL with ``force``) each live record's process, wait up to ``grace``,
    then SIGKILL the survivors. Identity is re-checked before every signal."""
    results: dict[str, KillResult] = {}
    waiting: list[StatusRecord] = []
    first = signal.SIGKILL if force else signal.SIGTERM
    for rec in records:
        try:
            send_signal(run, rec, first, actor=actor, reason=reason)
        except RefusedSignal as exc:
            gone = process_start_time(rec.pid) is None or exc.exit_code == 1
            results[rec.name] = KillResult(rec.name, rec.pid, "already gone" if gone else f"refused: {exc}")
            continue
        waiting.append(rec)
    deadline = time.monotonic() + (grace if not force else 2.0)
    while waiting and time.monotonic() < deadline:
        waiting = [r for r in waiting if _alive_or_refused(r, results, "killed" if force else "terminated")]
        if waiting:
            time.sleep(0.05)
    for rec in waiting:
        try:
            send_signal(run, rec, signal.SIGKILL, actor=actor, reason=f"{reason} (no exit after {grace:g} s)")
        except RefusedSignal:
            results[rec.name] = KillResult(rec.name, rec.pid, "terminated")
            continue
        end = time.monotonic() + 5.0
        while time.monotonic() < end and is_alive(rec):
            time.sleep(0.05)
        results[rec.name] = KillResult(
            rec.name, rec.pid, "survived SIGKILL (D state?)" if is_alive(rec) else "killed"
        )
    return list(results.values())


def _alive_or_refused(rec: StatusRecord, results: dict[str, KillResult], outcome: str) -> bool:
    if is_alive(rec):
        return True
    results[rec.name] = KillResult(rec.name, rec.pid, outcome)
    return False


def dump_stacks(run: RunDir, record: StatusRecord, *, actor: str, timeout: float = 5.0) -> str:
    """Ask a process's faulthandler to write all thread stacks; return what it wrote.

    Works while the process is blocked in a C call that holds the GIL (faulthandler writes
    from the signal handler). Refused for a process whose record does not say that it
    registered the handler: by default that signal would kill it.
    """
    if record.stack_signal is None or not record.stack_file:
        raise RefusedSignal(
            f"{record.label} (pid {record.pid}) registered no stack-dump handler; "
            "the signal would kill it"
        )
    check_identity(record)
    path = run.path / record.stack_file
    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    header = f"\n=== stack dump of {record.label} pid {record.pid} requested by {actor} at {time.strftime('%Y-%m-%d %H:%M:%S')} ===\n"
    from ups.status.safeio import OPEN_APPEND, BadFile, open_regular

    try:  # a FIFO or symlink named like the stack file is refused, never waited on or followed
        fd = open_regular(path, OPEN_APPEND)
    except (OSError, BadFile) as exc:
        raise RefusedSignal(f"{record.label}: stack file {record.stack_file} cannot be written: {exc}",
                            exit_code=1) from None
    try:
        os.write(fd, header.encode())
        start = os.fstat(fd).st_size
    finally:
        os.close(fd)
    send_signal(run, record, record.stack_signal, actor=actor, reason="dump stacks")
    return _wait_for_dump(path, start, timeout)


def _wait_for_dump(path: Path, start: int, timeout: float) -> str:
    """Wait until the file grew past ``start`` and then stopped growing for 200 ms."""
    deadline = time.monotonic() + timeout
    last_size, stable_since = start, None
    while time.monotonic() < deadline:
        try:
            size = path.stat().st_size
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                raise
            size = 0
        if size > start:
            if size == last_size:
                if stable_since is None:
                    stable_since = time.monotonic()
                elif time.monotonic() - stable_since >= 0.2:
                    break
            else:
                stable_since = None
        last_size = size
        time.sleep(0.05)
    from ups.status.safeio import BadFile, read_tail

    try:
        text = read_tail(path, 1 << 20, start)
    except (OSError, BadFile) as exc:
        raise RefusedSignal(f"cannot read the stack dump in {path}: {exc}", exit_code=1) from None
    if not text.strip():
        raise RefusedSignal(f"no stack dump appeared in {path} within {timeout:g} s", exit_code=1)
    return text


def last_stack_dump(run: RunDir, record: StatusRecord, max_bytes: int = 64_000) -> str | None:
    """The tail of a process's stack file (crash tracebacks and earlier dumps), if any."""
    if not record.stack_file:
        return None
    from ups.status.safeio import BadFile, read_tail

    try:
        text = read_tail(run.path / record.stack_file, max_bytes)
    except FileNotFoundError:
        return None
    except (OSError, BadFile) as exc:  # a FIFO or device named like a stack file: said, never waited on
        return f"unreadable: {record.stack_file}: {exc}\n"
    return text if text.strip() else None
