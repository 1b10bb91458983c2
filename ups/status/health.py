"""Health of a process, as a pure function of (record, now, process table, thresholds).

Two clocks (docs/design.md): a fresh heartbeat with stale progress means the main loop is stuck
while the interpreter still runs (``stalled``); a stale heartbeat with a live pid means the
process cannot run Python at all (``unresponsive``: a C call holding the GIL, SIGSTOP, D
state). A pid that is gone, or alive with another start time, is ``dead``.
"""

from __future__ import annotations

import enum
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from ups.status.host import hostname
from ups.status.procs import ProcessTable, same_start
from ups.status.record import StatusRecord

OBSERVER_LOOK_S = 3.0
"""An attached job's observer looks once a second: a worker (or helper) it recorded running that is gone
within this long of its record is not yet known dead (it notes the end at its next look)."""


class Health(str, enum.Enum):
    STARTING = "starting"
    OK = "ok"
    SLOW = "slow"
    STRAGGLER = "straggler"  # the rank the others wait for (ups.status.straggler): shown, never acted on
    STALLED = "stalled"
    UNRESPONSIVE = "unresponsive"
    DEAD = "dead"
    UNREACHABLE = "unreachable"  # every record of another node went silent at once: the node, not N ranks
    NO_SIGNAL = "no-signal"  # past the first-progress limit with no progress signal at all: neither ok nor stalled
    DONE = "done"
    FAILED = "failed"

    def __str__(self) -> str:
        return self.value

    @property
    def severity(self) -> int:
        """Order for 'worst health' and for the monotonicity of running states."""
        return _SEVERITY[self]

    @property
    def is_problem(self) -> bool:
        return self in (Health.SLOW, Health.STRAGGLER, Health.STALLED, Health.UNRESPONSIVE, Health.UNREACHABLE, Health.DEAD, Health.FAILED)


_SEVERITY = {
    Health.DONE: 0,
    Health.OK: 1,
    Health.STARTING: 1,
    Health.NO_SIGNAL: 1,
    Health.SLOW: 2,
    Health.STRAGGLER: 2,
    Health.STALLED: 3,
    Health.UNRESPONSIVE: 4,
    Health.UNREACHABLE: 4,
    Health.DEAD: 5,
    Health.FAILED: 6,
}


@dataclass(frozen=True)
class Thresholds:
    """When a process counts as stalled, unresponsive or slow. Seconds unless noted.

    Stall limits learn from the run (nvidia-resiliency-ext derives its timeouts from observed
    intervals with a safety factor of 5): a process is stalled after
    ``max(stall_floor, stall_factor x its recent p99 progress interval)``, so 50 ms steps are
    watched in seconds and 30 s steps are not called stalled after 60. Before a process has
    made any progress (start-up, the first step: compiling, loading data) and in phases that
    legitimately take long (eval, checkpoint, load) it has limits of its own: the false hang
    kills that DLRover users report came from exactly those. ``stalled_after`` set (a run's
    config, ``--stalled-after``) is one fixed limit instead. Per-run overrides live in
    run.json under ``thresholds``.
    """

    heartbeat_interval: float = 1.0
    """How often a Reporter writes its record."""
    unresponsive_after: float = 10.0
    """No heartbeat for this long while the pid lives: the process cannot run Python."""
    stalled_after: float | None = None
    """A fixed stall limit (no progress for this long, heartbeats going on); None: learned."""
    stall_floor: float = 10.0
    """The learned limit is never shorter than this."""
    stall_factor: float = 5.0
    """The learned limit is this many times the process's recent p99 progress interval."""
    rhythm_factor: float = 10.0
    """A process that steps regularly (its p99 interval is known) is shown stalled after this
    many times its p99 interval, when that is sooner than the learned limit: a 10 steps/s loop
    that stops is seen in seconds. Display only: an automatic action waits for the learned
    limit (``rhythm=False``) and the launcher's full proof."""
    rhythm_floor: float = 2.0
    """The rhythm's limit is never shorter than this."""
    stall_default: float = 60.0
    """The limit while too few intervals are known to learn from."""
    first_progress_after: float = 600.0
    """Learned limits only: a process with no progress yet is 'starting' for this long."""
    phase_stalled_after: Mapping[str, float | None] = field(
        default_factory=lambda: {"idle": None, "supervise": None, "done": None, "agent": None, "helper": None,
                                 "eval": 600.0, "checkpoint": 600.0, "load": 600.0}
    )
    """Per-phase stall limits; None means the phase never counts as stalled (a torchrun agent,
    a helper process and an idle DataLoader worker make no progress of their own)."""
    startup_grace: float = 30.0
    """Fixed limits only: a process with no progress yet is 'starting' for this long."""
    slow_ratio: float = 0.5
    """Slower than this fraction of the peers' median rate is 'slow'."""
    straggler_score: float = 0.85
    """A rank whose straggler score (ups.status.straggler: the best rank's own time over its
    own, over its recent steps) is below this, while the others wait for it, is 'straggler'."""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> Thresholds:
        """Defaults overridden by the known keys of ``data`` (unknown keys ignored)."""
        if not data:
            return cls()
        known = {f.name for f in fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            if key not in known:
                continue
            if key == "phase_stalled_after":
                merged = dict(cls().phase_stalled_after)
                merged.update(value or {})
                kwargs[key] = merged
            else:
                kwargs[key] = None if value is None else float(value)
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: (dict(getattr(self, f.name)) if f.name == "phase_stalled_after" else getattr(self, f.name)) for f in fields(self)}

    def stall_limit(self, phase: str, p99: float | None = None, *, progressed: bool = True,
                    rhythm: bool = True) -> tuple[float | None, str]:
        """The stall limit for a process in ``phase`` and how it was decided (for the reason);
        ``rhythm`` False: the learned limit without the rhythm's (what an action waits for)."""
        if phase in self.phase_stalled_after:
            return self.phase_stalled_after[phase], f"the {phase} limit"
        if self.stalled_after is not None:
            return self.stalled_after, "fixed"
        if not progressed:
            return self.first_progress_after, "before the first progress"
        if p99 is not None:
            learned = self.stall_factor * p99
            limit, how = ((learned, f"{self.stall_factor:g} x p99 interval {_age(p99)}") if learned > self.stall_floor
                          else (self.stall_floor, f"the floor; p99 interval {_age(p99)}"))
            beat = max(self.rhythm_floor, self.rhythm_factor * p99)
            if rhythm and beat < limit:
                return beat, (f"its rhythm, {self.rhythm_factor:g} x p99 interval {_age(p99)}" if beat > self.rhythm_floor
                              else f"its rhythm's floor; p99 interval {_age(p99)}")
            return limit, how
        return self.stall_default, "the default, until intervals are known"


