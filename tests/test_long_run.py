"""A run of days: ups's own cost stays flat, and the churn of DataLoader workers (made anew
every epoch) is not taken for deaths. Real torchrun ranks, real workers, a real SIGKILL; the
fast-forward replays real short-lived processes through the launcher's exit watcher."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import run_ups, status_now, wait_for

from ups.runs.rundir import RunDir

REPO = Path(__file__).resolve().parents[1]
CHURN = str(Path(__file__).parent / "programs" / "churn_train.py")


@pytest.mark.slow
def test_worker_churn_over_many_epochs_logs_no_death_but_a_killed_worker_is_logged_with_its_signal(runs_root, tmp_path):
    epochs = 22
    res = run_ups("launch", "torchrun", "--detach", "--json", "--nproc-per-node", "2", CHURN, "--epochs", str(epochs),
                  "--kill-worker-at", "8", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    run = RunDir(json.loads(res.stdout)["run_dir"])
    wait_for(lambda: status_now(run)["state"] in ("succeeded", "failed", "killed"), 240, interval=1.0,
             message="the run's end")
    assert status_now(run)["state"] == "succeeded"
    log = run.log_path("job").read_text()
    assert f"epoch {epochs} done" in log  # 2 ranks x 2 workers made anew 22 times
    killed = int(re.search(r"killing worker pid (\d+) in epoch 8", log).group(1))

    worker_ends = [e for e in run.read_events() if e["event"] == "process.exit" and e["role"] == "worker"]
    # ~88 worker ends, all healthy but one: only that one is in the log, with how it died
    assert [e["pid"] for e in worker_ends] == [killed], worker_ends
    (end,) = worker_ends
    assert end["clean"] is False and end["signal"] == "SIGKILL"
    assert end["record_state"] == "failed" and "SIGKILL" in end["error"]

    why = run_ups("why", str(run.path), "--json")
    assert why.returncode == 0, why.stderr


@pytest.mark.slow
def test_fast_forward_keeps_the_watchers_cost_per_generation_flat(tmp_path):
    """300 epochs' worker sets (1,200 real processes) through the exit watcher: it holds
    nothing of the ended ones, and its CPU per generation does not grow (generous margins:
    thread CPU time, not wall time, on a busy box; before the fix the last window cost ~5x the
    first at 200 generations)."""
    res = subprocess.run([sys.executable, str(REPO / "scripts" / "bench_soak.py"), "--generations", "300",
                          "--windows", "5"], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["processes"] == 1200
    assert out["held_last"] == 0 and out["held_max"] <= 4  # one epoch's workers, never the past ones
    assert out["exit_events"] == 0  # every one ended normally: nothing in the event log
    first, last = out["cpu_us_per_generation_first"], out["cpu_us_per_generation_last"]
    assert last < 2.5 * first + 1000, out["windows"]


SLOT_WORKER = """
import os, sys, time
from ups.status.files import write_atomic
from ups.status.host import hostname
from ups.status.procs import this_process_start
from ups.status.reader import read_record_file
from ups.status.record import StatusRecord

status, run_id, tell = sys.argv[1], sys.argv[2], sys.argv[3] == "tell"
path = os.path.join(status, "rank-0-worker-0.json")
metrics = {}
if tell and os.path.exists(path):  # as the DataLoader hook does: the slot's previous worker's final state
    before = read_record_file(path)
    metrics["previous"] = {"pid": before.pid, "pid_start": before.pid_start, "state": before.state,
                           "phase": before.phase, "step": before.step, "error": before.error, "exit_code": before.exit_code}

def write(state):
    now = time.time()
    write_atomic(path, StatusRecord(run_id=run_id, role="worker", name="rank-0-worker-0", pid=os.getpid(),
                                    pid_start=this_process_start(), host=hostname(), rank=0, worker=0,
                                    phase="fetch" if state == "running" else "done", state=state, step=4,
                                    unit="samples", started_at=now, heartbeat_at=now, progress_at=now, phase_at=now,
                                    exit_code=None if state == "running" else 0, metrics=metrics).to_json().encode())

