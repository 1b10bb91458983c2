"""Run directories, the supervisor's verdicts, and the CLI's handling of bad input."""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time

import psutil
import pytest
from helpers import run_ups, wait_for

from ups.errors import CorruptRun, RunNotFound, UpsError
from ups.launch.spawn import launch_run
from ups.runs.rundir import RunDir, list_runs, resolve_run

FINAL = ("succeeded", "partial", "failed", "killed")


def test_create_writes_layout_and_manifest(runs_root):
    run = RunDir.create(runs_root, "precompute", argv=["ups", "launch"], config={"a": 1})
    assert run.run_id.split("-")[2] == "precompute"
    for sub in ("status", "stacks", "logs", "control"):
        assert (run.path / sub).is_dir()
    m = run.read_manifest()
    assert m["state"] == "launching" and m["config"] == {"a": 1} and m["kind"] == "precompute"
    run.set_state("running")
    run.update_manifest(ranks={"0": {"exit_code": 0}})
    m = run.read_manifest()
    assert m["state"] == "running" and m["ranks"]["0"]["exit_code"] == 0
    with pytest.raises(ValueError):
        run.set_state("exploded")


def test_events_and_control_requests(runs_root):
    run = RunDir.create(runs_root, "precompute")
    run.append_event("kill", actor="cli:alice", target="rank-0", reason="hung")
    path = run.put_control("fallback", actor="console")
    pending = run.pending_controls()
    assert [(p, body["request"]) for p, body in pending] == [(path, "fallback")]
    run.ack_control(path, actor="job", result="switched to num_workers=0")
    assert run.pending_controls() == []
    with open(run.events_path, "a") as fh:
        fh.write("{torn\n")
    events = run.read_events()
    assert [e["event"] for e in events] == ["kill", "control", "control.handled", "unreadable"]
    assert events[0]["actor"] == "cli:alice" and events[0]["reason"] == "hung"


def test_listing_and_resolution(runs_root):
    a = RunDir.create(runs_root, "precompute")
    time.sleep(0.01)
    b = RunDir.create(runs_root, "train")
    broken = runs_root / "20990101-000000-train-dead"
    (broken / "status").mkdir(parents=True)
    (broken / "run.json").write_text("{not json")
    os.utime(broken, (1, 1))  # an unreadable run sorts by its folder's time
    runs = list_runs(runs_root)
    assert [r.run_id for r in runs] == [b.run_id, a.run_id, broken.name]  # newest first
    assert "not valid JSON" in runs[2].problem
    assert resolve_run(runs_root, None) == b
    assert resolve_run(runs_root, a.run_id) == a
    assert resolve_run(runs_root, str(a.path)) == a
    with pytest.raises(RunNotFound, match="no run 'nope'"):
        resolve_run(runs_root, "nope")
    with pytest.raises(RunNotFound, match="ambiguous"):
        resolve_run(runs_root, "20")
    with pytest.raises(CorruptRun):
        RunDir(broken).read_manifest()
    with pytest.raises(UpsError, match="does not exist"):
        list_runs(runs_root / "missing")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["status", "no-such-run"], "no run 'no-such-run'"),
        (["kill", "no-such-run"], "no run 'no-such-run'"),
        (["stacks", "no-such-run"], "no run 'no-such-run'"),
        (["logs", "no-such-run"], "no run 'no-such-run'"),
        (["status", "--runs-dir", "/nonexistent/runs"], "does not exist"),
        (["runs", "--runs-dir", "/nonexistent/runs"], "does not exist"),
    ],
)
def test_bad_input_is_one_line_exit_2(runs_root, args, message):
    RunDir.create(runs_root, "test")
    res = run_ups(*args)
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert message in res.stderr
    assert "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_corrupt_manifest_is_listed_but_status_refuses(runs_root):
    run = RunDir.create(runs_root, "test")
    run.manifest_path.write_text("")
    res = run_ups("runs", "--json")
    assert res.returncode == 0
    row = json.loads(res.stdout)["runs"][0]
    assert "empty run.json" in row["problem"]
    res = run_ups("status", run.run_id)
    assert res.returncode == 2 and "empty run.json" in res.stderr and "Traceback" not in res.stderr