PAUSE_MARGIN = 2.0  # a long phase's limit: at least this many times the longest one seen


@dataclass(frozen=True)
class HealthVerdict:
    health: Health
    reason: str


def _age(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


@dataclass(frozen=True)
class Ages:
    """How long ago a record's clocks last moved, in seconds."""

    heartbeat: float
    progress: float  # since work advanced or the phase changed
    started: float
    monotonic: bool  # judged with CLOCK_MONOTONIC (same host, same boot), not wall time


def record_ages(record: StatusRecord, now: float, mono: float | None = None, boot_id: str | None = None) -> Ages:
    """Ages of a record. A record written on this boot of this host is judged with
    CLOCK_MONOTONIC, which every process of the host shares and which never jumps: an NTP
    step of the wall clock on a fresh cloud box must neither turn every process unresponsive
    nor hide a real hang. Records of other hosts (or older writers) use wall time."""
    if (mono is not None and boot_id and record.boot_id == boot_id and record.heartbeat_mono is not None
            and record.progress_mono is not None and record.started_mono is not None):
        progress = max(record.progress_mono, record.phase_mono or record.progress_mono)
        return Ages(mono - record.heartbeat_mono, mono - progress, mono - record.started_mono, True)
    return Ages(now - record.heartbeat_at, now - max(record.progress_at, record.phase_at), now - record.started_at, False)


def classify_health(
    record: StatusRecord,
    now: float,
    process_table: ProcessTable | None,
    thresholds: Thresholds = Thresholds(),
    peer_median_rate: float | None = None,
    *,
    mono: float | None = None,
    boot_id: str | None = None,
) -> HealthVerdict:
    """Health of one process. ``process_table`` None skips the pid check (remote host).
    ``mono`` and ``boot_id`` (this host's) judge same-boot records on CLOCK_MONOTONIC."""
    if record.state == "done":
        return HealthVerdict(Health.DONE, "finished")
    if record.state == "failed":
        return HealthVerdict(Health.FAILED, record.error or "failed without a message")
    if process_table is not None:
        live_start = process_table.start_time(record.pid)
        if live_start is None:
            seen = record_ages(record, now, mono, boot_id).heartbeat
            if record.role in ("worker", "helper") and record.metrics.get("attached") is True and seen <= OBSERVER_LOOK_S:
                # An attached job's worker or helper, recorded from outside by its observer
                # (ups.attach.observe), ended since that observer's last look: a DataLoader's
                # generation ends at every epoch (a worker just forked still has its rank's name:
                # a helper); the observer says at its next look whether this was that or a death.
                return HealthVerdict(Health.OK, f"pid {record.pid} is gone since the observer's last look, {seen:.1f} s "
                                                "ago; it notes how it ended at its next look")
            return HealthVerdict(
                Health.DEAD, f"pid {record.pid} is gone; last phase {record.phase}, record says running"
            )
        if not same_start(live_start, record.pid_start):
            return HealthVerdict(
                Health.DEAD, f"pid {record.pid} now belongs to another process (pid reused)"
            )
    ages = record_ages(record, now, mono, boot_id)
    heartbeat_age = ages.heartbeat
    if heartbeat_age > thresholds.unresponsive_after:
        return HealthVerdict(
            Health.UNRESPONSIVE,
            f"no heartbeat for {_age(heartbeat_age)} in phase {record.phase}"
            " (blocked in a C call, stopped, or in D state)",
        )
    since_progress = ages.progress
    progressed = record.step > 0
    grace = thresholds.startup_grace if thresholds.stalled_after is not None else thresholds.first_progress_after
    if not progressed and ages.started < grace and record.phase not in thresholds.phase_stalled_after:
        return HealthVerdict(Health.STARTING, f"started {_age(ages.started)} ago, phase {record.phase}")
    if not progressed and thresholds.stalled_after is None and record.phase not in thresholds.phase_stalled_after:
        # No step, batch, progress bar, pool task or "k/n" line ever: nothing says whether it
        # advances. Neither healthy nor stalled; only the launcher's proof (idle, the same
        # stack twice: ups.launch.proof) can make it a hang.
        return HealthVerdict(Health.NO_SIGNAL, f"no progress signal for {_age(ages.started)} (no steps, batches, "
                                               f"progress bars, pool tasks or k/n lines), phase {record.phase}")
    limit, how = stall_limit_of(record, thresholds)
    if limit is not None and since_progress > limit:
        return HealthVerdict(
            Health.STALLED, f"no progress for {_age(since_progress)} in phase {record.phase} (limit {_age(limit)}: {how})"
        )
    if (
        peer_median_rate is not None
        and peer_median_rate > 0
        and record.rate is not None
        and record.rate < thresholds.slow_ratio * peer_median_rate
    ):
        return HealthVerdict(
            Health.SLOW,
            f"{record.rate:.3g} {record.unit}/s, peers' median {peer_median_rate:.3g} {record.unit}/s",
        )
    return HealthVerdict(Health.OK, f"phase {record.phase}")


def stall_limit_of(record: StatusRecord, thresholds: Thresholds, *, rhythm: bool = True) -> tuple[float | None, str]:
    """A running process's stall limit and how it was decided: its phase's, the fixed one, or
    the one learned from its intervals (``rhythm``: the shorter one its regular steps allow,
    for display), raised for a periodic pause of its phase seen before."""
    limit, how = thresholds.stall_limit(record.phase, record.interval_p99, progressed=record.step > 0, rhythm=rhythm)
    longest = (getattr(record, "pauses", None) or {}).get(record.phase)
    if limit is not None and longest and PAUSE_MARGIN * longest > limit:
        # A periodic pause (an evaluation every N steps, a checkpoint every epoch) is learned
        # after its first occurrence: the next one may take as long, and then some.
        limit, how = PAUSE_MARGIN * longest, f"{PAUSE_MARGIN:g} x the longest {record.phase} so far, {_age(longest)}"
    return limit, how


def peer_median_rates(records: Iterable[StatusRecord]) -> dict[str, float | None]:
    """Median rate of running peers per record name (peers: same role and unit, at least 2 of
    them: an attached Lightning rank read in epochs a second is not slower than one read in
    batches a second)."""
    by_role: dict[tuple[str, str], list[float]] = {}
    running = [r for r in records if r.state == "running"]
    for r in running:
        if r.rate is not None and r.step > 0:
            by_role.setdefault((r.role, r.unit), []).append(r.rate)
    medians = {key: statistics.median(rates) for key, rates in by_role.items() if len(rates) >= 2}
    return {r.name: medians.get((r.role, r.unit)) for r in running}


def classify_run(
    records: Iterable[StatusRecord],
    now: float,
    process_table: ProcessTable | None,
    thresholds: Thresholds = Thresholds(),
    local_host: str | None = None,
    *,
    mono: float | None = None,
    boot_id: str | None = None,
) -> dict[str, HealthVerdict]:
    """Health of every record of a run, keyed by record name.

    The pid check applies only to records written on this host (``local_host``, default the
    machine's hostname): a pid on another node says nothing about this one's process table.
    """
    records = list(records)
    host = local_host if local_host is not None else hostname()
    medians = peer_median_rates(records)
    verdicts = {
        r.name: classify_health(
            r, now, process_table if r.host == host else None, thresholds, medians.get(r.name), mono=mono, boot_id=boot_id
        )
        for r in records
    }
    return stragglers(records, waiting_on_busy_peers(records, verdicts), thresholds)


def stragglers(records: list[StatusRecord], verdicts: dict[str, HealthVerdict],
               thresholds: Thresholds) -> dict[str, HealthVerdict]:
    """The rank its peers wait for (ups.status.straggler), when it is otherwise ok: 'straggler'
    with its score and cause. A display: no action is ever taken on it."""
    from ups.status.straggler import judge

    ranks, found = judge(records, thresholds.straggler_score)
    if found is None:
        return verdicts
    named = {t.name: t for t in ranks if t is found.rank or t.rank in found.node_ranks}
    out = dict(verdicts)
    for name, t in named.items():
        v = verdicts.get(name)
        if v is not None and v.health is Health.OK:
            out[name] = HealthVerdict(Health.STRAGGLER, f"score {t.score:.2f}, {found.cause}: {found.why}; costs the job "
                                                        f"{found.cost:.0%} of its step rate")
    return out


# Phases in which a rank is busy on its own while its peers wait for it (they will meet it in
# the next collective): what it is doing, in an operator's words.
BUSY_PHASES = {"eval": "evaluating", "checkpoint": "writing a checkpoint", "load": "loading a checkpoint"}
PAUSE_SAID_AFTER_S = 5.0  # no progress this long is a pause worth saying (or watching); shorter is a step
STACK_READ_EVERY_S = 10.0
"""An attached job's processes are read by py-spy this often (ups.attach.observe). A rank whose
only progress signal is its stacks' rhythm (no line of its log counts) can be seen to go round
only at a read, and a read may find it where the last one did: its progress is as old as two
reads before it is quiet at all."""
RHYTHM = "stacks:"  # how a counter from the stacks' rhythm names its source (``progress_from``)


def busy_doing(record: StatusRecord) -> str | None:
    """What a running process is busy with, as its own record tells (a long phase: a checkpoint,
    an evaluation); None when its record does not say it is busy. A record carries no CPU or I/O
    figures: whether a quiet process is working is the launcher's proof (ups.launch.proof) to find."""
    if record.state != "running" or record.collective:
        return None  # a process inside a collective waits for its peers: it is not busy on its own
    if record.phase in BUSY_PHASES:
        return BUSY_PHASES[record.phase]
    return None


def waiting_on_busy_peers(records: list[StatusRecord], verdicts: dict[str, HealthVerdict]) -> dict[str, HealthVerdict]:
    """A rank with no progress while a peer rank is busy on its own (an evaluation, a
    checkpoint on rank 0 alone) waits for that peer: it is not stalled. Shown as ok, saying
    whom it waits for; the verdict (ups why) names the busy rank and what it does."""
    out = dict(verdicts)
    busy = []
    for r in records:
        if r.role not in ("rank", "helper") or (doing := busy_doing(r)) is None:
            continue
        v = verdicts[r.name]
        if v.health is Health.STALLED:  # no progress, but working: long is not stuck
            out[r.name] = HealthVerdict(Health.OK, f"busy {doing}; {v.reason.replace('no progress', 'no step', 1)}")
        elif v.health not in (Health.OK, Health.SLOW):
            continue
        if r.role == "rank":
            busy.append((r, doing))
    if not busy:
        return out
    for r in records:
        if r.role == "rank" and verdicts[r.name].health is Health.STALLED:
            peer, doing = next(((p, d) for p, d in busy if p.name != r.name), (None, None))
            if peer is not None:
                out[r.name] = HealthVerdict(Health.OK, f"waits for {peer.label}, {doing} (phase {peer.phase})")
    return out


def unreachable_nodes(
    records: Iterable[StatusRecord], verdicts: Mapping[str, HealthVerdict], local_host: str | None = None
) -> dict[str, str]:
    """Nodes (hosts other than this one) whose every running record has gone without a
    heartbeat: the node is lost, or its network or shared folder is, not each of its
    processes. Returns {host: reason}. Only heartbeat ages count there: no pid check and no
    other comparison of this host's clock with that host's."""
    here = local_host if local_host is not None else hostname()
    by_host: dict[str, list[StatusRecord]] = {}
    for r in records:
        if r.host != here and not r.is_final:
            by_host.setdefault(r.host, []).append(r)
    out: dict[str, str] = {}
    for host, recs in by_host.items():
        silent = [verdicts.get(r.name) for r in recs]
        if recs and all(v is not None and v.health is Health.UNRESPONSIVE for v in silent):
            out[host] = (f"node {host} unreachable: none of its {len(recs)} running processes has written a heartbeat "
                         f"within the limit (the node, its network or the shared folder is gone)")
    return out


def worst(verdicts: Iterable[HealthVerdict]) -> HealthVerdict | None:
    """The most severe verdict (ties: the first)."""
    best: HealthVerdict | None = None
    for v in verdicts:
        if best is None or v.health.severity > best.health.severity:
            best = v
    return best
