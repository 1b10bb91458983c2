"""Jobs that a real SLURM started (slurmctld, slurmd and munged of the test's own: tests/slurm.py,
the ``slurm_cluster`` fixture), seen by ups: `sbatch` jobs whose tasks are gloo ranks
(tests/programs/slurm_train.py takes its rank from SLURM_PROCID, as SLURM-aware PyTorch scripts
do), found by `ups attach --scan` and attached from any task; a hang in one task; what the
scheduler does to a job (scancel, a time limit) named by `ups why` with the job id; `ups
launch srun` inside an allocation, and one `ups launch torchrun` per node through srun. Every test shares the one cluster (xdist group ``slurm``:
its node has 2 CPUs) and leaves it idle."""

from __future__ import annotations

import json
import shutil
import socket
import sys
import time
from pathlib import Path

import pytest
from helpers import run_ups, wait_for

from ups.runs.rundir import FINAL_RUN_STATES

PROGRAM = Path(__file__).parent / "programs" / "slurm_train.py"
HANG_LINE = next(n for n, line in enumerate(PROGRAM.read_text().splitlines(), 1) if "time.sleep(3600)" in line)
START_S = 120  # sbatch to the first steps: two `import torch` and gloo's rendezvous on a busy 2-core box

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("slurm"),
              pytest.mark.skipif(shutil.which("py-spy") is None, reason="py-spy is not installed (pip install 'ups[attach]')")]


@pytest.fixture
def cluster(slurm_cluster):
    yield slurm_cluster
    slurm_cluster.idle()  # the next test gets both CPUs


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def submit(cluster, folder: Path, *args: str, sbatch: tuple[str, ...] = (), ready: str = "step 2 ") -> tuple[int, Path]:
    """A 2-task batch job of slurm_train.py, from ``folder``; returns once its output holds ``ready``."""
    script = folder / "train.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH -n 2\n"
                      f"export MASTER_ADDR=127.0.0.1 MASTER_PORT={free_port()}\n"
                      f"srun {sys.executable} {PROGRAM} {' '.join(args)}\n")
    job = cluster.sbatch(script, *sbatch)
    out = folder / f"slurm-{job}.out"
    wait_for(lambda: ready in (out.read_text(errors="replace") if out.exists() else ""), START_S, interval=0.5,
             message=f"job {job}'s tasks to print {ready!r} ({cluster.job(job).get('JobState')})")
    return job, out


def ups_json(*args: str) -> dict:
    res = run_ups(*args, "--json")
    assert res.returncode in (0, 1), res.stderr
    return json.loads(res.stdout)


def manifest(runs_root: Path, run_id: str) -> dict:
    return json.loads((runs_root / run_id / "run.json").read_text())


def ended(runs_root: Path, run_id: str, timeout: float = 60) -> dict:
    return wait_for(lambda: (m := manifest(runs_root, run_id))["state"] in FINAL_RUN_STATES and m, timeout,
                    interval=0.5, message=f"attached run {run_id} to end")


def test_an_sbatch_job_is_scanned_and_attached_from_any_task_with_both_ranks_then_its_scancel_is_named(
        cluster, runs_root, tmp_path):
    job, out = submit(cluster, tmp_path)
    host = socket.gethostname().split(".")[0]

    found = [j for j in ups_json("attach", "--scan")["jobs"] if (j.get("slurm") or {}).get("job_id") == str(job)]
    assert len(found) == 1, ups_json("attach", "--scan")
    j = found[0]
    ranks = {p["rank"]: p for p in j["processes"] if p["role"] == "rank"}
    assert sorted(ranks) == [0, 1] and j["world_size"] == 2 and j["log"] == str(out)
    assert {p["rank_from"] for p in ranks.values()} == {"SLURM_PROCID"}
    assert j["slurm"]["step_id"] == "0" and j["slurm"]["user"] == "root" and j["slurm"]["node"] == host
    text = run_ups("attach", "--scan").stdout
    assert f"SLURM job {job} step 0 (user root, node {host})" in text and f"log {out}" in text, text

    for p in ranks.values():  # from either task: one job, both ranks
        dry = ups_json("attach", str(p["pid"]), "--dry-run")
        assert {q["rank"] for q in dry["processes"] if q["role"] == "rank"} == {0, 1} and dry["log"] == str(out)
        assert dry["top"] == ranks[0]["pid"] and sorted(dry["roots"]) == sorted(q["pid"] for q in ranks.values())

    attached = ups_json("attach", str(ranks[1]["pid"]))
    run_id = attached["run_id"]
    st = run_ups("status", run_id)
    assert st.returncode == 0 and f"SLURM job {job} step 0, user root, node {host}" in st.stdout, st.stdout
    snap = ups_json("status", run_id)
    assert snap["run"]["attached"]["slurm"]["job_id"] == str(job)
    assert {p["name"] for p in snap["processes"]} >= {"rank-0", "rank-1"}
    wait_for(lambda: "step" in (runs_root / run_id / "logs" / "job.log").read_text(errors="replace")
             if (runs_root / run_id / "logs" / "job.log").exists() else False, 30, message="the log copied")

    cluster.client("scancel", str(job))
    m = ended(runs_root, run_id)
    assert m["state"] == "failed" and f"SLURM job {job} on {host} cancelled" in m["summary"], m["summary"]
    why = run_ups("why", run_id)
    assert f"SLURM job {job}" in why.stdout and "by scancel" in why.stdout, why.stdout
    cluster.wait_state(job, ("CANCELLED",))
    log = run_ups("why", "--log", str(out))
    assert log.returncode == 1 and log.stdout.startswith("job_terminated:"), log.stdout
    assert f"SLURM job {job} on {host} cancelled at" in log.stdout and "by scancel" in log.stdout, log.stdout


