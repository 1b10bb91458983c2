"""GPU layer: the no-NVML path for real, attribution driven by a fake NVML provider over
real processes and real status records (this machine has no GPU)."""

from __future__ import annotations

import json
import os

import pytest
from helpers import run_ups, wait_for

from ups.gpu import (
    FakeProvider,
    NvmlProvider,
    attribute,
    gpu_memory_by_pid,
    records_for_attribution,
)
from ups.gpu.attribution import CONTAINER_NOTE, NOT_IN_RUN
from ups.runs.rundir import RunDir
from ups.status.procs import process_start_time
from ups.status.record import StatusRecord

GIB = 1 << 30


def sleeper(procs):
    p = procs.python("import time; time.sleep(120)")
    wait_for(lambda: process_start_time(p.pid) is not None, 10, message="sleeper up")
    return p


def write_record(run: RunDir, pid: int, *, role="rank", rank=0, worker=None, pid_start=None) -> StatusRecord:
    from ups.status.record import process_name

    rec = StatusRecord(
        run_id=run.run_id, role=role, name=process_name(role, rank, worker), pid=pid,
        pid_start=pid_start if pid_start is not None else process_start_time(pid), host=os.uname().nodename,
        rank=rank, worker=worker,
    )
    (run.status_dir / f"{rec.name}.json").write_text(rec.to_json())
    return rec


def fake(processes: list[tuple[int, int]], devices: int = 1) -> dict:
    return {
        "available": True, "reason": None, "driver_version": "570.86", "cuda_driver_version": "12.8",
        "devices": [
            {"index": d, "name": "NVIDIA H100 80GB HBM3", "uuid": f"GPU-{d}", "memory_total": 80 * GIB,
             "memory_used": sum(m for _, m in processes), "utilization_gpu": 97, "temperature_c": 61, "power_w": 512.0,
             "processes": [{"pid": pid, "used_memory": mem} for pid, mem in processes] if d == 0 else []}
            for d in range(devices)
        ],
    }


def test_no_nvml_is_a_normal_snapshot_with_the_reason():
    snap = NvmlProvider().snapshot()  # the real provider: no driver on this machine
    if snap.available:
        pytest.skip("this machine has an NVIDIA driver: tests/test_gpu_real.py covers it")
    assert snap.available is False and snap.devices == ()
    assert "NVML not found" in snap.reason or "driver" in snap.reason
    res = run_ups("gpu")
    assert res.returncode == 1 and "No visible devices found" in res.stdout and "Traceback" not in res.stderr
    data = json.loads(run_ups("gpu", "--json").stdout)
    assert data["available"] is False and data["reason"] == snap.reason


def test_attribution_of_ranks_workers_orphans_and_reused_pids(procs, runs_root):
    rank0, worker1, orphan, reuser = (sleeper(procs) for _ in range(4))
    run = RunDir.create(runs_root, "train")
    write_record(run, rank0.pid, rank=0)
    write_record(run, worker1.pid, role="worker", rank=0, worker=1)
    # A record naming `reuser`'s pid with another start time: the rank that had it is gone.
    write_record(run, reuser.pid, rank=1, pid_start=process_start_time(reuser.pid) - 1000)
    snap = FakeProvider.from_dict(fake([(rank0.pid, 30 * GIB), (worker1.pid, GIB), (orphan.pid, 20 * GIB), (reuser.pid, 5 * GIB)])).snapshot()
    view = attribute(snap, records_for_attribution(runs_root))
    by_pid = {p.pid: p for p in view.processes}
    assert (by_pid[rank0.pid].status, by_pid[rank0.pid].run_id, by_pid[rank0.pid].label) == ("run", run.run_id, "rank 0")
    assert by_pid[worker1.pid].label == "rank 0 / worker 1"
    assert by_pid[orphan.pid].status == "orphan" and by_pid[orphan.pid].note == NOT_IN_RUN
    assert "python" in by_pid[orphan.pid].command and by_pid[orphan.pid].user
    assert by_pid[reuser.pid].status == "reused" and NOT_IN_RUN in by_pid[reuser.pid].note
    assert view.notes == ()
    assert gpu_memory_by_pid(snap)[rank0.pid] == 30 * GIB


def test_container_host_pids_are_said_not_guessed(procs, runs_root):
    live = sleeper(procs)
    ghost = 4_000_000  # above pid_max: cannot exist in this namespace
    snap = FakeProvider.from_dict(fake([(ghost, GIB), (live.pid, GIB)])).snapshot()
    view = attribute(snap, records_for_attribution(runs_root))
    by_pid = {p.pid: p for p in view.processes}
    assert by_pid[ghost].status == "unknown" and "pid namespace" in by_pid[ghost].note
    assert view.notes == (CONTAINER_NOTE,)


def test_cli_with_fake_gpu_shows_ranks_and_orphans_and_status_shows_memory(procs, runs_root, tmp_path):
    rank0, orphan = sleeper(procs), sleeper(procs)
    run = RunDir.create(runs_root, "train")
    write_record(run, rank0.pid, rank=0)
    fake_file = tmp_path / "gpu.json"
    fake_file.write_text(json.dumps(fake([(rank0.pid, 30 * GIB), (orphan.pid, 2 * GIB)], devices=2)))
    env = {"UPS_FAKE_GPU": str(fake_file), "COLUMNS": "200"}
    res = run_ups("gpu", env=env)
    assert res.returncode == 0, res.stderr
    assert f"{run.run_id} rank 0" in res.stdout and NOT_IN_RUN in res.stdout and "80.0 GiB" in res.stdout
    data = json.loads(run_ups("gpu", "--json", env=env).stdout)
    assert {p["status"] for p in data["processes"]} == {"run", "orphan"} and len(data["devices"]) == 2
    status = json.loads(run_ups("status", run.run_id, "--json", env=env).stdout)
    assert status["processes"][0]["gpu"]["nvml_used"] == 30 * GIB


def test_bad_fake_file_is_a_reason_not_a_crash(tmp_path):
    bad = tmp_path / "gpu.json"
    bad.write_text("{nope")
    res = run_ups("gpu", "--json", env={"UPS_FAKE_GPU": str(bad)})
    assert res.returncode == 1 and "unreadable fake GPU file" in json.loads(res.stdout)["reason"]
