"""A run as a watcher sees it: manifest + records + health, read once per tick.

``ups status``, ``ups runs`` and the console all build their screens from :class:`RunView`;
none of them reads status files or the process table on its own.
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ups.errors import CorruptRun
from ups.runs.rundir import FINAL_RUN_STATES, RunDir
from ups.runs.space import disk_full
from ups.status.health import (
    Health,
    HealthVerdict,
    Thresholds,
    classify_run,
    record_ages,
    unreachable_nodes,
    worst,
)
from ups.status.host import boot_id, hostname
from ups.status.procs import ProcessTable, StaticProcessTable, same_start
from ups.status.reader import ReadProblem, StatusSource, read_status_dir
from ups.status.record import StatusRecord
from ups.status.straggler import RankTime, Straggler, judge


@dataclass(frozen=True)
class ProcessView:
    record: StatusRecord
    verdict: HealthVerdict
    heartbeat_age: float
    progress_age: float

    def to_dict(self) -> dict[str, Any]:
        """The row documented for ``ups status --json`` (see docs/status-json.md)."""
        r = self.record
        return {
            "name": r.name,
            "role": r.role,
            "rank": r.rank,
            "local_rank": r.local_rank,
            "world_size": r.world_size,
            "worker": r.worker,
            "host": r.host,
            "pid": r.pid,
            "phase": r.phase,
            "state": r.state,
            "step": r.step,
            "total": r.total,
            "unit": r.unit,
            "rate": r.rate,
            "item": r.item,
            "heartbeat_age": round(self.heartbeat_age, 3),
            "progress_age": round(self.progress_age, 3),
            "gpu": None if r.gpu is None else {
                "device": r.gpu.device,
                "allocated": r.gpu.allocated,
                "reserved": r.gpu.reserved,
                "peak": r.gpu.peak,
                "nvml_used": None,
            },
            "metrics": r.metrics,
            "error": r.error,
            "health": self.verdict.health.value,
            "reason": self.verdict.reason,
            "stack_file": r.stack_file,
        }


@dataclass(frozen=True)
class NodeView:
    """One node of a multi-node run: its manifest's state and its processes' health."""

    host: str
    node_rank: int | None
    state: str | None  # its launcher's word (nodes/<host>.json), None when it has none
    health: str  # the worst of its processes, or "unreachable"
    reason: str
    processes: int
    launcher_pid: int | None = None
    summary: str | None = None
    local: bool = False  # the reading host

    @property
    def reachable(self) -> bool:
        return self.health != Health.UNREACHABLE.value

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "reachable": self.reachable}


@dataclass(frozen=True)
class RunView:
    run: RunDir
    manifest: dict[str, Any] | None
    manifest_problem: str | None
    processes: tuple[ProcessView, ...]
    problems: tuple[ReadProblem, ...]
    thresholds: Thresholds
    read_at: float
    supervision: str = "supervised"
    """``final``; ``supervised`` (the launcher lives, or cannot be checked from here);
    ``unsupervised`` (the launcher is gone, some of the job's processes still run: ``ups
    adopt`` takes it over); ``gone`` (the launcher and every process are gone but the run
    was never finished: a reader settles it from the records, see ups.launch.reconcile)."""
    nodes: tuple[NodeView, ...] = ()
    """A multi-node run's nodes (by node rank, then host); empty for a run of one node."""
    settled: dict[str, Any] | None = None
    """What a reader decided in memory for a run nobody is left to finish (state, summary,
    failure ...: ups.runs.settle), None when it needed no settling. ``ups runs --settle`` and
    ``ups adopt`` write exactly this down."""
    remote_stacks: dict[str, str] = dataclasses.field(default_factory=dict)
    """Other nodes' processes read with ``--remote`` (ups.runs.remote): by record name, the end
    of each one's stack file there, as that node's stream sent it (its stacks stay on its node)."""

    @property
    def is_multinode(self) -> bool:
        return bool(self.nodes)

    @property
    def run_id(self) -> str:
        return self.run.run_id

    @property
    def manifest_state(self) -> str | None:
        return None if self.manifest is None else self.manifest.get("state")

    @property
    def state(self) -> str | None:
        """The state to show: the manifest's, or ``unsupervised`` while the job runs on
        without its launcher."""
        return "unsupervised" if self.supervision == "unsupervised" else self.manifest_state

    @property
    def kind(self) -> str | None:
        return None if self.manifest is None else self.manifest.get("kind")

    @property
    def is_final(self) -> bool:
        return self.manifest_state in FINAL_RUN_STATES

    @property
    def worst(self) -> HealthVerdict | None:
        """The run's one-word health (``ups runs``, the follow line, the console's runs list):
        the worst of the processes doing the work. The launcher counts only when it is in
        trouble: it makes no progress of its own and reads 'starting' for its first 30 s, on
        a run that is long done as well. Before any other record exists it is all there is."""
        working = [p.verdict for p in self.processes if p.record.role != "launcher"]
        if not working:
            return worst(p.verdict for p in self.processes)
        return worst(p.verdict for p in self.processes if p.record.role != "launcher" or p.verdict.health.is_problem)

    def ranks(self) -> list[ProcessView]:
        return [p for p in self.processes if p.record.role == "rank"]

    @functools.cached_property
    def step_times(self) -> tuple[dict[str, RankTime], Straggler | None]:
        """Where each running rank's recent step goes (its record's ``metrics.step_parts``), by
        record name, with its wait, own time and score; and the straggler, when one is named
        under this run's threshold (ups.status.straggler, the judgement the health rules make)."""
        ranks, found = judge([p.record for p in self.processes], self.thresholds.straggler_score)
        return {t.name: t for t in ranks}, found

    def workers(self, rank: int | None = None) -> list[ProcessView]:
        return [
            p for p in self.processes
            if p.record.role == "worker" and (rank is None or p.record.rank == rank)
        ]

    def process(self, name: str) -> ProcessView | None:
        return next((p for p in self.processes if p.record.name == name), None)

    @property
    def progress(self) -> tuple[int, int | None]:
        """Work done / total across ranks (the slowest rank's step for training)."""
        ranks = [p.record for p in self.ranks()]
        if not ranks:
            return (0, None)
        totals = [r.total for r in ranks if r.total]
        return (min(r.step for r in ranks), max(totals) if totals else None)

    @property
    def rate(self) -> float | None:
        rates = [p.record.rate for p in self.ranks() if p.record.rate is not None]
        return statistics.median(rates) if rates else None

    @property
    def unit(self) -> str:
        ranks = self.ranks()
        return ranks[0].record.unit if ranks else "items"

    @property
    def eta_s(self) -> float | None:
        step, total = self.progress
        rate = self.rate
        if not total or not rate or rate <= 0 or self.is_final:
            return None
        return max(0.0, (total - step) / rate)


