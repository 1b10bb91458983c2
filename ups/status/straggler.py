"""The rank the others wait for, why, and what it costs: a pure judgement over the ranks'
``metrics.step_parts`` (:mod:`ups.status.steptime`).

Under DDP or FSDP every rank steps at the slowest rank's pace, so step times and rates are the
same on every rank and say nothing about who is slow. What differs is the *wait*: the slow rank
arrives last at each collective and hardly waits, the others wait for it. So each rank's step is
split into its wait and its own time (``own = step - wait``):

- ``own`` = its input wait and its own work outside backward and outside collectives (forward,
  the optimizer, the program's own code), plus the shortest backward and the shortest time in
  collectives of all ranks (the compute and the real communication every rank shares: DDP's
  all-reduce is waited inside ``backward()``, in C++, and evens out backward's wall time across
  ranks, so a rank's backward says how long it waited, not how long it worked);
  ``wait`` = the rest of its step;
- ``score`` = the best rank's own time over this rank's (1 for the best; nvidia-resiliency-ext's
  relative score, from medians over the window, so one slow step, a GC pause or a checkpoint,
  moves nothing).

A rank is named when its score is below the threshold (``THRESHOLD``, per run:
``thresholds.straggler_score`` in run.json), the ranks step together (their median steps agree)
and the others' wait rose to match its extra time. The cause is what explains most of the gap:
its main thread waiting for a core, or its DataLoader's workers waiting for theirs while its input
is late (``host``), its DataLoader (``input``), its own work outside
backward (``compute``), or every rank of one node of several (``node``); else ``unknown``, with
the numbers. The cost: every step waits the gap (its own time less the others' median own time)
for it, so the mean step without it is that much shorter: the gap over the mean step is the share
of the step rate it costs, and times the ranks (one GPU each) and 24 h, the GPU-hours a day. A
rank crowded off its core (``host``) slows the work every rank shares too (its part of backward
and of the collectives), which its own time cannot show: its cost is at least the time a step its
main thread waited for a core beyond its peers'.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

THRESHOLD = 0.85
SYNC_SPREAD = 0.15  # mean steps further apart than this: the ranks do not step together
EXPLAINS = 0.5  # a part explains the gap when it is at least this share of it
HOST_EXPLAINS = 0.3  # run-queue wait: a share of the gap (the rest is the same work done slower)
RUNQ_FLOOR = 0.05  # a main thread waiting less than this share of wall time for a core is not crowded
WORKERS_CROWDED = 0.1  # its workers wait this much more of their runnable time than the others': crowded, not slower
MIN_GAP_S = 0.002  # a rank under 2 ms a step slower than its peers is a shared box's noise, never named
# A rank stepping for fewer seconds than this is starting: its first batches (each rank's DataLoader
# workers starting, on a busy box one rank's later than the other's) weigh in its medians. CI at
# 5613631: 7.6 s into a job, rank 0's input 3.5 ms a step against 1.2 named it, the job healthy.
MIN_STEPPING_S = 8.0


@dataclass(frozen=True)
class RankTime:
    """One rank's recent step, in seconds (medians over its window)."""

    name: str
    rank: int
    host: str
    n: int
    step: float
    data: float
    collective: float
    backward: float
    other: float
    runq: float | None
    step_mean: float | None = None
    workers_runq: float | None = None  # of their runnable time, the share its DataLoader's workers waited for a core
    workers_wait: float | None = None  # of wall time, the share each of them waited for a core (their mean)
    stepping_s: float | None = None  # seconds since its first step (None: a record that does not say)
    wait: float = 0.0
    own: float = 0.0
    score: float = 1.0

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "host": self.host, "steps": self.n, "step_s": self.step, "data_s": self.data,
                "collective_s": self.collective, "backward_s": self.backward, "other_s": self.other,
                "runq": self.runq, "workers_runq": self.workers_runq, "wait_s": round(self.wait, 6), "own_s": round(self.own, 6),
                "score": round(self.score, 3)}