write("running")
print("ready", flush=True)
if sys.stdin.readline().strip() == "killed":  # its rank's word on a worker killed by SIGKILL
    now = time.time()
    write_atomic(path, StatusRecord(run_id=run_id, role="worker", name="rank-0-worker-0", pid=os.getpid(),
                                    pid_start=this_process_start(), host=hostname(), rank=0, worker=0, phase="fetch",
                                    state="failed", step=1, unit="samples", started_at=now, heartbeat_at=now,
                                    progress_at=now, phase_at=now, exit_code=-9,
                                    error="DataLoader worker killed by SIGKILL").to_json().encode())
else:
    write("done")
"""


def _slot_worker(run: RunDir, tell: bool) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", SLOT_WORKER, str(run.status_dir), run.run_id, "tell" if tell else "-"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert p.stdout.readline().strip() == "ready"
    return p


@pytest.mark.parametrize("tell", [True, False])
def test_a_worker_slot_taken_before_the_launcher_read_the_end_still_tells_the_end(runs_root, tell):
    """A loaded box: the launcher reads worker A's end only after the next epoch's worker B
    took A's record file. B's record carries A's final state, so A's normal end stays normal.
    Without it (tell=False: what the launcher had before), the end reads as a death."""
    from ups.launch.exits import ExitWatcher

    run = RunDir.create(runs_root, "train")
    watcher = ExitWatcher(run, worker_word_s=0.5)
    a = _slot_worker(run, tell)
    watcher.scan()
    assert watcher.watching() == 1  # A, through its pidfd
    a.communicate("\n", timeout=30)  # A writes its final record and exits; the launcher has not looked yet
    b = _slot_worker(run, tell)  # ... and B takes the file
    try:
        wait_for(lambda: (watcher.tick(0), watcher.exits.get("rank-0-worker-0"))[1], 10, message="A's end noted")
        end = watcher.exits["rank-0-worker-0"]
        assert end.pid == a.pid
        logged = [e for e in run.read_events() if e["event"] == "process.exit"]
        if tell:
            assert end.clean and end.record_state == "done" and logged == []
        else:
            assert not end.clean and [e["pid"] for e in logged] == [a.pid]
    finally:
        b.communicate("\n", timeout=30)
        watcher.stop()
    assert watcher.watching() == 0


def test_a_worker_killed_between_two_scans_is_still_logged_with_its_signal(runs_root):
    """A loaded box: worker A started, was killed and replaced by B before the launcher's
    watcher ever scanned (it never watched A). B's record carries A's end, and that death is
    logged, with its signal; a normal end seen the same way logs nothing."""
    from ups.launch.exits import ExitWatcher

    run = RunDir.create(runs_root, "train")
    watcher = ExitWatcher(run, worker_word_s=0.5)
    a = _slot_worker(run, True)
    a.communicate("killed\n", timeout=30)  # A's final record, as its rank's DataLoader writes it
    b = _slot_worker(run, True)  # B takes the slot; the watcher looks only now
    try:
        watcher.scan()
        end = watcher.exits.get("rank-0-worker-0")
        assert end is not None and end.pid == a.pid and not end.clean and end.signal == "SIGKILL"
        logged = [e for e in run.read_events() if e["event"] == "process.exit"]
        assert [(e["pid"], e["signal"]) for e in logged] == [(a.pid, "SIGKILL")]
        assert watcher.watching() == 1  # B only
    finally:
        b.communicate("\n", timeout=30)
        watcher.stop()
    # B's normal end, and C's after it, seen through C's record: nothing more is logged
    c = _slot_worker(run, True)
    try:
        ExitWatcher(run, worker_word_s=0.5).scan()
    finally:
        c.communicate("\n", timeout=30)
    assert len([e for e in run.read_events() if e["event"] == "process.exit"]) == 1
