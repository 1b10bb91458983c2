"""What the supervisor does about a hang: ``--on-hang {observe,dump,kill,restart}`` and
``--on-worker-hang fallback``, taken only on a **proven** hang.

The supervisor asks :meth:`HangWatch.check` about once a second (through
:class:`ups.launch.restarts.Restarts`, which carries out what it decides). When a process of the run
is in trouble (stalled, unresponsive, or with no progress signal past its first-progress
limit), the verdict of ``ups why`` names who the others wait for, and the launcher watches
that process from outside (:mod:`ups.launch.proof`: CPU demand, I/O and socket bytes of its
tree, two stack dumps some seconds apart). What it sees is published in the launcher's own
record (``metrics.observed``), so every reader's verdict says "busy evaluating" or "idle,
the same stack twice" from the same facts.

A display word never acts: a hang verdict (:data:`HANG_MODES`) opens an episode only once
the process it names is **proven** hung (two idle windows and the same stack). A busy process
(evaluating, writing a checkpoint, uploading through a child) is never acted on, however long.
Each episode is acted on once:

* ``observe``: a ``hang`` event with the verdict and the proof, nothing else (also what
  ``--observe-only`` turns every action into: the event says what would have been done);
* ``dump`` (the default): the stacks of every process in trouble are saved, the event logged;
* ``kill``: stacks first, then the job is ended; the run ends killed, saying why;
* ``restart``: stacks first, then the job is ended and the same command started again as the
  same run, attempt N+1 (``UPS_ATTEMPT``), where the restart policy says it can help
  (:mod:`ups.launch.policy`: not the same hang twice, a GPU with a hardware fault left out,
  spaced by a back-off, at most ``--max-restarts`` within ``--restart-window``); otherwise it
  is ended as for ``kill``, saying why.

``--on-worker-hang fallback`` acts on its own, whatever ``--on-hang`` says: a proven hang of a
DataLoader worker restarts the job once with every DataLoader at ``num_workers=0``
(``UPS_FORCE_NUM_WORKERS``, the mechanism of ``ups relaunch --num-workers 0``).

Each attempt's verdict is kept in run.json (``attempts``), its records under
``attempts/<N>/status`` and a copy of its stack files under ``attempts/<N>/stacks``; the
metrics series go on in ``metrics/`` (each point carries its attempt).
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from typing import Any

from ups.errors import RefusedSignal
from ups.launch.policy import Action, HangFacts, HardwareSign, Options, PastAttempt, decide
from ups.launch.proof import PROOF_IDLE_S, SHORT_WINDOW_S, Observer, Watched
from ups.runs.rundir import RunDir
from ups.runs.view import RunView, load_run_view, node_view
from ups.status.health import PAUSE_SAID_AFTER_S, Health, stall_limit_of
from ups.status.host import hostname

ON_HANG = ("observe", "dump", "kill", "restart")
ON_WORKER_HANG = ("same", "fallback")
HANG_MODES = frozenset(("stalled", "unresponsive", "rank_stuck_peers_wait", "one_sided_collective",
                        "worker_stuck_in_read", "worker_stuck", "dataloader_resources", "hung"))
CHECK_EVERY_S = 1.0
STRAGGLER_RECHECK_S = 60.0
TROUBLE = (Health.STALLED, Health.UNRESPONSIVE, Health.NO_SIGNAL)
MAX_WATCHED = 4


def parse_window(text: str) -> float:
    """``--restart-window``: seconds, or a number with s, m (min), h or d: '30m', '2h', '600'."""
    from ups.errors import UpsError

    units = {"s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}
    t = text.strip().lower()
    num = t.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = t[len(num):].strip() or "s"
    try:
        value = float(num) * units[unit]
    except (ValueError, KeyError):
        raise UpsError(f"--restart-window {text}: a duration such as 600, 30m, 2h or 1d") from None
    if not value > 0 or value == float("inf"):
        raise UpsError(f"--restart-window {text}: must be more than 0")
    return value


def check_options(on_hang: str | None, max_restarts: int | None, on_worker_hang: str | None,
                  restart_window: str | None = None) -> dict[str, Any]:
    """The manifest fields of the launch options (validated: bad input is one line, exit 2)."""
    from ups.errors import UpsError

    if on_hang is not None and on_hang not in ON_HANG:
        raise UpsError(f"--on-hang {on_hang}: one of {', '.join(ON_HANG)}")
    if on_worker_hang is not None and on_worker_hang not in ON_WORKER_HANG:
        raise UpsError(f"--on-worker-hang {on_worker_hang}: one of {', '.join(ON_WORKER_HANG)}")
    if max_restarts is not None and max_restarts < 0:
        raise UpsError("--max-restarts must be >= 0")
    if max_restarts and (on_hang or "dump") != "restart":
        raise UpsError("--max-restarts needs --on-hang restart")
    if restart_window is not None and (on_hang or "dump") != "restart":
        raise UpsError("--restart-window needs --on-hang restart")
    out: dict[str, Any] = {}
    if on_hang is not None:
        out["on_hang"] = on_hang
    if on_hang == "restart":
        out["max_restarts"] = 3 if max_restarts is None else max_restarts
        if restart_window is not None:
            out["restart_window"] = parse_window(restart_window)
    if on_worker_hang is not None:
        out["on_worker_hang"] = on_worker_hang
    return out


def is_worker_hang(verdict: Any) -> bool:  # a Verdict
    return verdict.mode == "worker_stuck_in_read" or (verdict.who or {}).get("role") == "worker"


@dataclass
class Decision:
    verdict: Any  # the Verdict
    action: str  # observe | dump | kill | restart | give_up
    fallback: bool = False  # restart with num_workers=0
    proof: dict[str, Any] | None = None  # what proved the hang (ups.launch.proof), for the event and the message
    policy: Action | None = None  # the restart policy's decision and its reason (ups.launch.policy)
    facts: HangFacts | None = None  # the hang as the policy compared it (kept in run.json's attempts)


class HangWatch:
    """Judges the live run once a second, watches who it points at, and decides, once per
    proven hang."""

    def __init__(self, run: RunDir, manifest: dict[str, Any]) -> None:
        self.run = run
        self.action = manifest.get("on_hang") or "dump"
        self.worker_fallback = manifest.get("on_worker_hang") == "fallback"
        # Acting is asked for (--on-hang, or --on-worker-hang fallback alone); watching and
        # publishing what is seen happen for every run in trouble (readers show "busy").
        self.active = manifest.get("on_hang") is not None or self.worker_fallback
        self.observe_only = manifest.get("automatic") == "observe"
        self.max_restarts = int(manifest.get("max_restarts") or 0)
        self.restarts = int(manifest.get("restarts") or 0)
        self.fell_back = bool((manifest.get("env") or {}).get("UPS_FORCE_NUM_WORKERS"))
        self.options = Options.from_manifest(manifest)
        self.attempt = int(manifest.get("attempt") or 1)
        self.started_at = time.time()  # this attempt's start
        self.first_step_at: float | None = None  # this attempt's first step (the cost of a restart)
        # The devices the job sees: its own CUDA_VISIBLE_DEVICES (run.json's env, else ours, which it inherits).
        self.gpu_env = (manifest.get("env") or {}).get("CUDA_VISIBLE_DEVICES") or os.environ.get("CUDA_VISIBLE_DEVICES")
        self.episode: tuple | None = None
        self.observer = Observer()
        self.observed: dict[str, dict[str, Any]] = {}  # what the launcher's record publishes
        self._next = time.monotonic() + CHECK_EVERY_S
        self._stragglers: tuple[tuple[str, ...], float] = ((), 0.0)  # who was told as a straggler, and when

    def check(self) -> tuple[Any, Decision | None]:
        """(the live run's verdict now, or None between checks and while nobody is in trouble;
        what to do about it, once per proven hang)."""
        now = time.monotonic()
        if now < self._next:
            return None, None
        self._next = now + CHECK_EVERY_S
        view = node_view(load_run_view(self.run))
        if view.is_final:
            return None, None
        if self.first_step_at is None:
            self.first_step_at = first_step(view, self.started_at)
        troubled = [p for p in view.processes if p.record.role != "launcher" and p.verdict.health in TROUBLE]
        if troubled:
            troubled += quiet_peers(view, troubled) + starting_workers(view, troubled)
        if not troubled and not self.observer.watched:
            self.episode, self.observed = None, {}
            names = tuple(sorted(p.record.name for p in view.processes if p.verdict.health is Health.STRAGGLER))
            told, at = self._stragglers
            if names and (names != told or now - at > STRAGGLER_RECHECK_S):
                # Told (--notify, once an episode), never acted on; judged again when who is named
                # changes, else once a minute: a straggler lasting days costs no verdict a second.
                self._stragglers = (names, now)
                from ups.why import diagnose_view

                return diagnose_view(view), None
            if not names:
                self._stragglers = ((), 0.0)
            return None, None
        from ups.why import diagnose_view

        verdict = diagnose_view(view)
        watched = self._watch(view, verdict, troubled)
        if verdict.mode not in HANG_MODES:
            self.episode = None
            return verdict, None
        who = (verdict.who or {}).get("name")
        w = watched.get(who) if who else None
        # --observe-only sends no signal, so no stack is dumped: what would be done is decided
        # on the windows alone (and the event says that the stacks were not compared).
        if w is None or not w.proven(stacks=not self.observe_only) or not past_action_limit(view, who):
            return verdict, None  # shown, never acted on: not proven yet, or busy, or only the rhythm's early word
        key = (verdict.mode, who, (verdict.who or {}).get("pid"))
        if key == self.episode:
            return verdict, None
        self.episode = key
        facts = hang_facts(verdict, view)
        gpus, needed, signs = self._gpu_facts(view)
        policy = decide(facts, self.attempt, history(self.run.read_own_manifest()), self.options, now=time.time(),
                        signs=signs, gpus=gpus, gpus_needed=needed, worker_hang=is_worker_hang(verdict))
        return verdict, Decision(verdict, policy.would or policy.action, fallback=policy.fallback, proof=proof_of(w),
                                 policy=policy, facts=facts)

    def _gpu_facts(self, view: RunView) -> tuple[list[int] | None, int | None, list[HardwareSign]]:
        """The GPUs the job sees, how many its ranks on this node need, and the hardware signs."""
        try:
            from ups.gpu import get_provider

            snap = get_provider().snapshot()
        except Exception:  # noqa: BLE001 - no GPU facts: the policy decides without them
            return None, None, []
        ranks = [p for p in view.processes if p.record.role == "rank" and p.record.host == hostname()]
        return visible_gpus(snap, self.gpu_env), (len(ranks) or None), hardware_signs(snap)

    def _watch(self, view: RunView, verdict: Any, troubled: list) -> dict[str, Watched]:
        """Watch whom the verdict names and whoever is in trouble (on this host); dump their
        stacks when the proof needs it; publish what is seen."""
        here = hostname()
        by_name = {p.record.name: p for p in view.processes if p.record.host == here}
        names = [n for n in [(verdict.who or {}).get("name")] if n in by_name]
        names += [p.record.name for p in troubled if p.record.name in by_name and p.record.name not in names]
        targets = {n: (by_name[n].record.pid, by_name[n].record.heartbeat_tid,
                       str(self.run.path / by_name[n].record.stack_file) if by_name[n].record.stack_file else None)
                   for n in names[:MAX_WATCHED]}
        workers = {p.record.pid for p in view.processes if p.record.role == "worker"}
        # A process that stepped regularly is judged second by second: its silence is news sooner.
        windows = {n: SHORT_WINDOW_S for n in targets if view.thresholds.stalled_after is None
                   and by_name[n].record.interval_p99 is not None and by_name[n].record.step > 0}
        watched = self.observer.tick(targets, exclude_pids=workers, windows=windows)
        for name in watched:
            if self.observer.wants_stack(name) and not self.observe_only:
                self._dump(by_name[name].record, name)
        self.observed = {name: w.to_dict(peers_wait=peers_wait(view, by_name[name])) for name, w in watched.items()}
        return watched

    def _dump(self, record: Any, name: str) -> None:
        from ups.runs.signals import dump_stacks
        from ups.why.stacks import latest

        try:
            text = dump_stacks(self.run, record, actor="launcher", timeout=3.0)
        except RefusedSignal:
            return  # no handler (reset by the program) and no py-spy: no proof from stacks
        section = latest(text)
        main = section.main if section is not None else None
        frames = tuple((f.file, f.line, f.function) for f in main.frames) if main is not None else ()
        self.observer.note_stack(name, frames)

    def new_attempt(self, *, fallback: bool = False, env: dict[str, str] | None = None) -> None:
        import dataclasses

        self.restarts += 1
        self.attempt += 1
        self.fell_back = self.fell_back or fallback
        self.options = dataclasses.replace(self.options, fell_back=self.fell_back)
        self.gpu_env = (env or {}).get("CUDA_VISIBLE_DEVICES", self.gpu_env)
        self.started_at, self.first_step_at = time.time(), None
        self.episode = None
        self.observer = Observer()
        self.observed = {}
        self._next = time.monotonic() + CHECK_EVERY_S


def starting_workers(view: RunView, troubled: list) -> list:  # ProcessViews
    """The DataLoader workers of a troubled rank that waits for data while they start (their
    ``worker_init_fn`` runs, no sample fetched): watched, so that readers can say whether they
    work (an epoch's re-warm) or sit idle."""
    ranks = {p.record.rank for p in troubled if p.record.role == "rank" and p.record.phase == "data"}
    return [p for p in view.processes if p.record.role == "worker" and p.record.rank in ranks and p not in troubled
            and p.record.state == "running" and p.record.phase == "idle" and p.record.step == 0]


def peers_wait(view: RunView, p: Any) -> bool:  # a ProcessView
    """The run's own evidence that ``p`` is the one waited for: another rank waits in a
    collective, or has gone silent too (DDP's all-reduce in backward shows no collective); for a
    DataLoader worker, its rank is silent."""
    r = p.record
    if r.role == "worker":
        return any(q.record.role == "rank" and q.record.rank == r.rank and q.verdict.health in TROUBLE
                   for q in view.processes)
    # A rank waiting for data may wait for a worker that is starting and not recorded yet (an
    # epoch's re-warm): no early word there; a whole window of idleness first.
    return r.role == "rank" and r.phase != "data" and any(
        q.record.role == "rank" and q.record.name != r.name and q.record.state == "running"
        and (q.record.collective is not None or q.verdict.health in TROUBLE) for q in view.processes)


def past_action_limit(view: RunView, name: str | None) -> bool:
    """An automatic action waits for today's full proof: a stalled process is acted on only
    once it has been silent for its learned limit (not the shorter one its rhythm gives the
    display) plus the proof's idle time."""
    p = view.process(name) if name else None
    if p is None or p.verdict.health is not Health.STALLED:
        return True
    limit, _ = stall_limit_of(p.record, view.thresholds, rhythm=False)
    quiet = view.read_at - max(p.record.progress_at, p.record.phase_at)
    return limit is None or quiet >= limit + PROOF_IDLE_S


def hang_facts(verdict: Any, view: RunView) -> HangFacts:  # a Verdict
    """The hang as the restart policy compares it: who (role), where (file:line), at which step
    and phase, since when, on which GPU."""
    who = verdict.who or {}
    where = verdict.where or {}
    p = view.process(who["name"]) if who.get("name") else None
    r = p.record if p is not None else None
    gpu = None
    if r is not None:
        gpu = r.gpu.device if r.gpu is not None and r.gpu.device is not None else r.local_rank
    return HangFacts(verdict.mode, verdict.headline, role=who.get("role"), name=who.get("name"),
                     site=where.get("site") if isinstance(where.get("site"), str) else None,
                     step=r.step if r is not None else None,
                     phase=(r.phase if r is not None else where.get("phase")), since=verdict.since, gpu=gpu)


def history(manifest: dict[str, Any]) -> list[PastAttempt]:
    """The attempts before this one, from run.json (each one's hang and when the next started)."""
    out = []
    for a in manifest.get("attempts") or []:
        if isinstance(a, dict) and isinstance(a.get("attempt"), int):
            at = a.get("restarted_at")
            out.append(PastAttempt(a["attempt"], HangFacts.from_dict(a.get("hang")),
                                   at if isinstance(at, (int, float)) and not isinstance(at, bool) else None))
    return out


def hardware_signs(snap: Any) -> list[HardwareSign]:  # a GpuSnapshot
    """This node's GPUs that reported a hardware fault: an Xid of the hardware's, uncorrected
    ECC errors, a row remap pending a reset (NVML, or the fake provider's facts)."""
    from ups.why.rules.hardware import XID_MEANING

    out = []
    for d in getattr(snap, "devices", ()) or ():
        facts = []
        for x in d.xid_errors:
            meaning, hardware = XID_MEANING.get(x, (None, True))  # an Xid not in the table: the hardware's
            if hardware:
                facts.append(f"Xid {x}: {meaning}" if meaning else f"Xid {x}")
        if d.ecc_uncorrected:
            facts.append(f"{d.ecc_uncorrected} uncorrected ECC error(s)")
        if d.remapped_rows_pending:
            facts.append("a memory row remap is pending (needs a GPU reset)")
        if facts:
            out.append(HardwareSign(d.index, "; ".join(facts)))
    return out


def visible_gpus(snap: Any, cuda_visible: str | None) -> list[int] | None:  # a GpuSnapshot
    """The device indices the job sees: its CUDA_VISIBLE_DEVICES when it is a list of indices,
    else every device of the node; None when not known (UUIDs, no NVML)."""
    if cuda_visible is not None:
        parts = [x.strip() for x in cuda_visible.split(",") if x.strip()]
        return [int(x) for x in parts] if all(x.isdigit() for x in parts) else None
    return [d.index for d in snap.devices] if getattr(snap, "available", False) else None


def first_step(view: RunView, since: float) -> float | None:
    """When a rank of this attempt first made a step (its progress time, the step above 0)."""
    times = [p.record.progress_at for p in view.processes
             if p.record.role == "rank" and p.record.step > 0 and p.record.started_at >= since - 1.0]
    return min(times) if times else None


def quiet_peers(view: RunView, troubled: list) -> list:  # ProcessViews
    """Running ranks, not in trouble themselves (within a long phase's limit, or before their
    step time is learned), outside any collective and with no progress for a few seconds, while
    a rank is in trouble: the ones it may wait for, watched so that readers can say what they
    do (busy uploading, computing) rather than "settling"."""
    now = time.time()
    return [p for p in view.processes if p.record.role == "rank" and p not in troubled and p.record.state == "running"
            and not p.record.collective and now - max(p.record.progress_at, p.record.phase_at) >= PAUSE_SAID_AFTER_S]


def proof_of(w: Watched) -> dict[str, Any]:
    """What proved a hang, for the event and the message: the process, each window's CPU, I/O
    and network, the kernel wait, and the two stacks compared."""
    stacks = [[f"{file}:{line} in {func}" for file, line, func in frames[:6]] for _, frames in w.stacks]
    idle = w.idle_windows()
    windows = [win.to_dict() for win in w.windows[-max(2, idle):]]
    shown = [x["text"] for x in windows] if len(windows) <= 2 else [windows[0]["text"], "…", windows[-1]["text"]]
    text = (f"{w.name} (pid {w.pid}) idle for {len(windows)} windows" + (f" ({w.idle_seconds():.0f} s)" if idle > 2 else "")
            + ": " + "; ".join(shown)
            + (f"; the same stack in two dumps {w.stacks[-1][0] - w.stacks[0][0]:.0f} s apart" if len(w.stacks) >= 2
               else "; uninterruptible sleep in the same kernel wait throughout" if w.same_stack()
               else "; stacks not compared (observe-only sends no signal)"))
    return {"process": w.name, "pid": w.pid, "windows": windows, "stacks": stacks, "text": text}


def attempt_entry(attempt: int, ended: str, verdict: Any, folder: str | None = None, *,  # a Verdict
                  facts: HangFacts | None = None, started_at: float | None = None, first_step_s: float | None = None,
                  restarted_at: float | None = None, reason: str | None = None) -> dict[str, Any]:
    """An attempt's entry in run.json's ``attempts``: how it ended, its verdict, the hang as the
    restart policy compares it, the step it reached, and what it cost: seconds from its start to
    its first step, and from its hang to the next attempt's start."""
    v = verdict.to_dict() if hasattr(verdict, "to_dict") else verdict
    entry: dict[str, Any] = {"attempt": attempt, "ended_at": time.time(), "ended": ended, "verdict": v, "records": folder}
    if reason:
        entry["reason"] = reason  # the restart policy's
    if started_at is not None:
        entry["started_at"] = started_at
    if first_step_s is not None:
        entry["first_step_s"] = first_step_s
    if facts is not None:
        entry["hang"] = facts.to_dict()
        entry["step"] = facts.step
    if restarted_at is not None:
        entry["restarted_at"] = restarted_at
        if facts is not None and facts.since:
            entry["hang_to_restart_s"] = round(max(0.0, restarted_at - facts.since), 2)
    return entry


def archive_attempt(run: RunDir, attempt: int) -> str:
    """Move the ended attempt's records under ``attempts/<N>/status`` (the next attempt's
    processes write the same names) and copy its stack files beside them. Returns the folder."""
    from ups.status.confined import make_dirs

    folder = run.path / "attempts" / str(attempt)
    os.close(make_dirs(run.path, f"attempts/{attempt}/status"))  # no link followed on the way
    for rec in run.status_dir.glob("*.json"):
        if rec.name.startswith("launcher"):
            continue  # the supervisor's own record goes on
        try:
            rec.replace(folder / "status" / rec.name)
        except OSError:
            continue
    if run.stacks_dir.is_dir():
        try:
            shutil.copytree(run.stacks_dir, folder / "stacks", dirs_exist_ok=True)
        except OSError:
            pass
    return str(folder.relative_to(run.path))
