"""A full disk never kills the program or lies about it (issue 18, item 6).

The runs folder lives on a 2 MiB tmpfs that the test fills while a real program runs under
`ups launch python`: the program prints far more than fits, keeps running, exits 0 while the
disk is still full (its final record cannot be written), and the run ends `succeeded` once
space returns, saying what was dropped and that its records are incomplete.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import textwrap

import pytest
from helpers import run_ups, wait_for

from ups.runs.rundir import FINAL_RUN_STATES, RunDir
from ups.status.procs import process_start_time

PRINTER = textwrap.dedent(
    """
    import os, sys, time
    ctl = sys.argv[1]
    def wait(name):
        while not os.path.exists(os.path.join(ctl, name)):
            time.sleep(0.05)
    print("started", flush=True)
    wait("go")                                   # the disk is full now
    for i in range(40000):                       # ~2.4 MB: more than the whole disk
        print(f"step {i:06d} loss 0.{i:06d} " + "x" * 32)
    open(os.path.join(ctl, "printed"), "w").close()
    wait("exit")
    print("finished", flush=True)
    """
)


@pytest.fixture
def small_disk(tmp_path):
    mnt = tmp_path / "disk"
    mnt.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {res.stderr.strip()}")
    try:
        yield mnt
    finally:
        for run_dir in (mnt / "runs").glob("*"):
            run_ups("kill", str(run_dir), "--force", timeout=60)
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def fill(path) -> None:
    """Write until the disk says no."""
    with open(path, "wb", buffering=0) as fh:
        block = b"\0" * 65536
        while True:
            try:
                fh.write(block)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                break
        for size in (4096, 512, 1):
            try:
                while True:
                    fh.write(b"\0" * size)
            except OSError:
                pass


@pytest.mark.slow
def test_full_disk_drops_output_not_the_program_and_the_run_ends_true(small_disk, tmp_path):
    ctl = tmp_path / "ctl"
    ctl.mkdir()
    prog = tmp_path / "printer.py"
    prog.write_text(PRINTER)
    runs = small_disk / "runs"
    res = run_ups("launch", "python", "--detach", "--json", "--runs-dir", str(runs), "--unresponsive-after", "2",
                  str(prog), str(ctl), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    run = RunDir(json.loads(res.stdout)["run_dir"])
    wait_for(lambda: "started" in run.log_path("job").read_text(), 30, message="the program started")
    job = run.read_manifest()["job"]

    fill(small_disk / "filler")
    # A new launch on the full disk: one line, and no half-made run left behind.
    res = run_ups("launch", "python", "--detach", "--runs-dir", str(runs), str(prog), str(ctl), cwd=tmp_path)
    assert res.returncode == 2 and "No space left on device" in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert [p.name for p in runs.iterdir()] == [run.run_id]
    (ctl / "go").touch()
    wait_for(lambda: (ctl / "printed").exists(), 60, message="the program printed through a full disk")
    assert process_start_time(job["pid"]) is not None, "the program died of its log"

    # A reader on the full folder: the live rank's records are stale because of the disk.
    def disk_full_said():
        res = run_ups("status", str(run.path), "--json")
        assert "Traceback" not in res.stderr, res.stderr
        rows = json.loads(res.stdout)["processes"]
        return next((r for r in rows if r["name"] == "rank-0" and "disk full" in (r.get("reason") or "")), None)

    row = wait_for(disk_full_said, 30, interval=0.5, message="ups status to say disk full")
    assert "C call" not in row["reason"]
    res = run_ups("why", str(run.path))
    assert res.returncode == 1 and "disk is full" in res.stdout and "Traceback" not in res.stderr, (res.stdout, res.stderr)

    (ctl / "exit").touch()  # it exits 0 while the disk is still full: no room for its final record
    wait_for(lambda: process_start_time(job["pid"]) is None, 30, message="the program's end")
    launcher = run.read_manifest()["launcher"]["pid"]
    assert process_start_time(launcher) is not None, "the launcher died of the full disk"
    assert run.read_manifest()["state"] == "running"  # nothing could be written yet

    os.unlink(small_disk / "filler")  # space returns: the launcher records the truth
    m = wait_for(lambda: (m := run.read_manifest())["state"] in FINAL_RUN_STATES and m, 30, interval=0.2,
                 message="the run's end once space returned")
    assert m["state"] == "succeeded", m["summary"]
    assert "records are incomplete (disk full" in m["summary"]
    assert m["output_dropped"]["dropped"] > 100_000, m["output_dropped"]
    assert "could not be written to the log" in m["summary"]
    log = run.log_path("job").read_text()
    assert log.startswith("started\n") and "step 000000" in log and "bytes of the job's output were dropped" in log
    events = [e["event"] for e in run.read_events()]
    assert "log.dropped" in events and "exit" in events
    assert not [e for e in run.read_events() if e["event"] == "signal"]
    wait_for(lambda: process_start_time(launcher) is None, 30, message="the launcher's own end")


@pytest.mark.slow
def test_kill_on_a_full_disk_stops_the_job_without_a_traceback(small_disk, tmp_path):
    prog = tmp_path / "ticker.py"
    prog.write_text("import time\nfor i in range(1200):\n    print('tick', i, flush=True)\n    time.sleep(0.1)\n")
    res = run_ups("launch", "python", "--detach", "--json", "--runs-dir", str(small_disk / "runs"), str(prog), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    run = RunDir(json.loads(res.stdout)["run_dir"])
    wait_for(lambda: "tick 1" in run.log_path("job").read_text(), 30, message="the program started")
    job = run.read_manifest()["job"]
    fill(small_disk / "filler")
    res = run_ups("kill", str(run.path), "--grace", "2", timeout=60)
    assert res.returncode == 0 and "Traceback" not in res.stderr, (res.stdout, res.stderr)
    wait_for(lambda: process_start_time(job["pid"]) is None, 30, message="the job stopped")
    os.unlink(small_disk / "filler")
    res = run_ups("status", str(run.path), "--json")
    assert res.returncode == 0 and "Traceback" not in res.stderr
    assert json.loads(res.stdout)["state"] in FINAL_RUN_STATES


def test_job_output_outlives_a_dead_launcher(runs_root, tmp_path):
    """The relay is not the launcher: when the launcher dies (OOM killer, a bug), the job's
    next print must not meet a closed pipe (EPIPE would kill it); its output still reaches the log."""
    import signal

    prog = tmp_path / "ticker.py"
    prog.write_text("import time\nfor i in range(1200):\n    print('tick', i, flush=True)\n    time.sleep(0.05)\n")
    res = run_ups("launch", "python", "--detach", "--json", str(prog), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    run = RunDir(json.loads(res.stdout)["run_dir"])
    wait_for(lambda: "tick 1" in run.log_path("job").read_text(), 30, message="the program started")
    m = run.read_manifest()
    os.kill(m["launcher"]["pid"], signal.SIGKILL)
    wait_for(lambda: process_start_time(m["launcher"]["pid"]) is None, 10, message="the launcher gone")
    size = run.log_path("job").stat().st_size
    wait_for(lambda: run.log_path("job").stat().st_size > size + 200, 15, message="output after the launcher died")
    assert process_start_time(m["job"]["pid"]) is not None, "the job died with its launcher"
    os.kill(m["job"]["pid"], signal.SIGKILL)
