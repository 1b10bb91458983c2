"""Runs that stay truthful when ups itself is hit: the launcher killed, the box rebooted,
the wall clock stepped. Real supervisors, real torchrun ranks, real signals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import run_ups, status_now, wait_for

from ups.attach.find import stat_of
from ups.runs.rundir import MANIFEST_SCHEMA, RunDir
from ups.status.record import StatusRecord

PROGRAMS = Path(__file__).parent / "programs"
DDP = str(PROGRAMS / "ddp_train.py")
FAST = {"UPS_HEARTBEAT_INTERVAL": "0.3"}


def launched(res) -> RunDir:
    assert res.returncode == 0 and res.stdout.strip(), res.stderr
    return RunDir(json.loads(res.stdout)["run_dir"])


def status(run: RunDir) -> dict:
    res = run_ups("status", str(run.path), "--json")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def training(run: RunDir, min_step: int = 2) -> bool:
    procs = {p["name"]: p for p in status_now(run)["processes"]}
    return all(procs.get(f"rank-{r}", {}).get("step", 0) >= min_step for r in (0, 1))


def kill_launcher(run: RunDir) -> int:
    pid = run.read_manifest()["launcher"]["pid"]
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z", 10,
             message="the launcher gone")
    return pid


@pytest.mark.slow
def test_launcher_killed_mid_training_is_unsupervised_then_settled_from_the_records(runs_root, tmp_path):
    res = run_ups("launch", "torchrun", "--detach", "--json", "--nproc-per-node", "2", DDP, "--steps", "150",
                  "--workers", "0", "--step-time", "0.1", env=FAST, cwd=tmp_path)  # 15 s: the checks below need it running
    run = launched(res)
    wait_for(lambda: training(run), 90, interval=0.3, message="both ranks training")
    pid = kill_launcher(run)

    data = wait_for(lambda: (d := status(run))["state"] == "unsupervised" and d, 15, message="the run shown unsupervised")
    assert data["run"]["state"] == "running" and data["supervision"] == "unsupervised"
    launcher_row = next(p for p in data["processes"] if p["role"] == "launcher")
    assert launcher_row["health"] == "dead"
    listing = run_ups("runs")
    assert f"ups adopt {run.run_id}" in listing.stderr and "unsupervised" in listing.stdout

    # The ranks finish on their own; every reader shows the final state from the records, and
    # `ups runs --settle` writes it down (reading never writes).
    data = wait_for(lambda: (d := status_now(run))["run"]["state"] in ("succeeded", "failed", "lost") and d, 120,
                    interval=0.5, message="the run settled by a reader")
    assert data["run"]["state"] == "succeeded", data["run"]
    assert run.read_manifest()["state"] == "running" and not [e for e in run.read_events() if e["event"] == "reconcile"]
    res = run_ups("runs", "--settle")
    assert res.returncode == 0 and f"settled {run.run_id}: succeeded" in res.stderr, res.stderr
    m = run.read_manifest()
    assert m["state"] == "succeeded", m
    assert m["summary"].startswith(f"launcher lost (pid {pid} gone); 2 rank(s) done") and m["launcher_lost"] is True
    assert [e for e in run.read_events() if e["event"] == "reconcile" and e["state"] == "succeeded"]


@pytest.mark.slow
def test_adopt_gives_the_run_a_new_launcher_that_names_the_root_cause(runs_root, tmp_path, procs):
    """The adopter arrives late: rank 1 left with os._exit and rank 0 failed after it (its peer
    gone) before `ups adopt` started, while torchrun's agent (frozen here, as a loaded box can
    leave it) had not yet reaped them. The adopter never saw them end; their records and last
    heartbeats still tell the order."""
    res = run_ups("launch", "torchrun", "--detach", "--json", "--nproc-per-node", "2", DDP, "--steps", "200",
                  "--workers", "0", "--step-time", "0.1", "--fail", "exit", "--fail-step", "60", env=FAST, cwd=tmp_path)
    run = launched(res)
    wait_for(lambda: training(run), 90, interval=0.3, message="both ranks training")
    # Frozen as soon as the launcher is gone: rank 1 leaves ~6 s after training starts, and the
    # agent must not reap it first. Not before the agent has a new parent: a process group that
    # becomes orphaned (its launcher reaped) while a member is stopped gets SIGHUP from the
    # kernel, and torchrun ends on it.
    agent = next(p["pid"] for p in status_now(run)["processes"] if p["role"] == "agent")
    old = kill_launcher(run)
    wait_for(lambda: (st := stat_of(agent)) is not None and st[1] != old, 10, interval=0.05, message="the agent reparented")
    os.kill(agent, signal.SIGSTOP)
    try:
        wait_for(lambda: status(run)["state"] == "unsupervised", 15, message="unsupervised")
        wait_for(lambda: {p["name"]: p["health"] for p in status_now(run)["processes"]}.get("rank-0") == "failed"
                 and not _alive(run, "rank-1"), 60, interval=0.3, message="rank 1 gone, rank 0 failed after it")
        adopter = procs.popen([sys.executable, "-m", "ups", "adopt", str(run.path), "--json"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_for(lambda: any(e["event"] == "adopt" for e in run.read_events()), 30, message="the adopter watching")
    finally:
        os.kill(agent, signal.SIGCONT)
    out, err = adopter.communicate(timeout=120)
    assert adopter.returncode == 1, err  # followed to the end: the run failed
    m = run.read_manifest()
    assert m["launcher"]["adopted"] is True and m["launcher"]["pid"] != old
    assert m["previous_launchers"][-1]["pid"] == old
    assert m["state"] == "failed" and m["failure"]["rank"] == 1
    assert "rank 1 ended without a normal interpreter exit" in m["summary"]
    assert any(e["event"] == "adopt" for e in run.read_events())
    assert run_ups("adopt", str(run.path)).returncode == 1  # nothing left to adopt


def _alive(run: RunDir, name: str) -> bool:
    """The recorded process still runs (a zombie, exited but not reaped, does not)."""
    from ups.status.procs import process_start_time, same_start
    from ups.status.reader import read_record_file

    rec = read_record_file(run.status_dir / f"{name}.json")
    return same_start(process_start_time(rec.pid), rec.pid_start)


def test_adopt_refuses_a_supervised_run(runs_root, tmp_path):
    res = run_ups("launch", "python", "--detach", "--json", "-c", "import time; time.sleep(30)", cwd=tmp_path)
    run = launched(res)
    wait_for(lambda: status_now(run)["processes"], 20, message="records")
    res = run_ups("adopt", str(run.path))
    assert res.returncode == 1 and "is supervised by pid" in res.stderr and "Traceback" not in res.stderr


def write_run(root: Path, name: str, kind: str, ranks: list[dict], **manifest) -> RunDir:
    """A run as a rebooted box leaves it: launcher and every pid gone, records of another boot."""
    run = RunDir(root / name)
    for sub in ("status", "stacks", "logs", "control"):
        (run.path / sub).mkdir(parents=True)
    now = time.time()
    m = {"schema": MANIFEST_SCHEMA, "id": name, "kind": kind, "state": "running", "created_at": now - 600, "ended_at": None,
         "host": os.uname().nodename, "argv": [], "config": {}, "world_size": len(ranks),
         "launcher": {"pid": 4_190_001, "pid_start": 12.0}, **manifest}
    run.write_manifest(m)
    for i, extra in enumerate(ranks):
        rec = StatusRecord(run_id=name, role="rank", name=f"rank-{i}", pid=4_190_010 + i, pid_start=13.0,
                           host=os.uname().nodename, rank=i, world_size=len(ranks), started_at=now - 590,
                           heartbeat_at=now - 300, progress_at=now - 300, phase="train", step=50, unit="steps",
                           boot_id="a-boot-before-the-reboot", **extra)
        (run.status_dir / f"{rec.name}.json").write_text(rec.to_json())
    return run


@pytest.mark.parametrize(("ranks", "state", "says"), [
    ([{"state": "done", "exit_code": 0}, {"state": "done", "exit_code": 0}], "succeeded", "2 rank(s) done"),
    ([{"state": "done", "exit_code": 0}, {"state": "failed", "exit_code": 1, "error": "ValueError: bad shard"}],
     "failed", "rank 1 failed: ValueError: bad shard"),
    ([{}, {}], "lost", "ended without a normal interpreter exit"),
])
def test_after_a_reboot_every_reader_settles_the_run_from_its_records(runs_root, ranks, state, says):
    run = write_run(runs_root, f"20261122-010000-torchrun-{state}", "torchrun", ranks)
    data = json.loads(run_ups("runs", "--json").stdout)
    row = next(r for r in data["runs"] if r["id"] == run.run_id)
    assert row["state"] == state
    assert row["summary"].startswith("launcher lost (pid 4190001 gone); ") and says in row["summary"]
    assert run.read_manifest()["state"] == "running" and not run.events_path.exists()  # reading never writes
    run_ups("runs", "--settle")
    assert run.read_manifest()["state"] == state  # written once, for every later reader
    assert len([e for e in run.read_events() if e["event"] == "reconcile"]) == 1
    run_ups("runs", "--settle", "--json")
    assert len([e for e in run.read_events() if e["event"] == "reconcile"]) == 1


# ------------------------------------------------------------------------- clocks
FAKETIME = sorted(Path("/usr/lib").glob("*/faketime/libfaketime.so.1"))
WRITER = """
import os, threading
from ups.status import Reporter
tick = threading.Event()  # not time.sleep: under libfaketime it fails (EINVAL) once the clock is faked
with Reporter(os.environ["UPS_RUN_DIR"], rank=0, interval=0.2) as rep:
    while True:
        rep.advance()
        tick.wait(0.1)
