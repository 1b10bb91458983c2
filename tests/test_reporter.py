"""Reporter: what a job's record says, in real processes, and that reporting never kills a job."""

from __future__ import annotations

import errno
import io
import json
import shutil
import subprocess
import sys
import textwrap
import time

import pytest
from helpers import wait_for

from ups.runs.rundir import RunDir
from ups.status import heartbeat as heartbeat_mod  # the writer of the Reporter's record
from ups.status.reader import read_status_dir
from ups.status.reporter import Reporter


def _read(run: RunDir, name: str = "rank-0") -> dict:
    return json.loads((run.status_dir / f"{name}.json").read_text())


@pytest.mark.notorch
def test_record_tracks_phase_progress_and_final_state(runs_root):
    run = RunDir.create(runs_root, "test")
    with Reporter(run.path, rank=0, world_size=1, total=10, unit="samples", interval=0.05) as rep:
        assert _read(run)["phase"] == "start"
        rep.phase("encode")
        assert _read(run)["phase"] == "encode"  # phase changes are written at once
        rep.advance(3)
        rep.item("a.h5#2")
        rep.metrics(loss=0.25)
        wait_for(lambda: _read(run)["step"] == 3, 5, message="heartbeat write of the step")
        rec = _read(run)
        assert rec["item"] == "a.h5#2" and rec["metrics"] == {"loss": 0.25}
        assert rec["total"] == 10 and rec["unit"] == "samples"
        assert rec["stack_signal"] is not None and rec["stack_file"] == "stacks/rank-0.txt"
    final = _read(run)
    assert final["state"] == "done" and final["exit_code"] == 0


@pytest.mark.notorch
def test_a_failed_record_carries_the_metrics_of_its_last_steps(runs_root):
    """fail() may be a process's last write (its launcher kills it after a peer failed): what
    its samplers hold now is in it, whether or not a heartbeat sampled since."""
    run = RunDir.create(runs_root, "test")
    rep = Reporter(run.path, rank=0, interval=3600).start()  # no heartbeat tick in this test
    try:
        rep.add_sampler(lambda: {"loss": 0.5, "logged": {"train_loss": 0.5}})
        rep.fail(RuntimeError("peer gone"), exit_code=1)
        assert _read(run)["metrics"] == {"loss": 0.5, "logged": {"train_loss": 0.5}}
    finally:
        rep.close()


@pytest.mark.notorch
def test_exception_marks_record_failed_with_text(runs_root):
    run = RunDir.create(runs_root, "test")
    try:
        with Reporter(run.path, rank=0, interval=0.05):
            raise ValueError("shard 3 has no key 'data'")
    except ValueError:
        pass
    rec = _read(run)
    assert rec["state"] == "failed"
    assert rec["error"].startswith("ValueError: shard 3 has no key 'data'")
    assert "test_reporter.py" in rec["error"]


@pytest.mark.notorch
def test_heartbeats_continue_while_main_thread_sleeps(runs_root):
    run = RunDir.create(runs_root, "test")
    with Reporter(run.path, rank=0, interval=0.05):
        first = _read(run)["heartbeat_at"]
        wait_for(lambda: _read(run)["heartbeat_at"] > first + 0.1, 5, message="heartbeats")
        assert _read(run)["progress_at"] <= first + 0.01


