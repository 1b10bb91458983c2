"""`ups attach PID --notify`: the launcher's notifier on a job ups did not start (a plain `torchrun
--standalone --nproc-per-node 2`, gloo: tests/programs/attach_ddp.py). A `cmd:` notifier writing
a file is the receiver; a webhook that never answers must not hold up the observer. Attaching
never signals the job."""

from __future__ import annotations

import json
import time
from itertools import pairwise

import pytest
from helpers import run_ups, wait_for
from test_attach import SLEEP_LINE, PlainJobs, idle_rank, needs_pyspy

from ups.status.procs import process_start_time, same_start


@pytest.fixture
def jobs(tmp_path):
    j = PlainJobs(tmp_path)
    yield j
    j.cleanup()


def messages(out) -> list[dict]:
    return [json.loads(line) for line in out.read_text().splitlines() if line.strip()] if out.exists() else []


def events(runs_root, run_id: str) -> list[dict]:
    return [json.loads(line) for line in (runs_root / run_id / "events.jsonl").read_text().splitlines()]


def test_a_bad_notify_target_attaches_nothing(runs_root, procs):
    sleeper = procs.python("import time; time.sleep(60)")
    res = run_ups("attach", str(sleeper.pid), "--notify", "carrier-pigeon")
    assert res.returncode == 2 and "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert not any(runs_root.iterdir())


@pytest.mark.slow
@needs_pyspy
def test_an_attached_job_that_crashes_sends_one_end_message_with_the_cause(runs_root, jobs, tmp_path):
    crash, out = tmp_path / "crash-now", tmp_path / "told.jsonl"
    agent, log = jobs.start_ready("step 10/", fault=f"raise_when:{crash}")
    jobs.remember()
    res = run_ups("attach", str(agent.pid), "--json", "--notify", f"cmd:cat >> {out}; echo >> {out}")
    assert res.returncode == 0, res.stderr
    run_id = json.loads(res.stdout)["run_id"]
    assert json.loads((runs_root / run_id / "run.json").read_text())["notify"] == [f"cmd:cat >> {out}; echo >> {out}"]
    crash.touch()
    told = wait_for(lambda: [m for m in messages(out) if m["event"] == "end"], 120, interval=0.5, message="the end message")
    end = told[0]
    assert end["run_id"] == run_id and end["state"] == "failed", end
    assert "rank 1" in end["summary"] and "ValueError" in end["summary"], end["summary"]
    assert end["verdict"]["who"]["rank"] == 1 and "ValueError" in end["verdict"]["headline"]
    assert [m["event"] for m in messages(out)] == ["end"]  # one message: the crash is the end, told once
    # the notifier logs its sending once the command has returned, a moment after the message is in the file
    sent = wait_for(lambda: [e for e in events(runs_root, run_id) if e["event"] == "notify.sent"], 30, interval=0.2,
                    message="the notify.sent event")
    assert len(sent) == 1 and sent[0]["actor"] == "attach" and sent[0]["target"] == "cmd:…"
    assert not [e for e in events(runs_root, run_id) if e["event"] == "signal"]


@pytest.mark.slow
@needs_pyspy
def test_a_stuck_rank_is_told_once_proven_with_its_proof_and_a_notifier_that_never_answers_holds_nothing_up(
        runs_root, jobs, tmp_path, never_answers):
    out = tmp_path / "told.jsonl"
    agent, log = jobs.start_ready("rank 1 waits at step 30", fault="sleep:30")
    jobs.remember()
    starts = {pid: process_start_time(pid) for pid in jobs.pids}
    limit = 15.0  # a webhook that held the writes would leave a 15 s gap; a slow tick on a loaded box, a few s
    res = run_ups("attach", str(agent.pid), "--json", "--notify", never_answers,
                  "--notify", f"cmd:cat >> {out}; echo >> {out}", env={"UPS_NOTIFY_TIMEOUT": str(limit)})
    assert res.returncode == 0, res.stderr
    run_id = json.loads(res.stdout)["run_id"]
    record = runs_root / run_id / "status" / "rank-0.json"

    # The observer writes each process's record once a second: while the never-answering
    # webhook holds the notifier's delivery thread, those writes go on.
    beats: list[float] = []

    def told():
        try:
            hb = json.loads(record.read_text())["heartbeat_at"]
        except (OSError, ValueError, KeyError):
            hb = None
        if hb is not None and (not beats or hb != beats[-1]):
            beats.append(hb)
        return [m for m in messages(out) if m["event"] == "problem"]
    problem = wait_for(told, 120, interval=0.25, message="the hang message")[0]
    assert problem["mode"] == "rank_stuck_peers_wait" and problem["verdict"]["who"]["rank"] == 1, problem
    assert problem["summary"].startswith(f"ups {run_id}: rank 1 is stuck") and "(proof: rank-1" in problem["summary"]
    proof = problem["proof"]
    assert proof["process"] == "rank-1" and "the same stack in two dumps" in proof["text"]
    assert any(f"attach_ddp.py:{SLEEP_LINE} in wait_for_the_answer" in frame for frame in proof["stacks"][0])
    failed = wait_for(lambda: [e for e in events(runs_root, run_id) if e["event"] == "notify.failed"], 30,
                      message="the never-answering webhook's failure")
    assert failed[0]["seconds"] >= limit - 1 and "timed out" in failed[0]["error"]
    assert len(beats) >= 5 and max(b - a for a, b in pairwise(beats)) < limit - 5, beats
    # Told once per episode; the job was never signalled and runs on.
    time.sleep(3.0)
    assert [m["event"] for m in messages(out)] == ["problem"]
    assert not [e for e in events(runs_root, run_id) if e["event"] in ("signal", "hang")]
    assert all(same_start(process_start_time(pid), start) for pid, start in starts.items())


@pytest.mark.slow
@pytest.mark.parametrize("told_by", ["--notify", "config file"])
def test_an_attached_run_stopped_by_ups_kill_tells_its_end_as_a_launched_one_does(runs_root, jobs, tmp_path, told_by):
    """`ups kill` stops the observer first, then the job: the observer cannot tell that end, so
    the kill does, once the run is marked killed: one `end` message, as a launcher sends; to
    --notify's targets, else to the config file's, as the observer would."""
    idle, out = idle_rank(tmp_path), tmp_path / "told.jsonl"
    agent, _ = jobs.start_ready("rank 0", "rank 1", program=idle)
    jobs.remember()
    target, env = f"cmd:cat >> {out}; echo >> {out}", {"XDG_CONFIG_HOME": str(tmp_path / "config")}
    if told_by == "config file":
        (tmp_path / "config" / "ups").mkdir(parents=True)
        (tmp_path / "config" / "ups" / "config.toml").write_text(f'[notify]\ntargets = ["{target}"]\n')
    res = run_ups("attach", str(agent.pid), "--json", *(["--notify", target] if told_by == "--notify" else []), env=env)
    assert res.returncode == 0, res.stderr
    run_id = json.loads(res.stdout)["run_id"]
    res = run_ups("kill", run_id, "--reason", "done with it", timeout=120, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert json.loads((runs_root / run_id / "run.json").read_text())["state"] == "killed"
    told = messages(out)  # told before `ups kill` returns
    assert [m["event"] for m in told] == ["end"], told
    assert told[0]["run_id"] == run_id and told[0]["state"] == "killed" and "done with it" in told[0]["summary"], told[0]
    assert agent.wait(timeout=30) is not None