def test_rank_that_does_not_exist_is_named(runs_root):
    run = RunDir.create(runs_root, "test")
    res = run_ups("kill", run.run_id, "--rank", "7")
    assert res.returncode == 2 and "has no rank 7" in res.stderr


# ------------------------------------------------------------------------ supervisor
JOB = textwrap.dedent(
    """
    import os, sys, time
    from ups.status import Reporter
    mode = sys.argv[1]
    with Reporter.from_env(total=5, unit="steps", interval=0.1) as rep:
        rep.phase("train")
        for i in range(5):
            rep.advance(); time.sleep(0.02)
            if mode == "os_exit" and i == 2:
                print("Training pipeline completed", flush=True)
                os._exit(0)            # the silent success the seeds had
            if mode == "raise" and i == 2:
                raise RuntimeError("loss is NaN")
        if mode == "hang":
            time.sleep(3600)
    """
)


def launch(runs_root, mode: str) -> RunDir:
    return launch_run(runs_root, "test", [sys.executable, "-c", JOB, mode], argv=["test", mode])


def wait_final(run: RunDir, timeout: float = 30) -> dict:
    return wait_for(
        lambda: (m := run.read_manifest())["state"] in FINAL and m, timeout, message=f"{run.run_id} to end"
    )


def test_success_needs_exit_0_and_done_records(runs_root):
    m = wait_final(launch(runs_root, "ok"))
    assert m["state"] == "succeeded" and m["exit_code"] == 0


def test_silent_os_exit_0_is_a_failure(runs_root):
    run = launch(runs_root, "os_exit")
    m = wait_final(run)
    assert m["state"] == "failed"
    assert "exited 0 but rank 0's last record says running in phase train" in m["summary"]
    assert "Training pipeline completed" in run.log_path("job").read_text()


def test_exception_names_the_failing_process(runs_root):
    m = wait_final(launch(runs_root, "raise"))
    assert m["state"] == "failed" and m["exit_code"] == 1
    assert m["failure"]["name"] == "rank-0" and "loss is NaN" in m["failure"]["error"]


def test_kill_run_stops_everything_and_marks_killed(runs_root):
    run = launch(runs_root, "hang")
    wait_for(lambda: (run.status_dir / "rank-0.json").exists() and (run.status_dir / "launcher.json").exists(), 30, message="records")
    pids = [json.loads(p.read_text())["pid"] for p in run.status_dir.glob("*.json")]
    res = run_ups("kill", run.run_id, "--grace", "2")
    assert res.returncode == 0, res.stderr
    m = wait_final(run)
    assert m["state"] == "killed"
    wait_for(lambda: not any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in pids), 10, message="no process left")
    assert any(e["event"] == "kill" for e in run.read_events())
    res = run_ups("runs", "--json")
    assert json.loads(res.stdout)["runs"][0]["state"] == "killed"


def test_status_json_schema(runs_root):
    run = launch(runs_root, "ok")
    wait_final(run)
    res = run_ups("status", "--json")  # newest run by default
    assert res.returncode == 0
    data = json.loads(res.stdout)
    assert data["run"]["id"] == run.run_id
    keys = {"role", "rank", "worker", "pid", "phase", "step", "total", "rate", "heartbeat_age", "progress_age", "gpu", "health", "reason"}
    assert data["processes"] and all(keys <= set(p) for p in data["processes"])
    assert {p["role"] for p in data["processes"]} == {"launcher", "rank"}


def test_logs_prints_the_job_log(runs_root):
    run = launch(runs_root, "os_exit")
    wait_final(run)
    res = run_ups("logs", run.run_id)
    assert res.returncode == 0 and "Training pipeline completed" in res.stdout
    assert os.path.exists(run.log_path("launcher"))


def test_default_runs_folder_may_not_exist_yet(tmp_path, monkeypatch):
    monkeypatch.delenv("UPS_RUNS_DIR", raising=False)
    res = run_ups("runs", cwd=tmp_path)
    assert res.returncode == 0 and "no runs under runs" in res.stderr