@dataclass(frozen=True)
class Straggler:
    """The rank named, the cause, the evidence in words and the cost."""

    rank: RankTime
    cause: str  # input | compute | host | node | unknown
    why: str
    evidence: tuple[str, ...]
    cost: float  # share of the step rate lost to it (0-1)
    ideal_step: float  # the mean step without it
    world: int
    threshold: float
    node_ranks: tuple[int, ...] = ()

    @property
    def gpu_hours_per_day(self) -> float:
        return self.cost * self.world * 24.0

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank.rank, "host": self.rank.host, "score": round(self.rank.score, 3), "cause": self.cause,
                "why": self.why, "cost": round(self.cost, 4), "step_s": self.rank.step, "step_mean_s": self.rank.step_mean,
                "ideal_step_s": round(self.ideal_step, 6), "gpu_hours_per_day": round(self.gpu_hours_per_day, 2),
                "threshold": self.threshold, "node_ranks": list(self.node_ranks)}


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms"


def rank_times(records: Iterable[Any]) -> list[RankTime]:
    """The running ranks with a step window, each with its wait, own time and score."""
    raw = []
    for r in records:
        parts = r.metrics.get("step_parts") if r.role == "rank" and r.state == "running" else None
        if not isinstance(parts, dict) or r.rank is None:
            continue
        raw.append(RankTime(r.name, r.rank, r.host, parts["n"], parts["step"][0], parts["data"][0],
                            parts["collective"][0], parts["backward"][0], parts["other"][0], parts.get("runq"),
                            parts.get("step_mean"), parts.get("workers_runq"), parts.get("workers_wait"),
                            parts.get("stepping_s")))
    if not raw:
        return []
    # Backward's own compute is the same on every rank (same model, same batch) and its wall time
    # is evened out by DDP's all-reduce; what tells the ranks apart is the time outside backward
    # and outside collectives: its input and its own work. The shortest backward and the
    # shortest collective time are the real work and communication every rank shares.
    shared = min(t.backward for t in raw) + min(t.collective for t in raw)
    timed = []
    for t in raw:
        # A sum of medians can pass the median step it is a part of: own time is at most the step.
        own = min(t.data + t.other + shared, t.step)
        timed.append((t, t.step - own, max(own, 1e-9)))
    best = min(own for _, _, own in timed)
    return sorted((RankTime(**{**t.__dict__, "wait": wait, "own": own, "score": best / own}) for t, wait, own in timed),
                  key=lambda t: t.rank)


def judge(records: Iterable[Any], threshold: float = THRESHOLD) -> tuple[list[RankTime], Straggler | None]:
    """Every rank's time, and the straggler when one is named (None: none, or nothing to compare)."""
    ranks = rank_times(records)
    if len(ranks) < 2 or any(t.stepping_s is not None and t.stepping_s < MIN_STEPPING_S for t in ranks):
        return ranks, None
    # Stepping together: the mean steps agree (a median can jump between the two modes of a
    # data-bound loop's steps, one rank's window a heartbeat apart from the other's).
    steps = [t.step_mean or t.step for t in ranks]
    if min(steps) <= 0 or max(steps) / min(steps) > 1 + SYNC_SPREAD:
        return ranks, None  # not stepping together: a rate per rank says who is slow (health's "slow")
    slow = min(ranks, key=lambda t: t.score)
    if slow.score >= threshold:
        return ranks, None
    peers = [t for t in ranks if t is not slow]
    peer_own = statistics.median(t.own for t in peers)
    gap = slow.own - peer_own
    if gap < MIN_GAP_S or statistics.median(t.wait for t in peers) - slow.wait < EXPLAINS * gap:
        return ranks, None  # the others do not wait for it
    cause, why, node_ranks = _cause(slow, peers, ranks, gap, threshold)
    # Every step waits ``gap`` for it: without it the mean step (what the rate sees, an epoch's
    # start and a checkpoint included) would be that much shorter. A crowded core slows more than
    # the rank's own time: its share of backward's compute and of the collectives too (the threads
    # that run them wait on the same core), which every rank then waits for and ``shared`` counts
    # as everyone's; the time its main thread waited for a core beyond its peers' is on the step's
    # path all the same, so a host straggler costs at least that.
    step = statistics.median(steps)
    lost = max(gap, _crowded(slow, peers)) if cause == "host" else gap
    cost = min(1.0, lost / step) if step > 0 else 0.0
    evidence = tuple(
        f"rank {t.rank}: step {_ms(t.step)} = own {_ms(t.own)} (input {_ms(t.data)}, backward {_ms(t.backward)}, "
        f"rest {_ms(t.other)}) + waiting for peers {_ms(t.wait)}"
        + (f"; waits for a core {t.runq:.0%} of the time" if t.runq is not None else "")
        + (f", its workers {t.workers_runq:.0%} of theirs" if t.workers_runq is not None else "")
        + f"; score {t.score:.2f}" for t in ranks)
    return ranks, Straggler(slow, cause, why, evidence, cost, max(step - lost, 0.0), len(ranks), threshold, node_ranks)


