"""Health of real processes: blocked in a GIL-holding C call, sleeping, killed, pid reused."""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
import time

import pytest
from helpers import record_job, run_ups, wait_for

from ups.runs.rundir import RunDir
from ups.runs.view import load_run_view
from ups.status.record import StatusRecord

# Short thresholds so each case resolves in seconds (the defaults are 10 s / 60 s).
FAST = {"unresponsive_after": 2.0, "stalled_after": 1.5, "startup_grace": 0.0, "heartbeat_interval": 0.2}

JOB = textwrap.dedent(
    """
    import os, sys, time
    from ups.status import Reporter
    mode, arg = sys.argv[1], sys.argv[2]
    with Reporter(os.environ["UPS_RUN_DIR"], rank=0, world_size=1, interval=0.2) as rep:
        rep.advance()
        if mode == "fifo":
            rep.phase("data.open")
            import h5py
            h5py.File(arg, "r")          # blocks in open() holding the GIL
        elif mode == "sleep":
            rep.phase("train")
            time.sleep(3600)             # Python sleep: heartbeat thread keeps writing
    """
)


def start_job(procs, runs_root, mode: str, arg: str = "-") -> tuple[RunDir, object]:
    run = RunDir.create(runs_root, "test", extra={"thresholds": FAST})
    env = dict(os.environ, UPS_RUN_DIR=str(run.path))
    proc = procs.popen([sys.executable, "-c", JOB, mode, arg], env=env)
    record_job(run, proc)
    wait_for(lambda: (run.status_dir / "rank-0.json").exists(), 30, message="first record")
    return run, proc


def health(run: RunDir, name: str = "rank-0") -> str:
    view = load_run_view(run)
    p = view.process(name)
    return "" if p is None else p.verdict.health.value


def test_blocked_in_h5py_open_on_fifo_is_unresponsive_and_stacks_name_the_call(procs, runs_root, tmp_path):
    fifo = tmp_path / "shard.h5"
    os.mkfifo(fifo)
    run, proc = start_job(procs, runs_root, "fifo", str(fifo))
    wait_for(lambda: health(run) == "unresponsive", 20, message="unresponsive verdict")
    view = load_run_view(run)
    assert "no heartbeat" in view.process("rank-0").verdict.reason
    assert view.process("rank-0").record.phase == "data.open"

    res = run_ups("status", str(run.path), "--json")
    assert res.returncode == 0, res.stderr
    row = json.loads(res.stdout)["processes"][0]
    assert row["health"] == "unresponsive" and row["heartbeat_age"] > 2

    res = run_ups("stacks", str(run.path))
    assert res.returncode == 0, res.stderr
    assert "h5py/_hl/files.py" in res.stdout and "make_fid" in res.stdout
    assert proc.poll() is None  # the dump did not kill it


def test_python_sleep_with_live_heartbeat_is_stalled(procs, runs_root):
    run, _ = start_job(procs, runs_root, "sleep")
    wait_for(lambda: health(run) == "stalled", 20, message="stalled verdict")
    assert "no progress for" in load_run_view(run).process("rank-0").verdict.reason
    res = run_ups("stacks", str(run.path))
    assert "time.sleep" in res.stdout or "<string>" in res.stdout


def test_sigkilled_process_is_dead(procs, runs_root):
    run, proc = start_job(procs, runs_root, "sleep")
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    assert health(run) == "dead"
    assert "is gone" in load_run_view(run).process("rank-0").verdict.reason


def test_reused_pid_is_dead_and_kill_refuses_it(procs, runs_root):
    """A record naming a live pid with another start time: a stranger, never signalled."""
    run, proc = start_job(procs, runs_root, "sleep")
    path = run.status_dir / "rank-0.json"
    job_start = StatusRecord.from_json(path.read_text()).pid_start
    wait_for(lambda: time.time() > job_start + 0.1, 5, message="a later start time for the stranger")
    stranger = procs.python("import time; time.sleep(60)")
    wait_for(lambda: os.path.exists(f"/proc/{stranger.pid}"), 5, message="stranger up")
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    # Rewrite the dead job's record to name the stranger's pid with the job's start time:
    # exactly what pid reuse looks like.
    rec = StatusRecord.from_json(path.read_text())
    path.write_text(rec.with_changes(pid=stranger.pid).to_json())

    view = load_run_view(run)
    assert view.process("rank-0").verdict.health.value == "dead"
    assert "reused" in view.process("rank-0").verdict.reason

    res = run_ups("kill", str(run.path), "--rank", "0")
    assert res.returncode == 2
    assert "refusing" in res.stderr and "Traceback" not in res.stderr
    assert stranger.poll() is None  # still alive
    events = [e["event"] for e in run.read_events()]
    assert "signal" not in events


@pytest.mark.parametrize("force", [False, True])
def test_kill_rank_terminates_and_logs_the_action(procs, runs_root, force):
    run, proc = start_job(procs, runs_root, "sleep")
    args = ["kill", str(run.path), "--rank", "0", "--reason", "drill"] + (["--force"] if force else [])
    res = run_ups(*args)
    assert res.returncode == 0, res.stderr
    assert proc.wait(timeout=10) == (-signal.SIGKILL if force else -signal.SIGTERM)
    sig_events = [e for e in run.read_events() if e["event"] == "signal"]
    assert sig_events and sig_events[0]["reason"] == "drill" and sig_events[0]["actor"].startswith("cli:")
    assert sig_events[0]["signal"] == ("SIGKILL" if force else "SIGTERM")


def test_kill_never_signals_its_own_process_or_an_ancestor(runs_root):
    """A record naming the very process that runs `ups kill` (or its parent) is refused."""
    from ups.status.reporter import Reporter

    run = RunDir.create(runs_root, "test")
    with Reporter(run.path, rank=0, interval=0.2):  # this test process's own record
        res = run_ups("kill", str(run.path), "--rank", "0", "--force")
    assert res.returncode == 2 and "refusing to signal it" in res.stderr and "Traceback" not in res.stderr
