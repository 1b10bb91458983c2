"""Snapshot tests of key console screens: fixed clock, synthetic runs, fake process table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from console.app import UpsConsole
from ups.gpu import FakeProvider
from ups.runs.rundir import MANIFEST_SCHEMA
from ups.status.procs import StaticProcessTable
from ups.status.record import StatusRecord

T0 = 1_795_340_100.0  # a fixed "now"
START = T0 - 3600
ALIVE = {1001: START, 1002: START, 1010: START, 1011: START, 1012: START, 2001: START, 2002: START}
NO_GPU = FakeProvider.from_dict({"available": False, "reason": "NVML not found: no NVIDIA driver on this machine"})


def make_run(root: Path, run_id: str, kind: str, state: str, records: list[StatusRecord], **manifest) -> None:
    path = root / run_id
    for sub in ("status", "stacks", "logs", "control"):
        (path / sub).mkdir(parents=True, exist_ok=True)
    m = {"schema": MANIFEST_SCHEMA, "id": run_id, "kind": kind, "state": state, "created_at": T0 - 300, "ended_at": None,
         "host": "gpu-box-1", "argv": [], "config": {}, **manifest}
    (path / "run.json").write_text(json.dumps(m))
    for r in records:
        (path / "status" / f"{r.name}.json").write_text(r.to_json())
    (path / "logs" / "job.log").write_text("precompute: 400 samples, 0 already cached, 4 workers, device cuda\n")


def rec(run_id: str, name: str, pid: int, **kw) -> StatusRecord:
    base = dict(run_id=run_id, name=name, pid=pid, pid_start=START, host="gpu-box-1", role="rank", rank=0,
                started_at=T0 - 290, heartbeat_at=T0 - 0.4, progress_at=T0 - 0.4, phase_at=T0 - 200, phase="encode",
                step=120, total=400, unit="samples", rate=37.5)
    base.update(kw)
    return StatusRecord(**base)


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    root = tmp_path / "runs"
    a = "20261122-091500-precompute-ab12"
    make_run(root, a, "precompute", "running", [
        rec(a, "launcher", 1001, role="launcher", rank=None, phase="supervise", step=0, total=None, rate=None),
        rec(a, "rank-0", 1002),
        rec(a, "rank-0-worker-0", 1010, role="worker", worker=0, phase="read", item="burgers1d_train_000.h5#17", step=31, total=None, rate=9.1),
        rec(a, "rank-0-worker-1", 1011, role="worker", worker=1, phase="data.open", item="burgers1d_train_001.h5#0",
            step=12, total=None, rate=0.0, heartbeat_at=T0 - 42, progress_at=T0 - 42),
        rec(a, "rank-0-worker-2", 1012, role="worker", worker=2, phase="read", item="burgers1d_train_002.h5#3", step=30,
            total=None, rate=0.0, progress_at=T0 - 75, heartbeat_at=T0 - 0.3, phase_at=T0 - 75),
        rec(a, "rank-0-worker-3", 1013, role="worker", worker=3, phase="read", item="burgers1d_train_003.h5#9", step=29, total=None, rate=8.8),
    ], mode="parallel", thresholds={"stalled_after": 60, "unresponsive_after": 10})
    b = "20261122-080000-train-cd34"
    make_run(root, b, "train", "failed", [
        rec(b, "rank-0", 2001, unit="steps", total=500, step=212, state="failed", error="killed by the launcher", phase="train"),
        rec(b, "rank-1", 2002, rank=1, unit="steps", total=500, step=0, state="running", phase="model.build", heartbeat_at=T0 - 3000),
    ], summary="rank 1 killed by SIGSEGV in phase model.build", world_size=2)
    return root


def app_for(runs: Path, **kw) -> UpsConsole:
    return UpsConsole(runs, poll=False, clock=lambda: T0, gpu_provider=NO_GPU, local_host="gpu-box-1",
                      process_table=lambda pids: StaticProcessTable({p: ALIVE.get(p) for p in pids}), **kw)


def test_runs_screen(snap_compare, runs):
    assert snap_compare(app_for(runs), terminal_size=(120, 36))


def test_run_with_mixed_health(snap_compare, runs):
    async def open_run(pilot):
        pilot.app.open_run("20261122-091500-precompute-ab12")
        await pilot.pause()

    assert snap_compare(app_for(runs), terminal_size=(120, 36), run_before=open_run)


def test_kill_confirmation(snap_compare, runs):
    async def confirm(pilot):
        pilot.app.open_run("20261122-091500-precompute-ab12")
        await pilot.pause()
        workers = pilot.app.screen.query_one("#workers")
        workers.focus()
        workers.move_cursor(row=workers.get_row_index("rank-0-worker-1"))
        await pilot.pause()
        await pilot.press("k")
        await pilot.pause()

    assert snap_compare(app_for(runs), terminal_size=(120, 36), run_before=confirm)


def test_no_gpu_panel(snap_compare, runs):
    async def gpu_tab(pilot):
        pilot.app.open_run("20261122-091500-precompute-ab12")
        await pilot.pause()
        pilot.app.screen.query_one("#panels").active = "tab-gpu"
        await pilot.pause()

    assert snap_compare(app_for(runs), terminal_size=(80, 24), run_before=gpu_tab)
