"""Safe signalling: only processes a run's records name, only when their identity holds.

A pid alone is not an identity: after a process exits its pid can be handed to a stranger,
and anyone who can write a file can name any pid. Every signal here is sent only when the
live process's start time equals the start time the record carries **and** the kernel proves
the process is the job's (:mod:`ups.runs.ownership`: the acting user's run, the run owner's
process, the launcher, its descendant or its session; never pid 1). Every action is appended
to the run's event log with who and why.

A stack-dump signal is sent only to a process that handles it *now* (its caught-signal mask
in ``/proc/PID/status``): a program may reset the handler (Lightning's teardown resets the
signals it touched to their default action, which for every user and real-time signal is
death). Where the handler is gone, a dump that cannot kill (py-spy) is used if it is
installed, else no dump, and the refusal says so.
"""

from __future__ import annotations

import errno
import os
import signal
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ups.errors import RefusedSignal
from ups.runs.ownership import JobScope, catches, check_record_owner, cmdline, proc_info
from ups.runs.rundir import RunDir
from ups.status import procfs
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
        if signal.SIGRTMIN < signum < signal.SIGRTMAX:
            return f"SIGRTMIN+{signum - signal.SIGRTMIN}"
        return f"signal {signum}"


def own_lineage() -> set[int]:
    """This process and its ancestors: never to be signalled by a command it runs (an
    operator's `ups kill` from inside a job, a test runner whose own record is in a run)."""
    pids, pid = set(), os.getpid()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        st = procfs.stat(pid)
        if st is None:
            break
        pid = st.ppid
    return pids


def check_identity(run: RunDir, record: StatusRecord, scope: JobScope | None = None) -> str:
    """Raise RefusedSignal unless ``record.pid`` is alive, is the process the record names,
    is provably the job's (see :mod:`ups.runs.ownership`), and is not this command's own
    process or one of its ancestors. Returns why it is the job's."""
    if record.host != hostname():
        raise RefusedSignal(f"{record.label} runs on {record.host}, not on this host ({hostname()}): act on it "
                            f"there, or with --remote {record.host}", exit_code=1)
    if record.pid <= 1:
        raise RefusedSignal(f"{record.label} names pid {record.pid}: ups never signals pid 1 or lower")
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
    scope = scope or JobScope.of_run(run.path)
    check_record_owner(run.status_dir / f"{record.name}.json", record.label)
    return scope.prove(record.pid, record.pid_start, record.label)


def _same_process(record: StatusRecord, proof: str) -> str:
    """``proof`` again, when ``record.pid`` is still the process that was proven the job's
    (alive, the same start time): a pid is never reused while its process lives."""
    live = process_start_time(record.pid)
    if live is None:
        raise RefusedSignal(f"{record.label} (pid {record.pid}) is not running", exit_code=1)
    if not same_start(live, record.pid_start):
        raise RefusedSignal(f"pid {record.pid} is not {record.label} of this run any more "
                            f"(started {live:.2f}, record says {record.pid_start:.2f}): refusing to signal it")
    return proof


def is_alive(record: StatusRecord) -> bool:
    """The record's process lives on this host (another host's pid says nothing here)."""
    if record.host != hostname():
        return False
    return same_start(process_start_time(record.pid), record.pid_start)


def send_signal(run: RunDir, record: StatusRecord, signum: int, *, actor: str, reason: str,
                scope: JobScope | None = None, proof: str | None = None) -> None:
    """Send one signal after the identity and ownership proof, and log it with the proof.

    ``proof``: the ownership proof :func:`check_identity` gave for this very process earlier in
    the same action (see :func:`terminate`); then only its identity is checked again."""
    proof = check_identity(run, record, scope) if proof is None else _same_process(record, proof)
    try:
        os.kill(record.pid, signum)
    except ProcessLookupError:
        raise RefusedSignal(f"{record.label} (pid {record.pid}) exited before the signal", exit_code=1) from None
    except PermissionError:
        raise RefusedSignal(f"not allowed to signal pid {record.pid} ({record.label})", exit_code=1) from None
    log_event(run, "signal", actor=actor, reason=reason, target=record.name, pid=record.pid, signal=signal_name(signum),
              proof=proof)


def log_event(run: RunDir, event: str, *, actor: str, **fields: object) -> None:
    """Log an action that was taken: a full disk (or a read-only one) must not turn a signal
    already sent into a traceback, nor stop the rest of a kill. What could not be logged is
    said on stderr, once per error."""
    try:
        run.append_event(event, actor=actor, **fields)
    except OSError as exc:
        why = exc.strerror or str(exc)
        if why not in _UNLOGGED:
            _UNLOGGED.add(why)
            print(f"ups: {event} not written to {run.events_path}: {why}", file=sys.stderr, flush=True)