@pytest.mark.notorch
def test_vanished_run_dir_warns_once_and_job_goes_on(tmp_path):
    """A real job whose run folder is deleted under it keeps running and finishes."""
    run = RunDir.create(tmp_path / "runs", "test")
    script = textwrap.dedent(
        f"""
        import sys, time, os
        from ups.status import Reporter
        with Reporter({str(run.path)!r}, rank=0, interval=0.05) as rep:
            print("started", flush=True)
            sys.stdin.readline()   # the test deletes the run dir meanwhile
            for _ in range(10):
                rep.advance(); rep.phase("step"); time.sleep(0.02)
        print("finished", flush=True)
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )
    assert proc.stdout.readline().strip() == "started"
    shutil.rmtree(run.path)
    out, err = proc.communicate("go\n", timeout=30)
    assert proc.returncode == 0, err
    assert "finished" in out
    warnings = [line for line in err.splitlines() if "cannot write status record" in line]
    assert len(warnings) == 1, err
    assert not run.path.exists()  # the reporter never resurrects a deleted run


@pytest.mark.notorch
def test_disk_full_is_survived_and_retried(runs_root, monkeypatch):
    run = RunDir.create(runs_root, "test")
    stderr = io.StringIO()
    real_write = heartbeat_mod.write_atomic
    full = {"on": False}

    def write(path, data):
        if full["on"]:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_write(path, data)

    monkeypatch.setattr(heartbeat_mod, "write_atomic", write)
    with Reporter(run.path, rank=0, interval=0.05, stderr=stderr) as rep:
        full["on"] = True
        rep.phase("encode")
        rep.advance(5)
        time.sleep(0.3)  # several heartbeat ticks while the disk is full
        assert _read(run)["phase"] == "start"  # old record intact, no torn file
        full["on"] = False
        wait_for(lambda: _read(run)["step"] == 5, 5, message="write after the disk has room again")
    assert stderr.getvalue().count("No space left on device") == 1
    assert "being written again" in stderr.getvalue()
    assert not list(run.status_dir.glob(".*tmp"))


@pytest.mark.notorch
def test_from_env_reads_torchrun_variables(runs_root, monkeypatch):
    run = RunDir.create(runs_root, "test")
    monkeypatch.setenv("UPS_RUN_DIR", str(run.path))
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    with Reporter.from_env(interval=0.05):
        pass
    with Reporter.from_env(worker=2, interval=0.05):
        pass
    recs = {r.name: r for r in read_status_dir(run.status_dir).records}
    assert (recs["rank-3"].rank, recs["rank-3"].local_rank, recs["rank-3"].world_size) == (3, 1, 4)
    assert recs["rank-3-worker-2"].role == "worker" and recs["rank-3-worker-2"].worker == 2
    monkeypatch.delenv("UPS_RUN_DIR")
    null = Reporter.from_env()
    with null as rep:  # outside ups: same API, no files
        rep.advance()
        rep.phase("x")
        rep.metrics(a=1)


WRITER = textwrap.dedent(
    """
    import os, sys, time
    from ups.status import Reporter
    rep = Reporter(sys.argv[1], rank=int(sys.argv[2]), interval=3600)
    end = time.time() + 120
    while time.time() < end and not os.path.exists(sys.argv[3]):
        rep.advance(); rep.metrics(x="y" * (rep.step % 500)); rep.flush()
        time.sleep(0.002)  # thousands of writes a second in all, and the box keeps a core for the reader
    """
)


@pytest.mark.slow
def test_sixteen_writers_never_show_a_torn_record(runs_root, procs, tmp_path):
    run = RunDir.create(runs_root, "test")
    stop = tmp_path / "stop"
    writers = [
        procs.popen([sys.executable, "-c", WRITER, str(run.path), str(rank), str(stop)]) for rank in range(16)
    ]
    wait_for(lambda: len(list(run.status_dir.glob("*.json"))) == 16, 60, message="16 writers started")
    reads = 0
    end = time.monotonic() + 60
    while reads < 1000 and time.monotonic() < end:  # every read while all 16 write
        snap = read_status_dir(run.status_dir)
        assert snap.problems == (), snap.problems
        assert len(snap.records) == 16
        reads += 1
    stop.touch()
    for w in writers:
        assert w.wait(timeout=30) == 0
    assert reads == 1000, f"only {reads} reads in 60 s"


@pytest.mark.notorch
def test_a_metric_sampler_that_fails_one_tick_goes_on_and_one_that_keeps_failing_says_why(tmp_path):
    """A value read while the training thread changed it fails one tick: the next ticks still
    bring the loss (it was dropped for the process's life, and a Lightning rank's record then
    never showed a loss). Three failures in a row stop it, and the record says why."""
    from ups.status.samplers import METRIC_ERRORS_KEPT, Samplers

    ticks = iter([RuntimeError("deque mutated during iteration"), {"loss": 0.5}, {"loss": 0.25}])

    def flaky():
        t = next(ticks)
        if isinstance(t, Exception):
            raise t
        return dict(t)
    s = Samplers(str(tmp_path), None, history=False)
    s.metric_samplers.append(flaky)
    metrics: dict = {}
    s.sample_metrics(metrics)
    assert metrics == {"metrics_error": "RuntimeError: deque mutated during iteration"}
    s.sample_metrics(metrics)
    assert metrics == {"loss": 0.5} and s.metric_samplers == [flaky]

    def broken():
        raise KeyError("lr")
    s.metric_samplers = [broken]
    for _ in range(METRIC_ERRORS_KEPT):
        s.sample_metrics(metrics)
    assert s.metric_samplers == [] and metrics["metrics_error"] == "KeyError: 'lr'"
