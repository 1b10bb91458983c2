"""The observer of an attached run: its only writer, as the launcher is for a launched run.

``python -m ups.attach.observe RUN_DIR``, started detached by ``ups attach`` (a session of its
own: closing the terminal does not stop it). It never signals the job and puts nothing into
it. Once a second it:

* follows the job's process tree from its top process (new DataLoader workers, ended ones);
* samples every rank and worker from ``/proc`` (:class:`ups.launch.proof.Observer`: CPU and
  run-queue time per thread, I/O, state, kernel wait, socket bytes), in windows of 5 s;
* every :data:`STACK_EVERY_S` reads each one's stacks with ``py-spy dump`` (ptrace, no
  signal), into ``stacks/<name>.txt`` in the format ``ups why`` reads;
* copies what the job writes to its log into ``logs/job.log`` (the last 64 KiB before the
  attach, then everything after), read through the job's own open file, never its path, and
  capped (:mod:`ups.attach.joblog`), and reads its progress counter there
  (:class:`ups.launch.lineprogress.LineProgress`: tqdm, k/n, "step 3 of 9");
* writes a status record for each process (``ups.status.record``), on its behalf: progress
  moves when the process was seen working (a busy window, or a different stack than the last
  dump); ``collective`` names the torch.distributed call its stack is in.

When every process of the job is gone it writes how the run ended, as far as is known from
outside: which processes it saw end and when, and the root cause its log names
(:func:`ups.why.logread.read_log`); never an exit code it did not see.

``--notify`` (or the user's config file's targets): the launcher's notifier
(:class:`ups.notify.Notifier`, queued and delivered off this loop), told of a hang once it is
proven (with its proof, from this observer's own windows and py-spy stacks), of any other
problem verdict, and of the run's end.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from ups.attach import pyspy
from ups.attach.churn import WorkerChurn, rank_lives
from ups.attach.ending import ACTOR, write_end
from ups.attach.find import Proc, node_names, session_led, tree_procs
from ups.attach.joblog import JobLog
from ups.attach.progress import (
    LogProgress,
    note_position,
    note_turn,
    progress_fields,
    progress_metrics,
    take_progress,
)
from ups.errors import UpsError
from ups.launch.lineprogress import LineProgress
from ups.launch.proof import Observer
from ups.runs.rundir import FINAL_RUN_STATES, RunDir
from ups.status.health import STACK_READ_EVERY_S
from ups.status.host import boot_id, hostname
from ups.status.procs import process_start_time, same_start, this_process_start
from ups.status.record import SCHEMA_VERSION, StatusRecord
from ups.status.reporter import Reporter
from ups.status.schema import process_name
from ups.status.vocabulary import is_stdlib_file
from ups.why.rules.collectives import SEEN_FROM_OUTSIDE

TICK_S = 1.0
STACK_EVERY_S = STACK_READ_EVERY_S
"""One py-spy dump of each process every 10 s: a pause of a few ms (measured by
scripts/bench_attach.py), far below 1 % of the job's time."""
SECOND_LOOK_S = 1.0
EARLY_READS = 12
"""A rank's first :data:`EARLY_READS` reads come :data:`SECOND_LOOK_S` apart (one refused, as a
read that races the running process may be, is made again at once), until two of them caught its
fit loop's position (a Lightning rank's epoch and batch, where no line counts): its
rate within seconds of the attach, though a read between two epochs or in its data loading
catches none. Then every :data:`STACK_EVERY_S`."""
STACK_KEEP_S = 60.0  # an unchanged stack is appended again at most this often
STACK_FILE_MAX = 1 << 20
PHASE = "attached"
WATCHED_ROLES = ("rank", "worker")
TELL_EVERY_S = 2.0  # with a notifier: how often the run is judged (ups why's verdict) for it
ENDED_KEPT = 64
"""Ended processes named by their pid (helpers, which never come back under the same name) kept
for the end's list: the latest ones; every end is in events.jsonl (``process.gone``)."""


