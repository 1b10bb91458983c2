"""Sharded training seen as well as DDP (issue 29): FSDP2, DTensor tensor parallel and a 2-stage
pipeline, each written the way its own tutorial writes it (tests/programs/sharded/, CPU, gloo,
2 ranks under `ups launch torchrun --standalone --nproc-per-node 2`), with a fault on rank 1
at step 5: a hang in its own code, a raise, a one-sided collective.

Each drill polls `ups why` every 0.5 s (the code the command runs, in this process) and asserts:
the rank and the line named, what the waiting rank waits in (the framework's own collective,
with its context), within 15 s of the fault (the time rank 1 printed just before it), and that
no poll before named anyone else. And a NaN drill at several hundred steps a second, 5 runs:
the verdict names the poisoned rank and its exact step every time, never the rank that the
all-reduce poisoned after it.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from helpers import run_ups, why_now

from ups.runs.rundir import FINAL_RUN_STATES, RunDir

PROGRAMS = Path(__file__).parent / "programs"
SHARDED = PROGRAMS / "sharded"
FAST = {"UPS_HEARTBEAT_INTERVAL": "0.3"}
FAULT_STEP = 5
LATENCY_S = 15.0
FAULT_LINE = re.compile(r"rank 1: fault (\w+) at step (\d+) at (\d+\.\d+)")


def line_of(program: Path, text: str) -> str:
    n = next(i for i, line in enumerate(program.read_text().splitlines(), 1) if text in line)
    return f"{program.name}:{n}"


def launch(tmp_path: Path, program: Path, fault: str, steps: int, nproc: int = 2) -> RunDir:
    res = run_ups("launch", "torchrun", "--detach", "--json", "--stalled-after", "3", "--standalone", "--nproc-per-node", str(nproc),
                  str(program), env={**FAST, "TUTORIAL_FAULT": f"{fault}:{FAULT_STEP}", "TUTORIAL_STEPS": str(steps)},
                  cwd=tmp_path, timeout=120)
    assert res.returncode == 0, res.stderr
    return RunDir(json.loads(res.stdout)["run_dir"])


def fault_time(run: RunDir) -> float | None:
    try:
        m = FAULT_LINE.search(run.log_path("job").read_text(errors="replace"))
    except OSError:
        return None
    return float(m[3]) if m else None


def drill(run: RunDir, done, timeout: float = 150) -> tuple[dict, list[dict], float]:
    """Poll `ups why` every 0.5 s until ``done(verdict)``: (that verdict, every poll before, the
    seconds from the fault to it)."""
    polls: list[dict] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            v = why_now(run)
        except Exception as exc:  # noqa: BLE001 - a record being replaced: the next poll
            v = {"mode": "error", "headline": repr(exc), "who": None}
        seen = time.time()
        if done(v):
            at = fault_time(run)
            assert at is not None, "rank 1 did not say when its fault began"
            return v, polls, seen - at
        polls.append(v)
        time.sleep(0.5)
    raise AssertionError(f"no expected verdict within {timeout:g} s; last: {polls[-1:]}")


def no_wrong_culprit(polls: list[dict]) -> None:
    wrong = [v for v in polls if (v.get("who") or {}).get("rank") not in (None, 1)
             or re.search(r"rank 0 (is|was) (stuck|stalled|hung|unresponsive)", v["headline"])]
    assert not wrong, [(v["mode"], v["headline"]) for v in wrong[:3]]


def named(mode: str):
    return lambda v: v["mode"] == mode and (v.get("who") or {}).get("rank") == 1


def end(run: RunDir) -> None:
    if run.read_manifest().get("state") not in FINAL_RUN_STATES:
        run_ups("kill", str(run.path), "--force", timeout=60)


def fault_named(tmp_path: Path, program: Path, fault: str, steps: int, done, line: str, nproc: int = 2) -> dict:
    """Rank 1's fault at FAULT_STEP: the first verdict ``done`` accepts, which must name the
    program's ``line``; no poll before it named anyone else; within LATENCY_S of the fault."""
    run = launch(tmp_path, program, fault, steps, nproc)
    try:
        v, polls, latency = drill(run, done)
    finally:
        end(run)
    no_wrong_culprit(polls)
    assert v["where"]["site"] == line_of(program, line), v
    assert latency <= LATENCY_S, (latency, v)
    return v


def hang_named(tmp_path: Path, program: Path, steps: int, nproc: int = 2) -> dict:
    """Rank 1 hangs in its own code: the verdict that names it at its line."""
    return fault_named(tmp_path, program, "hang", steps, named("rank_stuck_peers_wait"), "time.sleep(3600)", nproc)


# (program, steps, what rank 0 waits in when rank 1 hangs or calls a one-sided all_reduce: a regex)
PROGRAMS_WAITS = {
    "fsdp2": ("fsdp2_tutorial.py", 12, re.escape("all_gather_single (FSDP unshard of root)")),
    "tp": ("dtensor_tp_tutorial.py", 12, re.escape("all_reduce (TP RowwiseParallel._prepare_output_fn)")),
    "pipeline": ("pipeline_tutorial.py", 12, r"i?(send to|recv from) rank 1 \(pipelining [a-z_]+\)"),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PROGRAMS_WAITS))