def stuck(run_id: str) -> dict | None:
    """`ups why`'s verdict once it names a rank stuck while its peers wait."""
    verdict = ups_json("why", run_id)["verdict"]
    return verdict if verdict["mode"] == "rank_stuck_peers_wait" else None


@pytest.mark.timeout(300)
def test_a_hang_in_one_task_is_named_within_30_s_then_the_time_limit_with_the_job_id(cluster, runs_root, tmp_path):
    # A time limit is counted in minutes, and slurmctld looks at it every 30 s or so: this job
    # ends by it 60-90 s after it starts.
    t0 = time.monotonic()
    job, out = submit(cluster, tmp_path, "--hang-rank", "1", "--hang-at", "5", sbatch=("--time=1",),
                      ready="rank 1 waits at step 5")
    rank0 = next(p for p in ups_json("attach", "--scan")["jobs"] if (p.get("slurm") or {}).get("job_id") == str(job))
    run_id = ups_json("attach", str(rank0["top"]))["run_id"]
    attached_at = time.monotonic()

    v = wait_for(lambda: stuck(run_id), 30, interval=1.0, message="ups why to name rank 1's hang")
    assert time.monotonic() - attached_at <= 30
    assert v["who"]["rank"] == 1 and v["where"]["site"] == f"slurm_train.py:{HANG_LINE}", v
    assert v["where"]["function"] == "wait_for_the_answer"

    cluster.wait_state(job, ("TIMEOUT",), timeout=max(10.0, 150 - (time.monotonic() - t0)))
    m = ended(runs_root, run_id)
    assert m["state"] == "failed" and f"SLURM job {job}" in m["summary"] and "due to time limit" in m["summary"], m
    why = run_ups("why", run_id)
    assert f"SLURM job {job}" in why.stdout and "due to time limit" in why.stdout, why.stdout
    log = run_ups("why", "--log", str(out))
    assert log.stdout.startswith("job_terminated:") and f"SLURM job {job}" in log.stdout, log.stdout
    assert "DUE TO TIME LIMIT" in log.stdout and "due to time limit" in log.stdout


TASK = ("import os, sys, time\nprint(f\"task {os.environ['SLURM_PROCID']} of {os.environ['SLURM_NTASKS']}\\n\", end='')\n"
        "time.sleep(1)\nsys.exit(3 if os.environ['SLURM_PROCID'] == os.environ.get('FAIL_TASK') else 0)\n")