@dataclass
class Seen:
    """What the observer knows of one process of the job."""

    proc: Proc
    started_mono: float
    progress_at: float
    progress_mono: float
    windows: int = 0  # windows judged so far (proof.Observer's)
    dump: pyspy.Dump | None = None
    dumped_mono: float = 0.0
    written_frames: tuple = ()
    written_mono: float = 0.0
    coll: dict[str, Any] | None = None
    phase: str = "attached"
    phase_at: float = 0.0
    phase_mono: float = 0.0
    gone_at: float | None = None
    inproc: bool = False  # --inject: its in-process Reporter writes its record now, not us
    extra: dict[str, Any] = field(default_factory=dict)


class AttachObserver:
    def __init__(self, run: RunDir) -> None:
        self.run = run
        self.manifest = run.read_manifest()
        att = self.manifest.get("attached") or {}
        job = self.manifest.get("job") or {}
        self.top, self.top_start = int(job["pid"]), job.get("pid_start")
        # The job's roots: its top, or each of its orphaned ranks (they share no parent).
        self.roots = [(r["pid"], r.get("pid_start")) for r in job.get("roots") or [] if isinstance(r, dict)
                      and isinstance(r.get("pid"), int)] or [(self.top, self.top_start)]
        self.log = JobLog(run, att, lambda what, **f: run.append_event(what, actor=ACTOR, **f))
        self.seen: dict[str, Seen] = {}
        self.ended: deque[dict[str, Any]] = deque(maxlen=ENDED_KEPT)  # helpers seen gone: name, pid, gone_at
        self.proof = Observer()
        self.lines = LineProgress()
        self.progress = LogProgress()  # each rank's steps and epochs, from the log's lines (ups.attach.progress)
        self.churn = WorkerChurn(run, self.record)  # DataLoader workers' ends: a generation's, or a death
        self.stop: str | None = None
        self.no_dumps: str | None = None  # said once: py-spy missing, ptrace refused
        self.pending = b""
        self.boot = boot_id()
        self.host = hostname()
        self.run_id = self.manifest.get("id") or run.run_id
        self.multinode = run.is_multinode  # one node of a run of several: its agent is agent@<host>
        self.tick_at, self.tick_mono = time.time(), time.monotonic()
        self.notifier: Any = None  # ups.notify.Notifier: --notify, or the config file's targets
        self.inject = bool(self.manifest.get("inject"))
        self.told_mono = 0.0
        self.published: dict[str, Any] = {}  # the last ``observed`` given to the reporter
        self.exits = exit_listener()

    # -- the process tree ----------------------------------------------------------------
    def refresh(self) -> None:
        # The trees under the job's live roots, and under any rank seen before that lives on
        # outside them (its agent died while watched: the rank, re-parented to init, is still the job's).
        roots = [pid for pid, start in self.roots if same_start(process_start_time(pid), start)]
        try:
            procs = tree_procs(roots)
            covered = {p.pid for p in procs}
            orphaned = [s for s in self.seen.values() if s.gone_at is None and s.proc.role == "rank"
                        and s.proc.pid not in covered and same_start(process_start_time(s.proc.pid), s.proc.start)]
            if orphaned:
                self.orphaned(orphaned)
                procs = tree_procs(roots + [s.proc.pid for s in orphaned])
        except Exception:  # noqa: BLE001 - a process ended between two reads: what is known stays
            procs = []
        if self.multinode:
            node_names(procs, self.host)
        now, mono = time.time(), time.monotonic()
        live = {p.name: p for p in procs if p.start is not None}
        for name, p in live.items():
            s = self.seen.get(name)
            if s is None or s.proc.pid != p.pid or s.gone_at is not None:
                if s is not None and s.gone_at is None and s.proc.role == "worker" and s.proc.pid != p.pid:
                    # the next generation took its slot first
                    self.churn.gone(s, self.seen, now, self.tick_mono, self.exit_of(s.proc))
                self.seen[name] = Seen(p, mono, now, mono, phase_at=now, phase_mono=mono,
                                       phase={"agent": "agent", "helper": "helper"}.get(p.role, PHASE))
            else:
                s.proc = p
        for name, s in list(self.seen.items()):
            if s.gone_at is None and name not in live and not same_start(process_start_time(s.proc.pid), s.proc.start):
                s.gone_at = now
                ended = self.exit_of(s.proc)
                if s.proc.role == "worker" and rank_lives(s.proc, live.values()):
                    self.churn.gone(s, self.seen, now, self.tick_mono, ended)
                    continue
                self.run.append_event("process.gone", actor=ACTOR, name=name, pid=s.proc.pid,
                                      detail=self.churn.gone_detail(s.proc, ended),
                                      **({"exit_code": ended.code} if ended is not None else {}))
                if is_pid_named(s.proc):
                    self.forget(s)

    def forget(self, s: Seen) -> None:
        """An ended process whose name carries its pid (a rank's helper: a compiler, a ``git``,
        a tracker) is never seen again under that name: over a days-long attach such ends would
        pile up in memory, and their records in ``status/`` (each "dead", read by every reader,
        and by the judge every 2 s). Its end stays in events.jsonl and, among the latest
        :data:`ENDED_KEPT`, in the end's list; its record, ours, goes."""
        del self.seen[s.proc.name]
        self.ended.append({"name": s.proc.name, "pid": s.proc.pid, "gone_at": s.gone_at, "start": s.proc.start})
        if not s.inproc:  # a record the process wrote itself (--inject) is its own, and stays
            with contextlib.suppress(OSError), self.run.folder("status") as status:
                os.unlink(f"{s.proc.name}.json", dir_fd=status)

    def orphaned(self, ranks: list[Seen]) -> None:
        """Ranks seen in the job that live on outside its roots' trees (their agent died while
        watched, and they were re-parented): each becomes a root of the job, in run.json as the
        ones found at the attach (``job.roots``), so that the observer follows them and
        ``ups kill`` proves them (each the leader of its own session, as torchrun starts them)."""
        self.roots += [(s.proc.pid, s.proc.start) for s in ranks]
        with contextlib.suppress(OSError, ValueError, UpsError):  # the folder gone, or no longer ours: watching goes on
            job = dict(self.run.read_own_manifest().get("job") or {})
            entries = [r for r in job.get("roots") or [] if isinstance(r, dict)] or [
                {"pid": job.get("pid"), "pid_start": job.get("pid_start"), "sid": job.get("sid")}]
            entries += [{"pid": s.proc.pid, "pid_start": s.proc.start, "sid": session_led(s.proc.pid)} for s in ranks]
            self.run.update_manifest(job={**job, "roots": entries})
        self.run.append_event("attach.orphaned", actor=ACTOR, ranks=[s.proc.name for s in ranks],
                              pids=[s.proc.pid for s in ranks],
                              detail="the job's agent is gone; its ranks live on, re-parented, and are still watched")

    def alive(self) -> list[Seen]:
        return [s for s in self.seen.values() if s.gone_at is None]

    def exit_of(self, p: Proc) -> Any:
        """The kernel's word on how ``p`` ended (ups.status.taskstats), where this observer may listen."""
        return self.exits.exit_of(p.pid, p.start, wait_s=0.2) if self.exits is not None else None

    # -- stacks --------------------------------------------------------------------------
    def dumps(self) -> None:
        if self.no_dumps is not None:
            return
        mono = time.monotonic()
        for name, s in self.seen.items():
            early = s.extra.get("reads", 0) < EARLY_READS and len(s.extra.get("positions", ())) < 2
            every = SECOND_LOOK_S if s.proc.role == "rank" and early else STACK_EVERY_S
            if s.gone_at is not None or s.proc.role not in WATCHED_ROLES or mono - s.dumped_mono < every:
                continue
            s.dumped_mono = mono
            try:
                try:
                    d = pyspy.dump(s.proc.pid, s.proc.label, actor=ACTOR, with_locals=s.proc.role in ("worker", "rank"))
                except pyspy.DumpRefused as exc:
                    if exc.lasting or not (s.proc.role == "rank" and early):
                        raise
                    # A read of a running process that lost a race with it (py-spy reads its memory
                    # as it runs); in a rank's first seconds, read it again at once.
                    d = pyspy.dump(s.proc.pid, s.proc.label, actor=ACTOR, with_locals=True)
            except pyspy.DumpRefused as exc:
                if exc.lasting:
                    self.no_dumps = str(exc)
                    print(f"ups attach: {exc}", flush=True)
                    self.run.append_event("attach.no_stacks", actor=ACTOR, reason=str(exc))
                    return
                continue
            if d.position is not None and s.proc.role == "rank":
                note_position(s, d)  # a Lightning rank's epoch and batch, read from its frames
            s.extra["reads"] = s.extra.get("reads", 0) + 1
            before = s.dump.frames if s.dump is not None else None
            # the same frames with other loop counters: it went round between the reads
            went_round = before == d.frames and bool(d.counters) and s.dump.counters not in ((), d.counters)
            s.dump = d
            if before is not None and (d.frames != before or went_round):
                self.moved(s)
                note_turn(s, before, d.frames, self.tick_at, went_round)  # the stacks' rhythm
                w = self.proof.watched.get(name)
                if w is not None:
                    w.stacks.clear()  # it moved: "the same stack twice" starts again from this one
            self.proof.note_stack(name, d.frames)
            phase = phase_of(s.proc.role, d)
            if phase != s.phase:
                s.phase, s.phase_at, s.phase_mono = phase, self.tick_at, self.tick_mono
            coll = d.collective()
            if coll is None:
                s.coll = None
            elif s.coll is None or s.coll["op"] != coll[0]:
                s.coll = {"op": coll[0], "seq": 0, "site": coll[1], "since": d.at, "context": SEEN_FROM_OUTSIDE}
            if d.frames != s.written_frames or mono - s.written_mono >= STACK_KEEP_S:
                self.append_stack(name, d.text)
                s.written_frames, s.written_mono = d.frames, mono

    def append_stack(self, name: str, text: str) -> None:
        from ups.status.confined import open_append

        file = f"{name}.txt"
        try:
            # stacks/ and the file opened relative to the run folder, never through a link
            with self.run.folder("stacks", make=True) as stacks:
                with contextlib.suppress(FileNotFoundError):
                    if os.stat(file, dir_fd=stacks, follow_symlinks=False).st_size > STACK_FILE_MAX:
                        os.rename(file, f"{file}.1", src_dir_fd=stacks, dst_dir_fd=stacks)
                fd = open_append(file, dir_fd=stacks)
        except OSError:
            return
        try:
            os.write(fd, ("\n" + text).encode())
        except OSError:
            pass
        finally:
            os.close(fd)

    # -- the log -------------------------------------------------------------------------
    def copy_log(self) -> None:
        """New output of the job copied into ``logs/job.log`` (read through the job's own open
        file, bounded: :mod:`ups.attach.joblog`), its new lines fed to the progress reader."""
        data, backlog = self.log.read()
        if not data:
            return
        self.log.append(data)
        text = (self.pending + data).decode(errors="replace")
        *lines, rest = text.replace("\r", "\n").split("\n")
        self.pending = rest.encode()[-4096:]
        for line in lines:
            self.progress.feed(line, None if backlog else self.tick_at, self.tick_at)  # the backlog: no times, no rate
            self.churn.ends.feed(line)
            if not backlog:
                self.lines.feed(line)

    # -- records -------------------------------------------------------------------------
    def moved(self, s: Seen) -> None:
        s.progress_at, s.progress_mono = self.tick_at, self.tick_mono  # one time a tick: processes compare

    def judge(self) -> dict[str, Any]:
        targets = {name: (s.proc.pid, None, None) for name, s in self.seen.items()
                   if s.gone_at is None and s.proc.role in WATCHED_ROLES}
        watched = self.proof.tick(targets)
        for name, w in watched.items():
            s = self.seen[name]
            if len(w.windows) != s.windows or (w.windows and s.windows == 8):
                s.windows = len(w.windows)
                if w.windows and w.windows[-1].verdict != "idle":
                    self.moved(s)
        return {name: w.to_dict() for name, w in watched.items()}

    def record(self, s: Seen, now: float, mono: float) -> StatusRecord:
        p = s.proc
        started = p.start or now
        return StatusRecord(
            run_id=self.run_id, role=p.role, name=p.name, pid=p.pid, pid_start=p.start or 0.0, host=self.host,
            schema=SCHEMA_VERSION, rank=p.rank, local_rank=p.local_rank, world_size=p.world_size, worker=p.worker,
            phase=s.phase, state="running", **progress_fields(s.extra.get("counter")), started_at=started,
            progress_at=s.progress_at,
            heartbeat_at=now, phase_at=s.phase_at, heartbeat_interval=TICK_S,
            item=s.dump.item if s.dump is not None and s.phase == "fetch" else (s.extra.get("counter") or {}).get("text"),
            stack_file=f"stacks/{p.name}.txt" if s.dump is not None else None,
            collective=dict(s.coll) if s.coll else None, command=" ".join(p.argv)[:400] if p.role == "agent" else None,
            metrics={"attached": True, **progress_metrics(s.extra.get("counter"))}, boot_id=self.boot,
            started_mono=max(0.0, mono - (now - started)), progress_mono=s.progress_mono, heartbeat_mono=mono,
            phase_mono=s.phase_mono)

    def reports_itself(self, s: Seen) -> bool:
        """--inject: the process writes its own record now (its in-process Reporter, started by
        ``sys.remote_exec``: a record of its pid without our ``attached`` mark), so ours stops:
        one writer per record."""
        if s.inproc or not self.inject or s.proc.role not in WATCHED_ROLES:
            return s.inproc  # (a DataLoader worker forked after the injection reports too)
        from ups.status.safeio import try_tail

        try:
            rec = json.loads(try_tail(self.run.status_dir / f"{s.proc.name}.json", 1 << 20) or "null")
        except ValueError:
            return False
        if isinstance(rec, dict) and rec.get("pid") == s.proc.pid and "attached" not in (rec.get("metrics") or {}):
            s.inproc = True
            self.run.append_event("attach.injected", actor=ACTOR, name=s.proc.name, pid=s.proc.pid,
                                  detail="its in-process reporter writes its record from now on")
        return s.inproc

    def write_records(self) -> None:
        now, mono = time.time(), time.monotonic()
        for s in self.seen.values():
            if s.gone_at is not None or self.reports_itself(s):
                continue
            rec = self.record(s, now, mono)
            with contextlib.suppress(OSError):
                self.run.write_file(f"status/{rec.name}.json", rec.to_json().encode())  # never through a link

    # -- the end -------------------------------------------------------------------------
    def finish(self) -> None:
        self.copy_log()
        write_end(self.run, self.seen, self.record, ended=list(self.ended),
                  exit_of=self.exits.exit_of if self.exits is not None else None, top=(self.top, self.top_start))

    def on_signal(self, signum: int, _frame: Any) -> None:
        self.stop = signal.Signals(signum).name

    def loop(self, reporter: Reporter) -> None:
        while self.stop is None and self.step(reporter):
            time.sleep(max(0.05, TICK_S - (time.monotonic() - self.tick_mono)))

    def step(self, reporter: Reporter) -> bool:
        """One pass of the loop; False once the job (or the run folder) is gone."""
        t0 = time.monotonic()
        self.tick_at, self.tick_mono = time.time(), t0
        if not self.run.manifest_path.is_file():
            # The run folder was deleted: nothing to write to; the job is the user's and goes on.
            print(f"ups attach: run folder {self.run.path} is gone; watching ends, the job goes on", flush=True)
            self.stop = "run folder gone"
            return False
        self.refresh()
        if not self.alive():
            return False
        observed = self.judge()
        self.dumps()
        self.copy_log()
        take_progress(self.seen.values(), self.progress, self.tick_at, self.tick_mono)
        self.churn.settle(self.seen, self.tick_at, self.tick_mono)
        self.write_records()
        if self.notifier is not None and t0 - self.told_mono >= TELL_EVERY_S:
            self.told_mono = t0
            tell(self.run, self.proof, self.notifier)
        counter = self.lines.current()
        changes: dict[str, Any] = {}
        if observed != self.published:
            changes["observed"] = self.published = observed
        if counter is not None:
            changes["output_progress"] = counter
        if changes:
            reporter.metrics(**changes)
        return True


