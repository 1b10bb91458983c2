"""Unattended actions only on a proven hang (issue 30).

A third-party-style DDP script (tests/programs/ddp_pauses.py: pytorch/examples' shape, CPU,
gloo, 2 ranks, 2 DataLoader workers each) under `ups launch torchrun --on-hang restart`:

* healthy pauses (an evaluation on rank 0 alone, a checkpoint to a stream without a name, a
  checkpoint through torch.distributed.checkpoint, an upload through a child `curl`), each
  longer than the stall limit, all in one run: it ends `succeeded` on its first attempt, no
  0.5 s poll of `ups why` ever says hang, stalled or stuck, and each pause is named as the
  busy rank and what it does;
* real hangs of the same script are restarted, once proven (two idle windows, the same stack
  twice), with the proof in the event: a rank asleep in its own code, a one-sided collective,
  and a DataLoader worker asleep in `__getitem__` with `--on-worker-hang fallback` alone;
* two data-preparation scripts past their first-progress limit (lowered here): one with a
  multiprocessing.Pool and tqdm, one that only sleeps and prints "converted k/n files".

Thresholds are lowered (`--stalled-after 3`) to keep the drills short; the same drills at the
default thresholds, with 45-60 s pauses, are scripts/bench_restart.py's.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from helpers import job_processes, run_ups, status_now, wait_for, why_now

from ups.runs.rundir import FINAL_RUN_STATES, RunDir

PROGRAMS = Path(__file__).parent / "programs"
ALARM = re.compile(r"\b(hang|hung|stalled|stuck)\b", re.I)
FAST = {"UPS_HEARTBEAT_INTERVAL": "0.3"}


def launch(tmp_path: Path, launcher: str, *args: str, env: dict[str, str] | None = None) -> RunDir:
    """`ups launch LAUNCHER --detach --json ARGS...` (ups's options first, then the program's line)."""
    res = run_ups("launch", launcher, "--detach", "--json", *args, env={**FAST, **(env or {})}, cwd=tmp_path, timeout=120)
    assert res.returncode == 0, res.stderr
    return RunDir(json.loads(res.stdout)["run_dir"])


def poll_until_final(run: RunDir, timeout: float) -> list[dict]:
    """Every verdict of `ups why` at 0.5 s until the run ends (the code the command runs, in
    this process: see helpers.why_now)."""
    seen: list[dict] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            v = why_now(run)
            seen.append({"at": time.time(), "mode": v["mode"], "headline": v["headline"]})
        except Exception as exc:  # noqa: BLE001 - a run folder being written: the next poll
            seen.append({"at": time.time(), "mode": "error", "headline": repr(exc)})
        if run.read_manifest().get("state") in FINAL_RUN_STATES:
            return seen
        time.sleep(0.5)
    raise AssertionError(f"the run did not end within {timeout:g} s; last verdict: {seen[-1:]}")


def events(run: RunDir, *names: str) -> list[dict]:
    return [e for e in run.read_events() if e.get("event") in names]


@pytest.mark.slow
def test_healthy_pauses_are_never_restarted_and_each_is_named_busy(runs_root, tmp_path):
    pauses = "eval:12,ckpt_stream:12,ckpt_dcp:12,upload:12"
    run = launch(tmp_path, "torchrun", "--on-hang", "restart", "--stalled-after", "3", "--nproc-per-node", "2",
                 str(PROGRAMS / "ddp_pauses.py"),
                 env={"EXAMPLE_PAUSE": pauses, "EXAMPLE_PAUSE_STEP": "3,6,9,12", "EXAMPLE_STEPS": "15",
                      "EXAMPLE_WORKDIR": str(tmp_path / "work")})
    seen = poll_until_final(run, 240)
    m = run.read_manifest()
    assert m["state"] == "succeeded", m.get("summary")
    assert (m.get("attempt") or 1) == 1 and not m.get("restarts"), m
    assert not events(run, "hang", "restart"), events(run, "hang", "restart")
    alarms = [v for v in seen if ALARM.search(v["mode"]) or ALARM.search(v["headline"])]
    assert not alarms, alarms[:3]
    busy = [v["headline"] for v in seen if v["mode"] == "busy"]
    for what in ("evaluating", "writing a checkpoint", "sending or receiving data through curl"):
        assert any(what in h for h in busy), (what, sorted(set(busy))[:8])
    assert any("waits for it" in h for h in busy)


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["hang:4", "onesided:4"])
def test_a_real_hang_is_proven_then_restarted_with_its_proof(runs_root, tmp_path, fault):
    run = launch(tmp_path, "torchrun", "--on-hang", "restart", "--max-restarts", "1", "--stalled-after", "3",
                 "--nproc-per-node", "2", str(PROGRAMS / "ddp_pauses.py"),
                 env={"EXAMPLE_FAULT": fault, "EXAMPLE_STEPS": "10", "EXAMPLE_WORKDIR": str(tmp_path / "work")})
    restart = wait_for(lambda: events(run, "restart"), 120, interval=0.5, message="the proven hang restarted")[0]
    hang = next(e for e in events(run, "hang") if e.get("action") == "restart")
    proof = hang["proof"]
    assert proof["process"] == "rank-1" and len(proof["windows"]) == 2, proof
    assert all(w["verdict"] == "idle" for w in proof["windows"]) and len(proof["stacks"]) == 2, proof
    assert proof["stacks"][0] == proof["stacks"][1], proof["stacks"]
    assert "rank 1" in hang["headline"] and hang["who"] == "rank 1", hang
    # Restarted at once when proven, and proven within 30 s of the hang becoming visible.
    hung = json.loads((run.path / "attempts" / "1" / "status" / "rank-1.json").read_text())
    visible = max(hung["progress_at"], hung["phase_at"]) + 3
    assert restart["ts"] - visible < 30, (restart["ts"] - visible, proof["text"])
    # The second attempt hangs at the same place: not restarted again, the run ends failed, saying so.
    wait_for(lambda: run.read_manifest().get("state") in FINAL_RUN_STATES, 120, interval=0.5, message="the run's end")
    m = run.read_manifest()
    assert m["state"] == "failed" and m["summary"].startswith("not restarted: the same hang came back at "), m["summary"]
    assert "on attempt 2; restarting will not help" in m["summary"], m["summary"]
    assert not job_processes(run)


@pytest.mark.slow
def test_worker_fallback_acts_on_its_own(runs_root, tmp_path):
    """--on-worker-hang fallback without --on-hang: a DataLoader worker asleep in __getitem__,
    proven idle, restarts the job with num_workers=0, which then ends succeeded."""
    run = launch(tmp_path, "torchrun", "--on-worker-hang", "fallback", "--stalled-after", "3", "--nproc-per-node", "2",
                 str(PROGRAMS / "ddp_pauses.py"),
                 env={"EXAMPLE_FAULT": "worker_sleep:100", "EXAMPLE_STEPS": "12", "EXAMPLE_WORKDIR": str(tmp_path / "work")})
    restart = wait_for(lambda: events(run, "restart"), 120, interval=0.5, message="the fallback restart")[0]
    assert restart["num_workers"] == 0, restart
    hang = next(e for e in events(run, "hang") if e.get("action") == "restart")
    assert "worker" in (hang["who"] or "") and hang["proof"]["windows"][-1]["verdict"] == "idle", hang
    wait_for(lambda: run.read_manifest().get("state") in FINAL_RUN_STATES, 120, interval=0.5, message="the run's end")
    m = run.read_manifest()
    assert m["state"] == "succeeded" and m["attempt"] == 2, m.get("summary")


@pytest.mark.slow
@pytest.mark.parametrize("script", ["prep_pool.py", "prep_print.py"])
def test_data_prep_scripts_are_never_restarted_and_show_their_progress(runs_root, tmp_path, script):
    run = launch(tmp_path, "python", "--on-hang", "restart", "--first-progress-after", "3", str(PROGRAMS / script),
                 env={"PREP_FILES": "14", "PREP_SECS": "1.0"})
    shown: list[dict] = []

    def progress() -> dict | None:
        d = status_now(run)
        rank = next((p for p in d["processes"] if p["name"] == "rank-0"), None)
        if rank is not None and rank["step"] and rank["total"]:
            shown.append(d)
        return d["run"]["state"] in FINAL_RUN_STATES

    seen = []
    deadline = time.monotonic() + 120
    while not progress() and time.monotonic() < deadline:
        seen.append(why_now(run))
        time.sleep(0.5)
    m = run.read_manifest()
    assert m["state"] == "succeeded" and (m.get("attempt") or 1) == 1, m.get("summary")
    assert not [v for v in seen if ALARM.search(v["mode"]) or ALARM.search(v["headline"])], seen[-3:]
    assert shown, "no progress shown while it ran"
    last = shown[-1]
    assert last["progress"]["total"] == 14 and last["progress"]["rate"], last["progress"]
    if script == "prep_pool.py":  # the pool's workers are named as such, never nameless helpers
        names = {p["name"] for d in shown for p in d["processes"]}
        assert any("pool" in n for n in names), names
        running = [d for d in shown if d["run"]["state"] not in FINAL_RUN_STATES]
        assert any(d["progress"]["eta_s"] is not None for d in running), [d["progress"] for d in running[-3:]]
