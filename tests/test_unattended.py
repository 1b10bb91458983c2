"""Unattended runs: a hang named by `ups why` is acted on as the operator asked at launch
(--on-hang, --max-restarts), each attempt's verdict and records kept, every action an event."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from helpers import run_ups, wait_for, why_now

from ups.runs.rundir import RunDir
from ups.status.series import read_series

PROGRAMS = Path(__file__).parent / "programs"
HANG = str(PROGRAMS / "hang_train.py")
FAST = {"UPS_HEARTBEAT_INTERVAL": "0.3"}


def _launch(*args: str, cwd: Path) -> RunDir:
    res = run_ups("launch", "python", "--detach", "--json", "--stalled-after", "2", *args, env=FAST, timeout=60, cwd=cwd)
    assert res.returncode == 0, res.stderr
    return RunDir(json.loads(res.stdout)["run_dir"])


@pytest.mark.slow
def test_the_same_hang_twice_is_not_restarted_a_third_time(runs_root, tmp_path):
    """A loop that hangs at the same line and step on every attempt, under --max-restarts 3:
    restarted once, and when the same hang comes back, ended (restarting will not help), the
    verdict and the notification saying so."""
    told = tmp_path / "told.jsonl"
    run = _launch("--on-hang", "restart", "--max-restarts", "3", "--notify", f"cmd:cat >> {told}; echo >> {told}",
                  HANG, "--hang-step", "5", cwd=tmp_path)
    wait_for(lambda: run.read_manifest()["state"] in ("succeeded", "failed", "killed"), 150, interval=0.25,
             message="the run to give up")
    m = run.read_manifest()
    line = next(i for i, text in enumerate(Path(HANG).read_text().splitlines(), 1) if "time.sleep(0.5)" in text)
    refusal = (f"not restarted: the same hang came back at hang_train.py:{line} on attempt 2; restarting will not "
               "help; fix it, then `ups relaunch`")
    assert m["state"] == "failed" and m["summary"].startswith(refusal + ": attempt 1: rank 0 is stalled"), m["summary"]
    assert [a["attempt"] for a in m["attempts"]] == [1, 2] and m["attempt"] == 2 and m["restarts"] == 1
    for a in m["attempts"]:
        assert a["verdict"]["mode"] == "stalled" and a["verdict"]["who"]["name"] == "rank-0", a
        assert a["step"] == 5 and a["hang"]["site"] == f"hang_train.py:{line}", a
        assert 0 <= a["first_step_s"] < 60, a  # what each start cost, to its first step
    assert 0 < m["attempts"][0]["hang_to_restart_s"] < 120, m["attempts"][0]  # hang to the next start
    assert json.loads((run.path / "attempts" / "1" / "status" / "rank-0.json").read_text())["step"] == 5
    events = run.read_events()
    hangs = [e for e in events if e["event"] == "hang"]
    assert [e["action"] for e in hangs] == ["restart", f"kill: {refusal}"], hangs
    assert "restart 1 of 3" in hangs[0]["reason"]
    assert why_now(run)["headline"].startswith(refusal + " (rank 0 is stalled"), why_now(run)
    assert len([e for e in events if e["event"] == "start"]) == 2
    # stacks saved before each kill: the stack file holds a dump of the loop's own frame, twice
    stacks = (run.path / "stacks" / "rank-0.txt").read_text()
    assert stacks.count("hang_train.py") >= 2 and len([e for e in events if e["event"] == "stacks.auto"]) >= 2
    series, _ = read_series(run.path / "metrics" / "rank-0.json")  # one series across the attempts
    assert {row[2] for row in series["recent"]} == {1, 2}
    assert "attempt 2/4" in run_ups("status", str(run.path)).stdout
    why = json.loads(run_ups("why", str(run.path), "--json").stdout)
    assert why["verdict"]["headline"].startswith(refusal)
    assert [a["verdict"]["mode"] for a in why["attempts"]] == ["stalled"] * 2  # each attempt's verdict kept
    end = wait_for(lambda: [json.loads(x) for x in told.read_text().splitlines() if x.strip() and '"end"' in x]
                   if told.exists() else None, 30, message="the end's notification")
    assert refusal in json.dumps(end[-1]), end[-1]
    # The console's run screen shows the attempts as a timeline.
    timeline = asyncio.run(_attempts_panel(runs_root, run.run_id))
    assert "attempt 1" in timeline and "attempt 2" in timeline and "reached step 5" in timeline, timeline
    assert "hang → restart" in timeline and "first step after" in timeline and "restart 1 of 3" in timeline, timeline
    assert "not restarted: the same hang came back" in timeline.split("attempt 2")[1], timeline


async def _attempts_panel(runs_root: Path, run_id: str) -> str:
    from console.app import UpsConsole

    app = UpsConsole(runs_root, refresh=0.3)
    async with app.run_test(size=(140, 40)) as pilot:
        app.open_run(run_id)
        for _ in range(300):
            try:
                text = str(app.screen.query_one("#attempts").render())
            except Exception:  # noqa: BLE001 - the screen is not up yet
                text = ""
            if "attempt 2" in text:
                return text
            await pilot.pause(0.1)
    raise AssertionError("the run screen's attempts panel never showed attempt 2")


@pytest.mark.slow
def test_a_hang_that_happens_once_is_restarted_and_the_run_succeeds(runs_root, tmp_path):
    run = _launch("--on-hang", "restart", "--max-restarts", "3", HANG, "--steps", "12", "--hang-step", "5",
                  "--hang-once", str(tmp_path / "hung-once"), "--ckpt", str(tmp_path / "ckpt.pt"), cwd=tmp_path)
    wait_for(lambda: run.read_manifest()["state"] in ("succeeded", "failed", "killed"), 150, interval=0.25,
             message="the run's end")
    # The last attempt's entry is written just after the run's end (it reads the end's verdict).
    m = wait_for(lambda: (m := run.read_manifest()) and len(m.get("attempts") or []) >= m.get("attempt", 1) and m, 10,
                 interval=0.25, message="the last attempt's entry")
    assert m["state"] == "succeeded" and m["attempt"] == 2 and m["restarts"] == 1, m.get("summary")
    assert "after 1 restart(s) on hang" in m["summary"], m["summary"]
    assert [a["ended"].split(" ")[0] for a in m["attempts"]] == ["restarted", "ended"], m["attempts"]
    assert [e["action"] for e in run.read_events() if e["event"] == "hang"] == ["restart"]


@pytest.mark.slow
def test_observe_only_and_kill(runs_root, tmp_path):
    observed = _launch("--observe-only", "--on-hang", "restart", HANG, "--hang-step", "3", cwd=tmp_path)
    killed = _launch("--on-hang", "kill", HANG, "--hang-step", "3", cwd=tmp_path)
    wait_for(lambda: killed.read_manifest()["state"] == "failed", 90, interval=0.25, message="the kill on hang")
    assert killed.read_manifest()["summary"].startswith("ended on hang (--on-hang kill): attempt 1: rank 0 is stalled")
    # The verdict is the hang that ups proved, not the SIGTERM it sent to end it.
    v = why_now(killed)
    assert v["headline"].startswith("ended by ups on a proven hang: rank 0 is stalled"), v
    assert v["who"]["name"] == "rank-0" and any(e.startswith("proof: rank-0") for e in v["evidence"]), v
    hang = wait_for(lambda: [e for e in observed.read_events() if e["event"] == "hang"], 30, message="the observed hang")
    assert hang[0]["action"] == "observe-only: would restart"
    assert observed.read_manifest()["state"] == "running" and not (observed.path / "attempts").exists()
    # The operator relaunches it by hand: the new run's loss series goes on from the old one's.
    res = run_ups("relaunch", str(observed.path), "--detach", "--json", env=FAST, timeout=120)
    assert res.returncode == 0, res.stderr
    new = RunDir(json.loads(res.stdout)["run_dir"])

    def continued():
        data, _ = read_series(new.path / "metrics" / "rank-0.json")
        return data is not None and [row[2] for row in data["recent"]][-1] == 2 and data

    data = wait_for(continued, 60, interval=0.3, message="attempt 2's points in the relaunched run's series")
    attempts = [row[2] for row in data["recent"]]
    assert attempts[0] == 1 and attempts == sorted(attempts)  # the old run's points first, then the new run's
    assert run_ups("kill", str(new.path), "--grace", "2").returncode == 0


@pytest.mark.slow
def test_a_hung_dataloader_worker_falls_back_to_num_workers_0(runs_root, tmp_path):
    """--on-worker-hang fallback: the hang is a worker's, so the relaunch loads in the main
    process (every DataLoader at num_workers=0), and the program runs to its end."""
    run = _launch("--on-hang", "restart", "--max-restarts", "1", "--on-worker-hang", "fallback",
                  str(PROGRAMS / "worker_hang_train.py"), "--steps", "60", "--hang-index", "100", cwd=tmp_path)
    wait_for(lambda: run.read_manifest()["state"] in ("succeeded", "failed", "killed"), 150, interval=0.25,
             message="the run's end")
    m = run.read_manifest()
    assert m["state"] == "succeeded" and m["attempt"] == 2 and m["restarts"] == 1, m
    first = m["attempts"][0]
    assert first["attempt"] == 1 and first["verdict"]["who"]["role"] == "worker", first
    events = run.read_events()
    assert [e["action"] for e in events if e["event"] == "hang"] == ["restart"]
    restart = [e for e in events if e["event"] == "restart"]
    assert len(restart) == 1 and restart[0]["attempt"] == 2 and restart[0]["num_workers"] == 0, restart
    log = run.log_path("job").read_text(errors="replace")
    assert "DataLoader num_workers=2 forced to 0" in log and "done: 60 steps" in log
    record = json.loads((run.path / "status" / "rank-0.json").read_text())
    assert record["state"] == "done" and record["metrics"]["forced_num_workers"] == 0, record
    assert not list((run.path / "status").glob("rank-0-worker-*.json"))  # attempt 2 had no workers


def test_an_earlier_attempts_process_ends_are_not_this_attempts(tmp_path):
    """A restart kills the hung attempt's ranks, and attempt 2's ranks carry the same names:
    `ups why` on attempt 2 must not read attempt 1's 'rank 0 killed' as its own."""
    from ups.runs.view import load_run_view
    from ups.why.evidence import Evidence

    run = RunDir.create(tmp_path / "runs", "python")
    now = time.time()
    run.update_manifest(state="running", attempt=2, restarts=1, attempts=[
        {"attempt": 1, "ended_at": now - 5, "ended": "restarted (killed by SIGTERM)", "records": "attempts/1"}])
    end = dict(role="rank", rank=0, exact=True, record_state="running", phase="train", step=5, error=None, exit_code=None)
    run.append_event("process.exit", actor="launcher", name="rank-0", pid=4242, at=now - 6, **end)
    run.append_event("process.exit", actor="launcher", name="rank-1", pid=4243, at=now - 6, **end)
    assert Evidence(load_run_view(run)).exits == {}  # attempt 1's, ended before attempt 2 began
    run.append_event("process.exit", actor="launcher", name="rank-1", pid=4343, at=now - 1, **end)
    assert [(e.name, e.pid) for e in Evidence(load_run_view(run)).exits.values()] == [("rank-1", 4343)]