def exit_listener() -> Any:
    """Exit statuses from the kernel (ups.status.taskstats), where this process may listen (root)
    and ``UPS_NO_TASKSTATS`` does not say otherwise; None elsewhere."""
    from ups.status import taskstats

    return None if os.environ.get("UPS_NO_TASKSTATS") else taskstats.start()


def tell(run: RunDir, proof: Observer, notifier: Any) -> None:
    """The run's verdict, for the notifier: a hang only once this observer proved it (idle
    windows and the same stack twice, from ``proof``: :func:`ups.launch.onhang.proof_of`), as
    the launcher tells it; the notifier queues it and never holds up the observer's loop."""
    from ups.launch.onhang import HANG_MODES, past_action_limit, proof_of
    from ups.runs.view import load_run_view, node_view
    from ups.why import diagnose_view

    try:
        view = node_view(load_run_view(run))
        verdict = diagnose_view(view)
    except Exception as exc:  # noqa: BLE001 - judging must never stop the watching
        print(f"ups attach: could not judge the run: {exc!r}", flush=True)
        return
    hang, shown = verdict.mode in HANG_MODES, None
    who = (verdict.who or {}).get("name")
    w = proof.watched.get(who) if hang and who else None
    if w is not None and w.proven() and past_action_limit(view, who):
        shown = proof_of(w)
    notifier.on_verdict(verdict, hang=hang, proof=shown)