def load_run_view(
    run: RunDir,
    *,
    now: float | None = None,
    process_table: ProcessTable | None = None,
    table_factory: Callable[[list[int]], ProcessTable] | None = None,
    source: StatusSource | None = None,
    include: Callable[[str], bool] | None = None,
    local_host: str | None = None,
    mono: float | None = None,
) -> RunView:
    """Read the manifest and every record once (or those ``include`` names), classify them.

    The process table is ``process_table``, else ``table_factory`` (default: a /proc snapshot)
    over the records' pids and every launcher run.json names: a launcher that has not written
    its own record yet (the first second of a run) is alive, not gone.

    Ages of records written on this boot of this host come from CLOCK_MONOTONIC (``mono``,
    taken now unless ``now`` is given without it: a fixed clock in tests is a wall clock)."""
    problem: str | None = None
    try:
        manifest: dict[str, Any] | None = run.read_manifest()
    except CorruptRun as exc:
        manifest, problem = None, str(exc)
    snap = source.read() if source is not None else read_status_dir(run.status_dir, include)
    records = with_output_progress(snap.records)
    if now is None:
        now, mono = time.time(), time.monotonic() if mono is None else mono
    boot = boot_id() if mono is not None else None
    table = process_table or (table_factory or StaticProcessTable.snapshot)(
        [r.pid for r in records] + _launcher_pids(manifest or {}))
    thresholds = Thresholds.from_dict((manifest or {}).get("thresholds"))
    verdicts = classify_run(records, now, table, thresholds, local_host=local_host, mono=mono, boot_id=boot)
    processes = []
    for r in records:
        ages = record_ages(r, now, mono, boot)
        processes.append(ProcessView(record=r, verdict=verdicts[r.name], heartbeat_age=max(0.0, ages.heartbeat),
                                     progress_age=max(0.0, ages.progress)))
    processes = tuple(processes)
    here = local_host or hostname()
    lost = unreachable_nodes(records, verdicts, here)
    if lost:  # every silent record of a silent node says so: the node, not N unresponsive ranks
        processes = tuple(
            dataclasses.replace(p, verdict=HealthVerdict(Health.UNREACHABLE, lost[p.record.host]))
            if p.record.host in lost and not p.record.is_final else p for p in processes)
    full = disk_full(run.path) if any(p.verdict.health is Health.UNRESPONSIVE for p in processes) else None
    if full is not None:
        processes = _disk_full_verdicts(processes, full)
    view = RunView(run, manifest, problem, processes, snap.problems, thresholds, now)
    return _around(view, manifest, table, here, lost)