def _crowded(slow: RankTime, peers: list[RankTime]) -> float:
    """The seconds a step its main thread waited for a core beyond its peers' (the median's); 0
    where a run queue is not known."""
    peer_runq = [t.runq for t in peers if t.runq is not None]
    if slow.runq is None or not peer_runq:
        return 0.0
    return (slow.runq - statistics.median(peer_runq)) * slow.step


def _cause(slow: RankTime, peers: list[RankTime], ranks: list[RankTime], gap: float,
           threshold: float) -> tuple[str, str, tuple[int, ...]]:
    med = statistics.median
    hosts = {t.host for t in ranks}
    if len(hosts) > 1:
        mine = [t for t in ranks if t.host == slow.host]
        others = [t for t in ranks if t.host != slow.host]
        if len(mine) > 1 and all(t.score < threshold for t in mine) and all(t.score >= threshold for t in others):
            return ("node", f"every rank of node {slow.host} is slow ({len(mine)} ranks, scores "
                    f"{', '.join(f'{t.score:.2f}' for t in mine)}), the other nodes' are not",
                    tuple(t.rank for t in mine))
    peer_runq = [t.runq for t in peers if t.runq is not None]
    if slow.runq is not None and peer_runq and slow.runq >= RUNQ_FLOOR and _crowded(slow, peers) >= HOST_EXPLAINS * gap:
        return ("host", f"its main thread waits for a CPU core {slow.runq:.0%} of the time (the others "
                f"{med(peer_runq):.0%}): another process shares its cores", ())
    data_gap = slow.data - med(t.data for t in peers)
    if data_gap >= EXPLAINS * gap:
        peer_workers = [t.workers_runq for t in peers if t.workers_runq is not None]
        peer_waits = [t.workers_wait for t in peers if t.workers_wait is not None]
        # Crowded, and the time its workers lost to it explains the late batches: a worker that
        # sleeps on a slow source waits for a core most of its little runnable time on a busy
        # box (CI at 8967e41: 66% against 39%, a 420 ms input gap), and loses a few ms to it.
        lost = (slow.workers_wait - med(peer_waits)) * slow.step if slow.workers_wait is not None and peer_waits else 0.0
        if slow.workers_runq is not None and peer_workers and slow.workers_runq - med(peer_workers) >= WORKERS_CROWDED \
                and lost >= HOST_EXPLAINS * data_gap:
            return ("host", f"its DataLoader's workers wait for a CPU core {slow.workers_runq:.0%} of the time they "
                    f"could run (the others' {med(peer_workers):.0%}), so its next batch is late ({_ms(slow.data)} a "
                    f"step, the others {_ms(med(t.data for t in peers))}): another process shares their cores", ())
        return ("input", f"it waits {_ms(slow.data)} a step for its DataLoader's next batch (the others "
                f"{_ms(med(t.data for t in peers))}): its data loading is slower", ())
    work_gap = slow.other - med(t.other for t in peers)
    if work_gap >= EXPLAINS * gap:
        return ("compute", f"its own work outside backward takes {_ms(slow.other)} a step (the others "
                f"{_ms(med(t.other for t in peers))}): forward, the optimizer or the program's own code", ())
    return ("unknown", f"its own time is {_ms(slow.own)} a step against the others' {_ms(med(t.own for t in peers))}, "
            "and no one part explains it", ())