def test_hang_in_own_code_names_rank_1_and_what_rank_0_waits_in(runs_root, tmp_path, name):
    file, steps, waits_in = PROGRAMS_WAITS[name]
    v = hang_named(tmp_path, SHARDED / file, steps)
    assert any(re.match(f"rank 0 waits in {waits_in}", e) for e in v["evidence"]), v["evidence"]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PROGRAMS_WAITS))
def test_raise_names_rank_1_and_its_line(runs_root, tmp_path, name):
    file, steps, _ = PROGRAMS_WAITS[name]
    v = fault_named(tmp_path, SHARDED / file, "raise", steps,
                    lambda v: (v.get("who") or {}).get("rank") == 1 and v["mode"] == "exception",
                    'raise RuntimeError(f"fault injected')
    assert "fault injected on rank 1 at step 5" in v["headline"], v


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PROGRAMS_WAITS))
def test_one_sided_collective_names_rank_1_and_shows_both_sides(runs_root, tmp_path, name):
    file, steps, waits_in = PROGRAMS_WAITS[name]
    v = fault_named(tmp_path, SHARDED / file, "onesided", steps,
                    lambda v: (v.get("who") or {}).get("rank") == 1 and v["mode"] in ("one_sided_collective", "collective_mismatch"),
                    "dist.all_reduce(torch.ones(1))")
    text = " ".join([v["headline"], *v["evidence"]])
    assert "rank 1" in text and "all_reduce" in text, v
    assert re.search(f"rank 0(:| was in) {waits_in}", text), v


@pytest.mark.slow
def test_hang_on_a_2d_mesh_names_the_rank_and_each_group_that_waits(runs_root, tmp_path):
    """FSDP2 over "dp" and tensor parallel over "tp" on a (2, 2) mesh, 4 ranks: rank 1 hangs in
    its own code. Rank 0 waits for it in TP's all_reduce on its 'tp' group [0, 1], rank 3 in
    FSDP's all-gather on its 'dp' group [1, 3]; rank 2 waits through them."""
    v = hang_named(tmp_path, SHARDED / "fsdp_tp_2d_tutorial.py", 12, nproc=4)
    ev = " ".join(v["evidence"])
    assert re.search(r"rank 0 waits in all_reduce \(TP RowwiseParallel\._prepare_output_fn\) #\d+ on mesh dim 'tp' \[0, 1\]", ev), v
    assert re.search(r"rank 3 waits in all_gather_single \(FSDP unshard of root\) #\d+ on mesh dim 'dp' \[1, 3\]", ev), v
    assert "waiting through them: rank 2" in ev, v


# ---------------------------------------------------------------------------------- NaN
STEPS_S = re.compile(r"rank (\d): (\d+) steps/s")
HEARTBEAT_S = 4
HEARTBEAT_KEPT = 64  # losses the sampling kept per heartbeat before issue 29: a loop faster than this lost its first NaN


@pytest.mark.slow
@pytest.mark.parametrize("rep", range(5))
def test_first_nan_is_exact_at_hundreds_of_steps_per_second(runs_root, tmp_path, rep):
    """pytorch/examples' DDP loop with no sleep (hundreds of steps a second), rank 1's loss NaN
    from step S on; DDP's all-reduce makes rank 0's NaN from S+1. The default heartbeat (1 s):
    every loss between two of them must be checked, not only the ones it sees. The heartbeat is
    4 s here so that on a busy box too (a slower loop) more than 64 steps fall between two."""
    nan_step = 61 + 47 * rep
    res = run_ups("launch", "torchrun", "--json", "--standalone", "--nproc-per-node", "2", str(PROGRAMS / "nan_ddp.py"),
                  "--steps", "400", "--nan-rank", "1", "--nan-step", str(nan_step), "--step-time", "0",
                  env={"UPS_HEARTBEAT_INTERVAL": str(HEARTBEAT_S)}, cwd=tmp_path, timeout=170)
    run = RunDir(json.loads(res.stdout)["run_dir"])
    log = run.log_path("job").read_text(errors="replace")
    rates = {int(r): int(v) for r, v in STEPS_S.findall(log)}
    assert len(rates) == 2, log[-2000:]
    print(f"steps/s: {rates}")
    assert min(rates.values()) * HEARTBEAT_S > HEARTBEAT_KEPT, rates  # faster than the old sampling could follow
    v = why_now(run)
    assert v["mode"] == "loss_nonfinite", v
    assert v["who"]["rank"] == 1, v  # never rank 0, which the all-reduce poisoned
    assert f"on rank 1 at step {nan_step}" in v["headline"], v
    assert f"then rank 0 from step {nan_step + 1}" in " ".join(v["evidence"]), v
