"""What the precompute job does when a DataLoader worker fails: the watchdog's actions on a
hung or dead worker (stacks dumped, killed, or only logged under ``--observe-only``), the
blame it counts against the sample and file open in flight, the fallback to
``num_workers=0``, and the quarantine of samples (and files) that failed too often.

:class:`WorkerFaults` is the part of :class:`~ups.jobs.precompute.PrecomputeJob` that the
watchdog thread (:mod:`ups.jobs.watchdog`) calls; the job loop calls
:meth:`WorkerFaults.loader_failed` and :meth:`WorkerFaults.apply_quarantine` after a loader
broke.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any

from ups.jobs.watchdog import JobState, LoaderTimeout, Quarantined

if TYPE_CHECKING:
    from ups.data.shards import SampleReader
    from ups.launch.config import PrecomputeConfig
    from ups.runs.rundir import RunDir
    from ups.status.reporter import NullReporter, Reporter


class WorkerFaults:
    """The job's handling of failing workers; :class:`~ups.jobs.precompute.PrecomputeJob`
    sets the attributes below."""

    cfg: PrecomputeConfig
    rep: Reporter | NullReporter
    run: RunDir | None
    observe_only: bool
    rank: int
    state: JobState
    # a sample's ``file#index`` -> (split, sample index), for the samples of the split in hand
    current_sources: dict[str, tuple[str, int]]
    # (split, sample index) or (split, file name) -> (why, stack file) of the last blame
    blame_reasons: dict[tuple[str, Any], tuple[str, str | None]]

    # -- events ------------------------------------------------------------------------
    def event(self, name: str, **fields: Any) -> None:
        if self.run is not None:
            self.run.append_event(name, actor="job", **fields)

    def say(self, message: str) -> None:
        print(f"precompute: {message}", file=sys.stderr, flush=True)

    # -- watchdog actions (watchdog thread) ---------------------------------------------
    def request_fallback(self, reason: str) -> None:
        if not self.state.fallback:
            self.state.fallback, self.state.fallback_reason = True, reason
            self.event("fallback", reason=reason, to="num_workers=0")
            self.say(f"falling back to num_workers=0 ({reason})")

    def handle_hung_worker(self, rec: Any, why: str) -> None:
        from ups.errors import RefusedSignal
        from ups.runs.signals import dump_stacks, terminate

        with self.state.lock:
            if rec.worker in self.state.killed_by_watchdog:
                return
            self.state.killed_by_watchdog.add(rec.worker)
        if self.observe_only:
            self.event("worker.hung", worker=rec.worker, pid=rec.pid, item=rec.item, phase=rec.phase, reason=why,
                       stack_file=rec.stack_file, result="observe-only: not dumped, not killed")
            self.say(f"worker {rec.worker} (pid {rec.pid}) hung in {rec.phase} on {rec.item}: {why}; observe-only, left alone")
            return
        try:
            stack = dump_stacks(self.run, rec, actor="watchdog", timeout=3.0)
        except RefusedSignal as exc:
            stack = f"(no stack: {exc})"
        self.event("worker.hung", worker=rec.worker, pid=rec.pid, item=rec.item, phase=rec.phase, reason=why,
                   stack_file=rec.stack_file, stack=stack[-4000:])
        self.say(f"worker {rec.worker} (pid {rec.pid}) hung in {rec.phase} on {rec.item}: {why}; killing it")
        terminate(self.run, [rec], actor="watchdog", reason=f"hung: {why}", grace=1.0)
        self._blame(rec, f"worker hung in {rec.phase}: {why}")
        self._mark_worker_record(rec, f"killed by the watchdog: hung in {rec.phase} on {rec.item} ({why})")

    def handle_dead_worker(self, rec: Any) -> None:
        with self.state.lock:
            if rec.worker in self.state.killed_by_watchdog:
                return
            self.state.killed_by_watchdog.add(rec.worker)
        self.event("worker.died", worker=rec.worker, pid=rec.pid, item=rec.item, phase=rec.phase, stack_file=rec.stack_file)
        self.say(f"worker {rec.worker} (pid {rec.pid}) died in {rec.phase} on {rec.item}")
        if rec.phase in ("read", "data.open"):
            self._blame(rec, f"worker died in {rec.phase}")
        self._mark_worker_record(rec, f"died in {rec.phase} on {rec.item}")

    def _mark_worker_record(self, rec: Any, error: str) -> None:
        data = rec.with_changes(state="failed", error=error, heartbeat_at=time.time()).to_json().encode()
        self.run.write_file(f"status/{rec.name}.json", data)  # relative to the run folder, no link followed

    def _blame(self, rec: Any, reason: str) -> None:
        """Count a failure against the sample (and file open) that was in flight."""
        st = self.state
        with st.lock:
            st.worker_failures += 1
            target = self.current_sources.get(rec.item or "")
            if target is not None:
                st.sample_failures[target] += 1
                if rec.phase == "data.open":
                    file_key = (target[0], (rec.item or "").split("#")[0])
                    st.open_failures[file_key] += 1
                    self.blame_reasons.setdefault(file_key, (reason, rec.stack_file))
            if target is not None:
                self.blame_reasons[target] = (reason, rec.stack_file)
            if st.worker_failures >= self.cfg.fallback_after and not st.fallback:
                self.request_fallback(f"{st.worker_failures} worker failures (fallback_after={self.cfg.fallback_after})")

    # -- after a loader broke ------------------------------------------------------------
    def loader_failed(self, exc: BaseException) -> None:
        """The loader broke (a worker died, or our timeout): blame what was in flight."""
        from ups.runs.signals import is_alive
        from ups.runs.view import load_run_view

        text = str(exc).splitlines()[0]
        self.event("loader.error", error=text)
        self.say(f"data loader stopped: {text}; rebuilding over the samples not yet written")
        if self.run is None:
            return
        pids = dict(self.state.loader_pids)
        for p in load_run_view(self.run).workers(self.rank):
            rec = p.record
            if pids.get(rec.worker) != rec.pid or rec.worker in self.state.killed_by_watchdog or rec.state != "running":
                continue
            if not is_alive(rec):
                self.handle_dead_worker(rec)
            elif isinstance(exc, LoaderTimeout) and rec.phase in ("read", "data.open"):
                self.handle_hung_worker(rec, text)

    def apply_quarantine(self, key: str, reader: SampleReader) -> set[int]:
        """Quarantine samples (and whole files whose open hung) that failed too often."""
        st = self.state
        new: set[int] = set()
        reasons = self.blame_reasons
        with st.lock:
            files = {f for (k, f), n in st.open_failures.items() if k == key and n >= self.cfg.quarantine_after}
            for (k, idx), n in list(st.sample_failures.items()):
                if k != key:
                    continue
                shard, _ = reader.index.locate(idx)
                if n >= self.cfg.quarantine_after or shard.name in files:
                    new.add(idx)
            if files:
                new |= {i for (k, i) in self.current_sources.values() if k == key and reader.index.locate(i)[0].name in files}
            already = {q.index for q in st.quarantined if q.task_split == key}
            for idx in sorted(new - already):
                source = reader.index.source(idx)
                reason, stack_file = reasons.get((key, idx), ("hung or crashed repeatedly", None))
                fname = reader.index.locate(idx)[0].name
                if fname in files:
                    reason = f"opening {fname} hung or crashed {self.cfg.quarantine_after} times"
                    stack_file = stack_file or reasons.get((key, fname), (None, None))[1]
                q = Quarantined(key, idx, source, reason, stack_file)
                st.quarantined.append(q)
                self.event("quarantine", split=key, sample=source, index=idx, reason=reason, stack_file=stack_file)
                self.say(f"quarantined {key} {source}: {reason}")
                self.rep.advance(0)
        return new

    def skip_shard(self, key: str, name: str, reason: str) -> None:
        """A shard left out at launch: named in the summary like a quarantined file."""
        why = f"left out by --skip-bad-shards: {reason}"
        self.state.quarantined.append(Quarantined(key, None, name, why))
        self.event("quarantine", split=key, sample=name, index=None, reason=why, stack_file=None)
        self.say(f"{key} {name} {why}")
