"""Which run, rank or worker holds each GPU process's memory, and which belong to no run.

A GPU process is attributed to a run's process by pid **and** start time (a reused pid is
never attributed). The rest are flagged "not in any run" with user and command line: the
zombies that make the next launch OOM. Inside a container NVML may report host pids that do
not exist in this pid namespace: that is detected and said, not guessed around.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from ups.gpu.snapshot import GpuSnapshot
from ups.status.procs import process_start_time, same_start
from ups.status.reader import read_status_dir
from ups.status.record import StatusRecord

NOT_IN_RUN = "not in any run"
CONTAINER_NOTE = (
    "NVML reports pids that do not exist in this pid namespace (running in a container?): "
    "those processes cannot be matched to runs here"
)


@dataclass(frozen=True)
class GpuProcessView:
    device: int
    pid: int
    used_memory: int | None
    status: str  # run | orphan | reused | unknown
    run_id: str | None = None
    name: str | None = None  # record name: rank-0, rank-0-worker-1, launcher
    label: str | None = None  # "rank 0 / worker 1"
    user: str | None = None
    command: str | None = None
    note: str = ""


@dataclass(frozen=True)
class AttributedGpu:
    gpu: GpuSnapshot
    processes: tuple[GpuProcessView, ...]
    notes: tuple[str, ...] = ()

    def orphans(self) -> list[GpuProcessView]:
        return [p for p in self.processes if p.status == "orphan"]

    def to_dict(self) -> dict:
        from dataclasses import asdict

        return {**self.gpu.to_dict(), "processes": [asdict(p) for p in self.processes], "notes": list(self.notes)}


def records_for_attribution(runs_root: str | os.PathLike[str]) -> list[tuple[str, StatusRecord]]:
    """Every process record under a runs root (unreadable files are skipped)."""
    root = Path(runs_root)
    out: list[tuple[str, StatusRecord]] = []
    if not root.is_dir():
        return out
    for run in sorted(p for p in root.iterdir() if p.is_dir()):
        for rec in read_status_dir(run / "status").records:
            out.append((run.name, rec))
    return out


def _owner(pid: int) -> tuple[str | None, str | None]:
    import psutil

    try:
        p = psutil.Process(pid)
        with p.oneshot():
            cmd = " ".join(p.cmdline()) or p.name()
            return p.username(), cmd[:200]
    except (psutil.Error, OSError):
        return None, None


def attribute(
    snapshot: GpuSnapshot,
    records: Iterable[tuple[str, StatusRecord]],
    start_time: Callable[[int], float | None] = process_start_time,
) -> AttributedGpu:
    by_pid: dict[int, list[tuple[str, StatusRecord]]] = {}
    for run_id, rec in records:
        by_pid.setdefault(rec.pid, []).append((run_id, rec))
    views: list[GpuProcessView] = []
    missing = 0
    for dev in snapshot.devices:
        for gp in dev.processes:
            live = start_time(gp.pid)
            if live is None:
                missing += 1
                views.append(GpuProcessView(dev.index, gp.pid, gp.used_memory, "unknown",
                                            note="pid not visible in this pid namespace"))
                continue
            match = next(((r, rec) for r, rec in by_pid.get(gp.pid, []) if same_start(live, rec.pid_start)), None)
            if match is not None:
                run_id, rec = match
                views.append(GpuProcessView(dev.index, gp.pid, gp.used_memory, "run", run_id, rec.name, rec.label))
                continue
            user, cmd = _owner(gp.pid)
            stale = by_pid.get(gp.pid)
            if stale:
                run_id, rec = stale[0]
                views.append(GpuProcessView(dev.index, gp.pid, gp.used_memory, "reused", user=user, command=cmd,
                                            note=f"pid once was {rec.label} of {run_id}, now another process: {NOT_IN_RUN}"))
            else:
                views.append(GpuProcessView(dev.index, gp.pid, gp.used_memory, "orphan", user=user, command=cmd, note=NOT_IN_RUN))
    notes = (CONTAINER_NOTE,) if missing else ()
    return AttributedGpu(snapshot, tuple(views), notes)


def gpu_memory_by_pid(snapshot: GpuSnapshot) -> dict[int, int]:
    """NVML's used GPU memory per pid, summed over devices (for ``ups status``)."""
    out: dict[int, int] = {}
    for dev in snapshot.devices:
        for p in dev.processes:
            if p.used_memory is not None:
                out[p.pid] = out.get(p.pid, 0) + p.used_memory
    return out
