"""`ups kill` ends the whole job, whether its records name every process or not.

Seen in CI: a run killed a second after its launch (the job had not yet written its first
record) and a run killed while its DataLoader was starting fresh workers (their records not
yet written) left the job, or those workers, running for ten minutes after the suite ended:
`ups kill --force` SIGKILLed the launcher (the job's subreaper) and every process a record
named, and the rest were orphaned to init. Records are the job's word; the kernel's session
and parentage are what say which processes are the job's, so they decide what a kill ends.

The programs are what people run: a script that starts a helper (a `sleep` standing in for a
metrics logger or a `nvidia-smi` loop) and a Python child, both unknown to ups.
"""

from __future__ import annotations

import json
import os
import signal
import textwrap
from pathlib import Path

import pytest
from helpers import job_processes, run_ups, wait_for

from ups.runs.rundir import FINAL_RUN_STATES, RunDir
from ups.status.procs import is_zombie, process_start_time

PROGRAM = textwrap.dedent(
    """
    import subprocess, sys, time
    helpers = [subprocess.Popen(["sleep", "300"]),
               subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])]
    print("ready", *[p.pid for p in helpers], flush=True)
    time.sleep(300)
    """
)


def job_pids(run: RunDir) -> list[int]:
    return [int(line.split()[0]) for line in job_processes(run)]


def launch(tmp_path: Path, env: dict[str, str] | None = None) -> tuple[RunDir, list[int]]:
    prog = tmp_path / "train.py"
    prog.write_text(PROGRAM)
    res = run_ups("launch", "python", "--detach", "--json", str(prog), cwd=tmp_path, env=env)
    assert res.returncode == 0, res.stderr
    run = RunDir(json.loads(res.stdout)["run_dir"])
    line = wait_for(lambda: next((ln for ln in _log(run).splitlines() if ln.startswith("ready")), None), 60,
                    interval=0.2, message="the program and its helpers started")
    return run, [int(p) for p in line.split()[1:]]


def _log(run: RunDir) -> str:
    try:
        return run.log_path("job").read_text()
    except FileNotFoundError:
        return ""


def assert_all_gone(run: RunDir, unrecorded: list[int]) -> None:
    left = wait_for(lambda: not job_pids(run) or None, 15, interval=0.2,
                    message="every process of the job gone")
    assert left
    signals = [e for e in run.read_events() if e["event"] == "signal"]
    for pid in unrecorded:  # each one ended by the kill, with the kernel's word for it, not a record's
        (event,) = [e for e in signals if e["pid"] == pid]
        assert "no record names it" in event["reason"] and event["proof"].startswith(("in the job's session", "a descendant")), event
    assert run.read_manifest()["state"] in FINAL_RUN_STATES


def test_force_kill_of_a_job_that_wrote_no_record_ends_all_of_it(runs_root, tmp_path):
    """UPS_INSTRUMENT=0: nothing of the job ever writes a record, as in the first second of
    any launch. `ups kill --force` must not kill the launcher and orphan the job."""
    run, helpers = launch(tmp_path, env={"UPS_INSTRUMENT": "0"})
    assert not list(run.status_dir.glob("rank-*.json"))
    alive = job_pids(run)
    assert set(helpers) <= set(alive) and len(alive) >= 3, alive  # the program and its two helpers

    res = run_ups("kill", str(run.path), "--force")
    assert res.returncode == 0, res.stderr
    assert_all_gone(run, helpers)
    assert run.read_manifest()["state"] == "killed"


def test_kill_after_the_launcher_died_ends_the_helpers_no_record_names(runs_root, tmp_path):
    """The launcher was SIGKILLed (an OOM killer, a careless pkill): the program runs on,
    unsupervised, with helpers ups never recorded. A plain `ups kill` ends them all."""
    run, helpers = launch(tmp_path)
    wait_for(lambda: (run.status_dir / "rank-0.json").exists(), 30, interval=0.2, message="the program's record")
    launcher = run.read_manifest()["launcher"]["pid"]
    os.kill(launcher, signal.SIGKILL)
    # Gone, or a zombie that nobody has reaped yet (a container's init, a subreaper): dead either way.
    wait_for(lambda: process_start_time(launcher) is None or is_zombie(launcher) or None, 10, interval=0.1,
             message="the launcher gone")
    assert set(helpers) <= set(job_pids(run))  # orphaned, still running

    res = run_ups("kill", str(run.path))
    assert res.returncode == 0, res.stderr
    assert "rank-0" in res.stdout and all(f"pid {p}" in res.stdout for p in helpers), res.stdout
    assert_all_gone(run, helpers[:1])  # `sleep` writes no record; the Python helper has its own


DDP_HANG = textwrap.dedent(
    """
    import time
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    print(f"rank {rank} ready", flush=True)
    if rank == 1:
        time.sleep(300)  # a rank stuck in its own code
    dist.all_reduce(torch.ones(1))  # rank 0 waits for it here
    dist.destroy_process_group()
    """
)


@pytest.mark.parametrize("force", [True, False], ids=["force", "plain"])
@pytest.mark.slow
def test_kill_of_a_hung_torchrun_job_ends_every_rank(runs_root, tmp_path, force):
    """torchrun starts each rank in a session of its own. A forced kill that SIGKILLed the
    agent before proving the ranks found them re-parented to init, no longer provably the
    job's, refused them and left both ranks hung for good (the sharded drills leaked 2 to 4
    ranks each, for the rest of the suite). Every process is proven before the first signal."""
    prog = tmp_path / "hang.py"
    prog.write_text(DDP_HANG)
    res = run_ups("launch", "torchrun", "--detach", "--json", "--standalone", "--nproc-per-node", "2", str(prog),
                  cwd=tmp_path, timeout=120)
    assert res.returncode == 0, res.stderr
    run = RunDir(json.loads(res.stdout)["run_dir"])
    wait_for(lambda: _log(run).count(" ready") >= 2, 90, interval=0.2, message="both ranks ready")
    ranks = wait_for(lambda: len(list(run.status_dir.glob("rank-*.json"))) >= 2 or None, 30, interval=0.2,
                     message="both ranks' records")
    assert ranks

    res = run_ups("kill", str(run.path), *(["--force"] if force else []), timeout=90)
    assert "refused" not in res.stdout, res.stdout
    assert res.returncode == 0, (res.stdout, res.stderr)
    wait_for(lambda: not job_pids(run) or None, 20, interval=0.2,
             message=f"every process of the job gone (left: {job_processes(run)})")
    assert run.read_manifest()["state"] == "killed"