@pytest.mark.parametrize("fail_task", ["", "1"])
def test_ups_launch_srun_inside_an_sbatch_allocation_ends_with_the_right_state(cluster, runs_root, tmp_path, fail_task):
    (tmp_path / "task.py").write_text(TASK)
    script = tmp_path / "launch.sbatch"
    script.write_text(f"#!/bin/bash\n#SBATCH -n 2\nexport FAIL_TASK={fail_task}\n"
                      f"{sys.executable} -m ups launch srun --name slurmtask -n 2 {sys.executable} {tmp_path / 'task.py'}\n"
                      "echo \"ups launch exit $?\"\n")
    job = cluster.sbatch(script)
    info = cluster.wait_state(job, ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"), timeout=120)
    out = (tmp_path / f"slurm-{job}.out").read_text(errors="replace")
    assert info["JobState"] == "COMPLETED", out
    (run,) = [d for d in runs_root.iterdir() if (d / "run.json").exists()]
    m = json.loads((run / "run.json").read_text())
    assert (m["kind"], m["world_size"]) == ("srun", 2), m
    procs = ups_json("status", m["id"])["processes"]
    assert {(p["rank"], p["world_size"]) for p in procs if p["role"] == "rank"} == {(0, 2), (1, 2)}, procs
    if fail_task:
        assert m["state"] == "failed" and m["summary"].startswith("rank 1 failed"), m["summary"]
        assert "ups launch exit 1" in out, out
    else:
        assert m["state"] == "succeeded", m["summary"]
        assert "ups launch exit 0" in out, out


RANK_TASK = ("import os, time\nprint(f\"rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']} in job {os.environ['SLURM_JOB_ID']}\\n\", end='')\n"
             "time.sleep(1)\n")


def test_one_ups_launch_torchrun_per_node_through_srun_under_sbatch_succeeds(cluster, runs_root, tmp_path):
    """docs/frameworks.md's way for several nodes, on this one node: `srun --ntasks-per-node 1
    ups launch torchrun --run-id $SLURM_JOB_ID ...` in the batch script; torchrun stays the agent
    though SLURM_PROCID is set, and its 2 ranks are ranks by RANK."""
    (tmp_path / "task.py").write_text(RANK_TASK)
    script = tmp_path / "nodes.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH -N 1 -n 1 -c 2\n"
                      f"srun --ntasks-per-node 1 {sys.executable} -m ups launch torchrun --run-id job-$SLURM_JOB_ID "
                      f"--nnodes $SLURM_NNODES --node-rank $SLURM_NODEID --nproc-per-node 2 --rdzv-backend c10d "
                      f"--rdzv-endpoint 127.0.0.1:{free_port()} {tmp_path / 'task.py'}\n"
                      "echo \"ups launch exit $?\"\n")
    job = cluster.sbatch(script)
    info = cluster.wait_state(job, ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"), timeout=150)
    out = (tmp_path / f"slurm-{job}.out").read_text(errors="replace")
    assert info["JobState"] == "COMPLETED" and "ups launch exit 0" in out, out
    m = manifest(runs_root, f"job-{job}")
    assert m["state"] == "succeeded" and m["kind"] == "torchrun", m
    procs = ups_json("status", m["id"])["processes"]
    assert {p["rank"] for p in procs if p["role"] == "rank"} == {0, 1}, procs
    assert [p["role"] for p in procs].count("agent") == 1, procs


def sleeping_tasks(cluster, folder: Path, *sbatch: str) -> tuple[int, Path]:
    """A 2-task batch job of plain Python tasks that sleep (no torch); returns once both run."""
    script = folder / "sleep.sbatch"
    script.write_text(f"#!/bin/bash\n#SBATCH -n 2\nsrun {sys.executable} -c "
                      "'import time; print(\"up\", flush=True); time.sleep(100)'\n")
    job = cluster.sbatch(script, *sbatch)
    out = folder / f"slurm-{job}.out"
    wait_for(lambda: out.exists() and out.read_text().count("up") == 2, START_S, interval=0.3, message="both tasks up")
    return job, out


def test_a_signal_sent_with_scancel_signal_is_named_as_the_job_stopped_from_outside(cluster, tmp_path):
    """`scancel --signal=USR1` (what `sbatch --signal=USR1@T` sends before a time limit or a
    preemption): tasks with no handler die of it, and srun says only "User defined signal 1"."""
    job, out = sleeping_tasks(cluster, tmp_path)
    cluster.client("scancel", "--signal=USR1", str(job))
    cluster.wait_state(job, ("COMPLETED", "FAILED", "CANCELLED"))
    wait_for(lambda: "User defined signal 1" in out.read_text(), 10, message="srun's line")
    log = run_ups("why", "--log", str(out))
    assert log.returncode == 1 and log.stdout.startswith("job_terminated:"), log.stdout
    assert "User defined signal 1" in log.stdout


def test_a_requeue_ends_the_attached_step_and_is_named_with_the_job_id(cluster, runs_root, tmp_path):
    """`scontrol requeue`: SLURM ends the running step ("DUE TO JOB REQUEUE") and queues the job
    again. Plain tasks with no torch and no distributed environment: a SLURM task is a job to attach."""
    job, out = sleeping_tasks(cluster, tmp_path, "--open-mode=append")
    (found,) = [j for j in ups_json("attach", "--scan")["jobs"] if (j.get("slurm") or {}).get("job_id") == str(job)]
    attached = ups_json("attach", str(found["processes"][-1]["pid"]))
    assert attached["world_size"] == 2 and attached["log"] == str(out), attached
    cluster.client("scontrol", "requeue", str(job))
    m = ended(runs_root, attached["run_id"])
    assert m["state"] == "failed" and f"SLURM job {job} on " in m["summary"] and "due to job requeue" in m["summary"], m
    log = run_ups("why", "--log", str(out))
    assert f"SLURM job {job} on " in log.stdout and "due to job requeue" in log.stdout, log.stdout
