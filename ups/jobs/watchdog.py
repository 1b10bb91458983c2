"""The precompute's watchdog: a thread beside the main loop that reads the workers' records.

A worker stalled or unresponsive past ``worker_timeout`` is handed to the job as hung (it
dumps the stacks, kills the worker and blames what was in flight), one whose pid is gone as
dead; the watchdog also serves control requests (``ups fallback``) within about a second.
What it decides lives in ``JobState``, shared with the main loop, which rebuilds the loader
over the samples not yet written when a loader breaks (``LoaderBroken``).
"""

from __future__ import annotations

import sys
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Protocol

from ups.launch.config import PrecomputeConfig
from ups.runs.rundir import RunDir

WATCHDOG_TICK_S = 0.25


class LoaderBroken(RuntimeError):
    """The DataLoader cannot go on: a worker died, or our timeout passed."""


class LoaderTimeout(LoaderBroken):
    """No batch for ``dataloader_timeout`` seconds."""


@dataclass
class Quarantined:
    task_split: str
    index: int | None  # None: a whole shard left out at launch (--skip-bad-shards)
    source: str
    reason: str
    stack_file: str | None = None


@dataclass
class JobState:
    """Shared between the main loop and the watchdog thread (simple fields, one writer each)."""

    fallback: bool = False
    fallback_reason: str | None = None
    worker_failures: int = 0
    sample_failures: Counter = field(default_factory=Counter)
    open_failures: Counter = field(default_factory=Counter)
    quarantined: list[Quarantined] = field(default_factory=list)
    loader_pids: dict[int, int] = field(default_factory=dict)  # worker record id -> pid
    killed_by_watchdog: set[int] = field(default_factory=set)
    generation: int = 0
    split_key: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)


class WatchedJob(Protocol):
    """What the watchdog needs of the job it watches (``PrecomputeJob``)."""

    cfg: PrecomputeConfig
    run: RunDir | None
    rank: int
    state: JobState

    def request_fallback(self, reason: str) -> None: ...

    def handle_hung_worker(self, rec: Any, why: str) -> None: ...

    def handle_dead_worker(self, rec: Any) -> None: ...


class Watchdog(threading.Thread):
    """Watches the current loader's workers through their status records; serves control."""

    def __init__(self, job: WatchedJob) -> None:
        super().__init__(name="ups-precompute-watchdog", daemon=True)
        self.job = job
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(WATCHDOG_TICK_S):
            try:
                self.tick()
            except Exception as exc:  # noqa: BLE001 - the watchdog must outlive a bad tick
                print(f"ups: watchdog tick failed: {exc!r}", file=sys.stderr, flush=True)

    def tick(self) -> None:
        job = self.job
        if job.run is None:
            return
        for path, body in job.run.pending_controls():
            if body.get("request") == "fallback":
                job.request_fallback(f"requested by {body.get('actor', 'operator')}")
                job.run.ack_control(path, actor="job", result="falling back to num_workers=0")
            else:
                job.run.ack_control(path, actor="job", result=f"unknown request {body.get('request')!r} ignored")
        self.check_workers()

    def check_workers(self) -> None:
        from ups.runs.view import load_run_view
        from ups.status.health import Health

        job, st = self.job, self.job.state
        pids = dict(st.loader_pids)
        if not pids:
            return
        view = load_run_view(job.run)
        for p in view.workers(job.rank):
            rec = p.record
            if rec.worker not in pids or pids[rec.worker] != rec.pid or rec.worker in st.killed_by_watchdog:
                continue
            hung_for = p.heartbeat_age if p.verdict.health is Health.UNRESPONSIVE else p.progress_age
            if p.verdict.health in (Health.UNRESPONSIVE, Health.STALLED) and hung_for >= job.cfg.worker_timeout:
                job.handle_hung_worker(rec, p.verdict.reason)
            elif p.verdict.health is Health.DEAD:
                job.handle_dead_worker(rec)