def settled_view(view: RunView, manifest: dict[str, Any], settled: dict[str, Any]) -> RunView:
    """``view`` around the manifest a reader settled in memory (ups.runs.settle): the parts
    that follow from the manifest (a multi-node run's nodes and lost nodes, the supervision)
    are derived again; the records, their verdicts and the clock stay as they were read.
    Nobody is left to supervise a settled run, so no process of it is looked up again."""
    lost = {n.host: n.reason for n in view.nodes if not n.reachable}
    return dataclasses.replace(_around(view, manifest, StaticProcessTable({}), hostname(), lost), settled=settled)


def _around(view: RunView, manifest: dict[str, Any] | None, table: ProcessTable, here: str,
            lost: dict[str, str]) -> RunView:
    """``view`` with ``manifest`` and what follows from it: the nodes of a multi-node run, a
    lost node's end, and who supervises the run (``table``: the launchers' pids)."""
    nodes: tuple[NodeView, ...] = ()
    if manifest is not None and manifest.get("multinode"):
        nodes = node_views(manifest, view.processes, lost, here)
        manifest = with_lost_nodes(manifest, nodes)
    launcher = (manifest or {}).get("launcher") if isinstance((manifest or {}).get("launcher"), dict) else None
    supervision = _supervision(manifest, launcher, view.processes, table, here, multinode=bool(nodes))
    return dataclasses.replace(view, manifest=manifest, supervision=supervision, nodes=nodes)


def with_output_progress(records: tuple[StatusRecord, ...]) -> tuple[StatusRecord, ...]:
    """The counter a job prints ("converted 5/40 files"), which its launcher reads from its
    output (``metrics.output_progress``), as the progress of its top process when that
    process reports none of its own (no steps, batches or bars): a data-prep script that
    prints its count is making progress, and its count and total are shown."""
    launcher = next((r for r in records if r.role == "launcher" and isinstance(r.metrics.get("output_progress"), dict)), None)
    if launcher is None:
        return records
    counter = launcher.metrics["output_progress"]
    top = next((r for r in records if r.role == "rank" and (r.rank or 0) == 0 and r.state == "running"
                and r.step == 0 and r.host == launcher.host), None)
    if top is None:
        return records
    derived = dataclasses.replace(top, step=counter["k"], total=counter["n"], unit=counter.get("unit") or "items",
                                  rate=counter.get("rate") or top.rate, progress_mono=None,
                                  progress_at=max(top.progress_at, counter["at"]), item=counter.get("text") or top.item,
                                  metrics={**top.metrics, "progress_from": "output"})
    return tuple(derived if r is top else r for r in records)


def _disk_full_verdicts(processes: tuple[ProcessView, ...], full: str) -> tuple[ProcessView, ...]:
    """Records that went stale because the run folder's disk is full (``full``: the evidence):
    the processes cannot be seen (unreachable), not blocked in a C call."""
    return tuple(
        dataclasses.replace(p, verdict=HealthVerdict(
            Health.UNREACHABLE, f"disk full: no record written for {p.heartbeat_age:.0f} s because {full}; "
                                "the process may be running fine"))
        if p.verdict.health is Health.UNRESPONSIVE else p for p in processes)


def _launcher_pids(manifest: dict[str, Any]) -> list[int]:
    """The run's launcher and, in a multi-node run, every node's."""
    entries = [manifest.get("launcher")] + [n.get("launcher") for n in (manifest.get("nodes") or {}).values()
                                            if isinstance(n, dict)]
    return [e["pid"] for e in entries if isinstance(e, dict) and isinstance(e.get("pid"), int)]