"""


@pytest.mark.skipif(not FAKETIME, reason="libfaketime is not installed (.ci/run installs package faketime)")
def test_a_stepped_wall_clock_neither_raises_a_false_alarm_nor_hides_a_hang(runs_root, tmp_path, procs):
    """The writer's wall clock is stepped (as NTP does on a fresh cloud box) by libfaketime;
    its CLOCK_MONOTONIC is not. ups status, on the real clock, must see through both steps."""
    import sys

    run = RunDir.create(runs_root, "test", extra={"thresholds": {"unresponsive_after": 2.0, "stalled_after": 3.0}})
    spec = tmp_path / "faketime"
    spec.write_text("+0\n")
    env = dict(os.environ, UPS_RUN_DIR=str(run.path), LD_PRELOAD=str(FAKETIME[0]), FAKETIME_TIMESTAMP_FILE=str(spec),
               FAKETIME_NO_CACHE="1", FAKETIME_DONT_FAKE_MONOTONIC="1")
    writer = procs.popen([sys.executable, "-c", WRITER], env=env)

    def rank0() -> dict:
        return next(p for p in status_now(run)["processes"] if p["name"] == "rank-0")

    def record() -> StatusRecord:
        return StatusRecord.from_json((run.status_dir / "rank-0.json").read_text())

    wait_for(lambda: rank0()["health"] == "ok", 30, message="the writer ok")
    spec.write_text("-600\n")  # the writer's clock jumps 10 minutes back
    wait_for(lambda: record().heartbeat_at < time.time() - 500, 10, message="the step visible in the record")
    row = rank0()
    assert row["health"] == "ok" and row["heartbeat_age"] < 2, row  # wall time would say: no heartbeat for 10 min
    spec.write_text("+600\n")  # and 10 minutes ahead
    wait_for(lambda: record().heartbeat_at > time.time() + 500, 10, message="the forward step visible in the record")
    assert rank0()["health"] == "ok"
    writer.send_signal(signal.SIGSTOP)  # now a real hang, with heartbeats stamped in the future
    try:
        row = wait_for(lambda: (r := rank0())["health"] == "unresponsive" and r, 15, message="the hang seen")
        assert "no heartbeat for" in row["reason"]  # wall time would have hidden it for 10 minutes
    finally:
        writer.send_signal(signal.SIGCONT)