_UNLOGGED: set[str] = set()


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
    then SIGKILL the survivors.

    Every process is proven the job's before the first signal, while the process tree is
    whole: torchrun starts each rank in a session of its own, so once its agent is gone a rank
    is re-parented to init and nothing in the kernel ties it to the job any more (a forced kill
    that signalled the agent first then refused every rank and left them running). Identity
    (the pid's start time) is re-checked before every signal."""
    records = list(records)
    results: dict[str, KillResult] = {}
    waiting: list[StatusRecord] = []
    first = signal.SIGKILL if force else signal.SIGTERM
    scope = JobScope.of_run(run.path)  # refuses a run this user may not act on, before any signal
    proofs: dict[str, str] = {}
    for rec in records:
        try:
            proofs[rec.name] = check_identity(run, rec, scope)
        except RefusedSignal as exc:
            gone = process_start_time(rec.pid) is None or exc.exit_code == 1
            results[rec.name] = KillResult(rec.name, rec.pid, "already gone" if gone else f"refused: {exc}")
    for rec in records:
        if rec.name not in proofs:
            continue
        try:
            send_signal(run, rec, first, actor=actor, reason=reason, scope=scope, proof=proofs[rec.name])
        except RefusedSignal:
            results[rec.name] = KillResult(rec.name, rec.pid, "already gone")
            continue
        waiting.append(rec)
    deadline = time.monotonic() + (grace if not force else 2.0)
    while waiting and time.monotonic() < deadline:
        waiting = [r for r in waiting if _alive_or_refused(r, results, "killed" if force else "terminated")]
        if waiting:
            time.sleep(0.05)
    for rec in waiting:
        try:
            send_signal(run, rec, signal.SIGKILL, actor=actor, reason=f"{reason} (no exit after {grace:g} s)", scope=scope,
                        proof=proofs[rec.name])
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


def unrecorded_members(scope: JobScope, named: Iterable[int] = ()) -> list[tuple[int, float, str]]:
    """Live processes the kernel proves the job's that no record named: ``(pid, start, proof)``.

    What a kill from the records alone misses: a job killed before it wrote its first record,
    DataLoader workers started a moment before the kill, whatever was orphaned when the
    launcher died (re-parented to init once the subreaper is gone), the launcher's own helpers.
    Each is proven by :meth:`JobScope.prove` (the job's session, or a descendant of its
    launcher or top process; never by descending from this command alone), never this
    command or one of its parents."""
    skip = own_lineage() | set(named)
    out = []
    for entry in os.listdir("/proc"):
        pid = int(entry) if entry.isdigit() else 0
        info = proc_info(pid) if pid > 1 and pid not in skip else None
        if info is None or info.start is None or info.uid != scope.owner:
            continue
        try:
            out.append((pid, info.start, scope.prove(pid, info.start, f"pid {pid}", via_actor=False)))
        except RefusedSignal:
            continue
    return out


def end_unrecorded(run: RunDir, scope: JobScope, named: Iterable[int], *, actor: str, reason: str, grace: float,
                   force: bool) -> list[KillResult]:
    """End every :func:`unrecorded_members` process as :func:`terminate` ends a record's (each
    signal re-proven, logged with its proof, "no record names it"). The job's output relay goes
    last, once the processes that write into it are gone, so what they printed reaches the log."""
    results: list[KillResult] = []
    for relay in (False, True):
        members = [m for m in unrecorded_members(scope, [*named, *(r.pid for r in results)])
                   if ("ups.launch.logrelay" in (cmdline(m[0]) or [])) == relay]
        deadline = time.monotonic() + (2.0 if relay else 0.0)  # the relay leaves at the end of its input
        while members and time.monotonic() < deadline:
            time.sleep(0.05)
            members = [m for m in members if same_start(process_start_time(m[0]), m[1])]
        stand_ins = [StatusRecord(run_id=run.run_id, role="helper", name=f"pid {pid}", pid=pid, pid_start=start,
                                  host=hostname()) for pid, start, _ in members]
        results += terminate(run, stand_ins, actor=actor, reason=f"{reason} (no record names it)", grace=grace, force=force)
    return results


def _alive_or_refused(rec: StatusRecord, results: dict[str, KillResult], outcome: str) -> bool:
    if is_alive(rec):
        return True
    results[rec.name] = KillResult(rec.name, rec.pid, outcome)
    return False


def is_dump_signal(signum: int) -> bool:
    """A signal with no meaning but the one a program gives it: a record (which anyone who can
    write the folder may forge) never makes a "stack dump" a SIGTERM, SIGINT or SIGHUP."""
    return signum in (signal.SIGUSR1, signal.SIGUSR2) or signal.SIGRTMIN <= signum <= signal.SIGRTMAX


class HandlerGone(RefusedSignal):
    """The process no longer handles the stack-dump signal: sending it could kill it."""


def dump_stacks(run: RunDir, record: StatusRecord, *, actor: str, timeout: float = 5.0,
                scope: JobScope | None = None) -> str:
    """Ask a process's faulthandler to write all thread stacks; return what it wrote.

    Works while the process is blocked in a C call that holds the GIL (faulthandler writes
    from the signal handler). Never signalled: a process of an attached job (watched from
    outside), one whose record names no handler, and one whose caught-signal mask says the
    handler is gone now (the program reset it; its heartbeat may not have said so yet): by
    default that signal would kill it. Their stacks are read from outside instead (py-spy,
    if installed and allowed: the same stack-file format, so a hang is proven from two such
    dumps as from any other), else HandlerGone says why.
    """
    if record.stack_signal is not None and not is_dump_signal(record.stack_signal):
        raise RefusedSignal(f"{record.label} (pid {record.pid}) names {signal_name(record.stack_signal)} as its stack-dump "
                            "signal: ups dumps stacks only with SIGUSR1, SIGUSR2 or a real-time signal", exit_code=1)
    proof = check_identity(run, record, scope)
    sig = signal_name(record.stack_signal)
    attached = record.stack_signal is None and record.metrics.get("attached") is True and record.role != "launcher"
    if attached or record.stack_signal is None or not record.stack_file or not catches(record.pid, record.stack_signal):
        if attached:
            note, refusal = ("attached job: read from outside, no signal",
                             f"{record.label} (pid {record.pid}) is watched from outside (ups attach) and never signalled")
        elif record.stack_signal is not None and record.stack_file:
            note = refusal = f"{record.label} (pid {record.pid}) no longer handles {sig} (handler gone; not signalled)"
        else:
            note = refusal = (f"{record.label} (pid {record.pid}) registered no stack-dump handler (not signalled: the "
                              "signal would kill it)")
        text = read_stacks_outside(record.pid, record.label, actor, timeout, note=None if attached else note)
        if text is None:
            raise HandlerGone(f"{refusal}; no {'fresh ' if attached else ''}dump: py-spy is not installed or not "
                              "permitted", exit_code=1)
        if record.stack_file and not attached:  # an attached job's stack files are its observer's
            _append_stack_file(record, run.path / record.stack_file, "\n" + text)
        log_event(run, "stacks.pyspy", actor=actor, target=record.name, pid=record.pid, reason=note, proof=proof)
        return text
    path = run.path / record.stack_file
    header = f"\n=== stack dump of {record.label} pid {record.pid} requested by {actor} at {time.strftime('%Y-%m-%d %H:%M:%S')} ===\n"
    start = _append_stack_file(record, path, header)
    send_signal(run, record, record.stack_signal, actor=actor, reason="dump stacks", scope=scope)
    return _wait_for_dump(path, start, timeout)


def _append_stack_file(record: StatusRecord, path: Path, text: str) -> int:
    """Append to a stack file through the trust boundary's opener (a FIFO, device or symlink
    named like it is refused, never waited on or followed); returns its size after the append.
    Its folder is made and opened relative to the run folder, no link followed."""
    from ups.status.confined import in_folder, make_dirs
    from ups.status.safeio import OPEN_APPEND, BadFile, open_regular

    rel = Path(record.stack_file)
    try:
        folder = make_dirs(path.parents[len(rel.parts) - 1], str(rel.parent))
        try:
            fd = open_regular(in_folder(folder, rel.name), OPEN_APPEND)
        finally:
            os.close(folder)
    except (OSError, BadFile) as exc:
        raise RefusedSignal(f"{record.label}: stack file {record.stack_file} cannot be written: "
                            f"{getattr(exc, 'strerror', None) or exc}; not signalled", exit_code=1) from None
    try:
        os.write(fd, text.encode())
        return os.fstat(fd).st_size
    except OSError as exc:
        raise RefusedSignal(f"{record.label}: stack file {record.stack_file} cannot be written: {exc.strerror or exc}; "
                            "not signalled", exit_code=1) from None
    finally:
        os.close(fd)


def read_stacks_outside(pid: int, label: str, actor: str, timeout: float, note: str | None = None) -> str | None:
    """Every thread's stack of ``pid`` read by py-spy (:mod:`ups.runs.pyspy`: its memory read
    while it runs, no pause, no signal), in the stack-file format (faulthandler's, under a
    ``=== stack dump of ...`` header) that :mod:`ups.why.stacks` reads, so that a hang is proven
    from two such dumps as from any other; None when py-spy is missing, not permitted or fails."""
    from ups.runs.pyspy import DumpRefused, as_faulthandler, dump_json

    try:
        threads = dump_json(pid, timeout=max(timeout, 1.0))
    except DumpRefused:
        return None
    return as_faulthandler(threads, label, pid, actor, note=note)


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
