"""A hang named within seconds where the run's own rhythm proves it (issue 38, part 2): a rank
that stepped regularly is shown stalled after 10 x its p99 interval (2 s at least) and judged
in 1 s windows, its peers waiting for it count as evidence; an automatic action still waits
for the learned limit and the full proof (10 s idle in a row, the same stack twice).

The speed figures over 2, 10 and 50 steps/s and the healthy-pause matrix are
scripts/bench_restart.py --rhythm's (docs/benchmarks.md)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from helpers import run_ups, wait_for

from ups.launch.proof import PROOF_IDLE_S, SHORT_WINDOW_S, WINDOW_S, Watched, Window
from ups.runs.read import open_run
from ups.runs.rundir import FINAL_RUN_STATES, RunDir
from ups.why import diagnose_view

PROGRAMS = Path(__file__).parent / "programs"


def window(verdict: str, seconds: float = SHORT_WINDOW_S) -> Window:
    return Window(seconds, 0.0, 0.0, 0.0, 0.0, 0, False, "hrtimer_nanosleep", (), verdict)


def watched(*verdicts: str, seconds: float = SHORT_WINDOW_S) -> Watched:
    w = Watched("rank-1", 42, set(), 0.0, window=seconds)
    w.windows = [window(v, seconds) for v in verdicts]
    return w


def test_short_windows_show_idle_early_only_with_the_peers_evidence_and_prove_nothing_sooner():
    one = watched("busy", "idle")
    assert one.shown(peers_wait=True) == "idle"  # a peer waits in a collective for it: said after 1 s
    assert one.shown(peers_wait=False) == "watching"  # alone: a whole WINDOW_S of idleness first
    assert watched(*["idle"] * int(WINDOW_S)).shown() == "idle"
    nine = watched(*["idle"] * 9)
    nine.stacks = [(0.0, (("a.py", 1, "f"),)), (11.0, (("a.py", 1, "f"),))]
    assert not nine.proven() and nine.idle_seconds() == pytest.approx(9.0)  # 9 s idle is no proof yet
    ten = watched(*["idle"] * int(PROOF_IDLE_S))
    ten.stacks = nine.stacks
    assert ten.proven() and not watched("idle", *["busy"], *["idle"] * 9).proven(stacks=False)
    # The 5 s windows prove as before: two of them in a row.
    two = watched("idle", "idle", seconds=WINDOW_S)
    assert two.proven(stacks=False) and not watched("unsure", "idle", seconds=WINDOW_S).proven(stacks=False)


@pytest.mark.slow
def test_a_hang_at_10_steps_per_s_is_named_early_and_restarted_only_on_the_full_proof(runs_root, tmp_path):
    res = run_ups("launch", "torchrun", "--detach", "--json", "--on-hang", "restart", "--max-restarts", "1",
                  "--nproc-per-node", "2", str(PROGRAMS / "rhythm_loop.py"),
                  env={"RHYTHM_RATE": "10", "RHYTHM_HANG": "60", "RHYTHM_STEPS": "2000"}, cwd=tmp_path, timeout=120)
    assert res.returncode == 0, res.stderr
    run = RunDir(json.loads(res.stdout)["run_dir"])

    def named():
        v = diagnose_view(open_run(run))
        rec = json.loads((run.path / "status" / "rank-1.json").read_text())
        return v.mode == "rank_stuck_peers_wait" and v.who["name"] == "rank-1" and rec["step"] >= 60 and (v, rec, time.time())

    v, rec, seen_at = wait_for(named, 120, interval=0.25, message="the hang named")
    assert v.headline.startswith("rank 1 is stuck in its own code while rank 0 waits for it"), v.headline
    assert "rhythm" in json.dumps(v.evidence), v.evidence  # the limit said how it was decided
    start = max(rec["progress_at"], rec["phase_at"])
    # Named before any action may be taken: an action waits for the learned limit (10 s) and 10 s of proof.
    assert not [e for e in run.read_events() if e["event"] == "hang"]
    restart = wait_for(lambda: [e for e in run.read_events() if e["event"] == "restart"], 120, interval=0.5,
                       message="the proven hang restarted")[0]
    assert seen_at < restart["ts"] and restart["ts"] - start >= 10 + PROOF_IDLE_S, (seen_at - start, restart["ts"] - start)
    hang = next(e for e in run.read_events() if e["event"] == "hang")
    assert hang["proof"]["process"] == "rank-1" and "idle for" in hang["proof"]["text"], hang["proof"]
    assert run_ups("kill", str(run.path), "--grace", "2").returncode == 0
    wait_for(lambda: run.read_manifest().get("state") in FINAL_RUN_STATES, 60, message="the run's end")