def is_pid_named(p: Proc) -> bool:
    """Its record's name carries its pid (``rank-0-helper-123``, ``rank-1-pid456``)."""
    return p.role == "helper" or p.name.endswith(f"-pid{p.pid}")


def phase_of(role: str, d: pyspy.Dump) -> str:
    """What a stack says a process is doing, in the phases the health rules know: a DataLoader
    worker waits for its next index (``idle``: never stalled) or fetches one (``fetch``); a rank
    waits for a batch in its DataLoader (``data``) or is anywhere else (``attached``)."""
    frames = d.section.stack if d.section else ()
    if role == "worker":
        first = next((f for f in frames if not is_stdlib_file(f.file)), None)
        return "idle" if first is not None and first.function == "_worker_loop" else "fetch"
    if role == "rank" and any("torch/utils/data/dataloader.py" in f.file.replace("\\", "/")
                              and f.function in ("__next__", "_next_data", "_get_data", "_try_get_data")
                              for f in frames):
        return "data"
    return {"agent": "agent", "helper": "helper"}.get(role, PHASE)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m ups.attach.observe RUN_DIR", file=sys.stderr)
        return 2
    run = RunDir(args[0])
    obs = AttachObserver(run)
    run.update_manifest(state="running", launcher={"pid": os.getpid(), "pid_start": this_process_start(),
                                                   "pgid": os.getpgid(0), "adopted": False})
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, obs.on_signal)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    name = process_name("launcher", host=obs.host) if obs.multinode else None  # launcher@<host>, as ups launch's
    obs.notifier = notifier_for(run)
    ended = False
    with Reporter(run.path, role="launcher", phase="supervise", run_id=obs.run_id, stack_signal=None,
                  name=name) as reporter:
        reporter.item(f"observing pid {obs.top} from outside (no signal, nothing in the job)")
        try:
            obs.loop(reporter)
        finally:
            if obs.stop == "run folder gone":
                pass
            elif obs.stop is not None and obs.alive():
                # Asked to stop (``ups kill`` ends the observer first, then the job): watching
                # ends; the job's end is for whoever stops it, or for a reader to settle.
                run.append_event("attach.stopped", actor=ACTOR, signal=obs.stop,
                                 detail="the observer was asked to stop while the job ran")
            elif run.read_manifest().get("state") not in FINAL_RUN_STATES:
                obs.finish()
                ended = True
    if ended:
        from ups.launch.ending import notify_end

        notify_end(run, obs.notifier)  # after the end is written: a slow notifier delays only our exit
    return 0


def notifier_for(run: RunDir) -> Any:
    """The run's notifier (None: nobody to tell). Its targets (a ``cmd:`` is a shell command) are
    read through the proof that the run folder is this user's, as a launcher reads them."""
    from ups.errors import Refused
    from ups.notify import Notifier
    from ups.runs.ownership import OwnRun

    try:
        with OwnRun(run.path, nothing="nobody is notified") as own:
            fields = own.launch_fields()
    except Refused as exc:
        print(f"ups attach: {exc}", flush=True)
        return None
    return Notifier.for_run(run, fields, actor=ACTOR)


if __name__ == "__main__":
    sys.exit(main())