def node_views(manifest: dict[str, Any], processes: tuple[ProcessView, ...], lost: dict[str, str],
               here: str) -> tuple[NodeView, ...]:
    """Every node the manifests or the records name, with its state and health."""
    manifests = manifest.get("nodes") or {}
    hosts = set(manifests) | {p.record.host for p in processes}
    out = []
    for host in hosts:
        m = manifests.get(host) or {}
        mine = [p for p in processes if p.record.host == host]
        if host in lost:
            health, reason = Health.UNREACHABLE.value, lost[host]
        else:
            w = worst(p.verdict for p in mine if p.record.role != "launcher" or p.verdict.health.is_problem)
            health, reason = (w.health.value, w.reason) if w else ("starting", "no process has written a record yet")
            if not mine and m.get("state") not in FINAL_RUN_STATES:
                health, reason = "starting", m.get("problem") or "no process has written a record yet"
        out.append(NodeView(host, m.get("node_rank"), m.get("state"), health, reason, len(mine),
                            (m.get("launcher") or {}).get("pid"), m.get("summary"), host == here))
    out.sort(key=lambda n: (n.node_rank if n.node_rank is not None else 1 << 30, n.host))
    return tuple(out)


def with_lost_nodes(manifest: dict[str, Any], nodes: tuple[NodeView, ...]) -> dict[str, Any]:
    """A multi-node run whose every node has ended or is unreachable, one at least
    unreachable, has ended failed: the lost node is named (nobody is left there to say)."""
    if not nodes:
        return manifest
    lost = [n for n in nodes if not n.reachable]
    if manifest.get("state") in FINAL_RUN_STATES:
        if not lost or manifest.get("state") == "succeeded":
            return manifest
        # Ended failed while a node is unreachable, heard from or never: the lost node comes
        # first (the others' errors are what losing it did to them).
        first = "; ".join(f"node {n.host} unreachable ({n.reason or 'no answer'})" for n in lost)
        failure = {**(manifest.get("failure") or {}), "node": lost[0].host}
        return {**manifest, "summary": f"{first}; {manifest.get('summary') or '-'}", "failure": failure,
                "failed_nodes": [n.host for n in lost] + [h for h in manifest.get("failed_nodes", []) if h not in {n.host for n in lost}],
                "unreachable_nodes": [n.host for n in lost]}
    if not lost or any(n.reachable and n.state not in FINAL_RUN_STATES for n in nodes):
        return manifest
    parts = [f"node {n.host} unreachable ({n.processes} processes silent; launcher pid {n.launcher_pid})" for n in lost]
    parts += [f"node {n.host} {n.state}: {n.summary or '-'}" for n in nodes if n.reachable and n.state != "succeeded"]
    failure = dict(manifest.get("failure") or {})
    failure.setdefault("node", lost[0].host)
    return {**manifest, "state": "failed", "summary": "; ".join(parts), "failure": failure,
            "failed_nodes": sorted({*manifest.get("failed_nodes", []), *(n.host for n in lost)}),
            "unreachable_nodes": [n.host for n in lost], "ended_at": manifest.get("ended_at") or time.time()}


def node_view(view: RunView, host: str | None = None) -> RunView:
    """The part of a view on one host (default this one): what that node's launcher
    watches, finishes and acts on. A run of one node is returned whole."""
    if not view.is_multinode and not (view.manifest or {}).get("multinode"):
        return view
    host = host or hostname()
    return dataclasses.replace(view, processes=tuple(p for p in view.processes if p.record.host == host))


def _supervision(manifest: dict[str, Any] | None, launcher: dict[str, Any] | None, processes: tuple[ProcessView, ...],
                 table: ProcessTable, host: str, *, multinode: bool = False) -> str:
    """Is anyone still in charge of this run? See RunView.supervision. In a multi-node run
    this host's node is judged (its launcher, its processes), when this host is one."""
    if manifest is None or manifest.get("state") in FINAL_RUN_STATES:
        return "final"
    if multinode:
        own = (manifest.get("nodes") or {}).get(host)
        if not own or own.get("state") in FINAL_RUN_STATES:
            return "supervised"  # not a node of this run, or this node has ended: the others judge their own
        launcher = own.get("launcher") if isinstance(own.get("launcher"), dict) else None
    if not launcher or not launcher.get("pid") or manifest.get("host", host) != host:
        return "supervised"  # nothing to check, or the launcher lives on another host
    if same_start(table.start_time(launcher["pid"]), launcher.get("pid_start")):
        return "supervised"
    job = [p for p in processes if p.record.role != "launcher" and (not multinode or p.record.host == host)]
    alive = [p for p in job if not p.record.is_final and p.verdict.health is not Health.DEAD]
    return "unsupervised" if alive else "gone"
