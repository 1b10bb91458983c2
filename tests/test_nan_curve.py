"""The curve that led to a NaN: a fast run keeps the loss of every step, and the steps just
before its first non-finite loss for good; `ups plot` and the console's run chart draw it.

The real run is tests/programs/nan_ddp.py (plain torch DDP, gloo, two torchrun ranks, no sleep
between steps: hundreds of steps a second, many per heartbeat) whose rank 1 turns NaN at a
known step and goes on long after it, so that the steps before the NaN have left the series'
recent detail by the end.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from helpers import run_ups, wait_for

from console.snapshots import rank_series
from ups.runs.rundir import RunDir
from ups.runs.view import load_run_view
from ups.status.series import (
    AFTER_NONFINITE,
    BEFORE_NONFINITE,
    RECENT,
    SeriesWriter,
    metric_values,
    read_run_series,
    read_series,
    series_path,
)

NAN_DDP = str(Path(__file__).parent / "programs" / "nan_ddp.py")
NAN_STEP = 200
STEPS = 700  # NaN at 200: by the end the last RECENT points are all after it


def test_every_step_is_a_point_and_the_steps_before_the_first_nan_are_kept(tmp_path):
    """What the heartbeat hands the series: every loss read since the last tick, in order."""
    w = SeriesWriter(tmp_path, "rank-1")
    t0 = 1_795_000_000.0
    for tick in range(40):  # 25 steps a tick, NaN from step 300 to the end (step 999)
        steps = [(s, float("nan") if s >= 300 else 1.0 / (s + 1)) for s in range(tick * 25, tick * 25 + 25)]
        w.add({"t": t0 + tick, "step": tick * 25 + 25, "loss": steps[-1][1], "rate": 25.0, "lr": 0.1}, steps=steps)
        w.add({"t": t0 + tick + 0.5, "step": tick * 25 + 25, "loss": steps[-1][1], "rate": 25.0})  # a tick without steps
    w.maybe_write(force=True)
    data, problem = read_series(series_path(tmp_path, "rank-1"))
    assert problem is None
    pairs = metric_values(data, "loss")
    steps = [s for s, _ in pairs]
    assert steps == sorted(steps) and len(steps) == len(set(steps))  # one point a step, in order
    assert steps[0] == 0 and steps[-1] == 999 and steps[-RECENT:] == list(range(1000 - RECENT, 1000))
    assert set(range(300 - BEFORE_NONFINITE, 300 + AFTER_NONFINITE + 1)) <= set(steps)  # the NaN's neighbourhood, in full
    assert all(math.isfinite(v) for s, v in pairs if s < 300) and all(math.isnan(v) for s, v in pairs if s >= 300)
    # the tick's other columns ride on its last step only
    lr = [s for s, _ in metric_values(data, "lr")]
    assert lr and all(s % 25 == 24 for s in lr)

    # a relaunch of the same run keeps the neighbourhood of the first NaN (attempt 1's)
    w2 = SeriesWriter(tmp_path, "rank-1", attempt=2)
    w2.add({"t": t0 + 100, "step": 0, "loss": 2.0}, steps=[(0, 2.0)])
    w2.maybe_write(force=True)
    data, _ = read_series(series_path(tmp_path, "rank-1"))
    assert set(range(300 - BEFORE_NONFINITE, 301)) <= {s for s, _ in metric_values(data, "loss")}


def test_a_tick_before_the_first_step_does_not_cost_the_curve_its_beginning(tmp_path):
    """Under load the heartbeat may tick before the first loss is read (CI saw it on rank 0):
    that tick is the series' first point, so the overview's every-stride-th point fell on
    steps 3, 7, 11 ... once it had been thinned twice. The first loss is kept for good."""
    w = SeriesWriter(tmp_path, "rank-0")
    t0 = 1_795_000_000.0
    w.add({"t": t0, "step": 0, "rate": 0.0, "mem": 1024})  # before training: no loss yet
    for tick in range(60):  # 20 steps a tick, 1,200 steps: the overview thins twice or more
        steps = [(s, 1.0 / (s + 1)) for s in range(tick * 20, tick * 20 + 20)]
        w.add({"t": t0 + 1 + tick, "step": tick * 20 + 20, "rate": 20.0}, steps=steps)
    w.maybe_write(force=True)
    data, problem = read_series(series_path(tmp_path, "rank-0"))
    assert problem is None and data["stride"] >= 4
    steps = [s for s, _ in metric_values(data, "loss")]
    assert steps[0] == 0 and steps == sorted(steps) and len(steps) == len(set(steps))
    assert steps[-RECENT:] == list(range(1200 - RECENT, 1200))
    # and a relaunch that loads the file keeps attempt 1's beginning
    w2 = SeriesWriter(tmp_path, "rank-0", attempt=2)
    w2.add({"t": t0 + 100, "step": 0, "loss": 2.0}, steps=[(0, 2.0)])
    w2.maybe_write(force=True)
    data, _ = read_series(series_path(tmp_path, "rank-0"))
    assert (0, 1.0) in metric_values(data, "loss")


@pytest.mark.slow
def test_a_fast_loop_that_turns_nan_keeps_its_whole_curve_and_ups_plot_draws_it(runs_root, tmp_path):
    res = run_ups("launch", "torchrun", "--detach", "--json", "--nproc-per-node", "2", NAN_DDP, "--steps", str(STEPS),
                  "--nan-rank", "1", "--nan-step", str(NAN_STEP), "--step-time", "0", timeout=60, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    run = RunDir(json.loads(res.stdout)["run_dir"])
    wait_for(lambda: run.read_manifest()["state"] in ("succeeded", "failed"), 180, interval=0.3, message="the run's end")
    log = run.log_path("job").read_text(errors="replace")
    rates = [float(r) for r in re.findall(r"rank \d: (\d+) steps/s", log)]
    assert len(rates) == 2 and min(rates) >= 50, log[-2000:]  # a fast loop: many steps per heartbeat

    found, problems = read_run_series(run.path)
    assert not problems and {"rank-0", "rank-1"} <= set(found), problems
    for name, last_finite in (("rank-1", NAN_STEP - 1), ("rank-0", NAN_STEP)):  # rank 0: poisoned by the all-reduce
        pairs = metric_values(found[name], "loss")
        steps = {s for s, _ in pairs}
        finite = [s for s, v in pairs if math.isfinite(v)]
        assert min(finite) == 0 and max(finite) == last_finite, (name, sorted(steps)[:20])  # the whole curve up to the NaN
        assert set(range(NAN_STEP - 10, NAN_STEP + 1)) <= steps, (name, sorted(steps))  # every step from 10 before it
        assert steps >= set(range(STEPS - RECENT, STEPS))  # and the last RECENT in full
    assert found["rank-1"]["first_nonfinite"]["step"] == NAN_STEP
    # the console's run chart: the same whole curve, up to the NaN
    shown = {s.name: s for s in rank_series(load_run_view(run))}
    for name, last_finite in (("rank-1", NAN_STEP - 1), ("rank-0", NAN_STEP)):
        finite = [s for s, v in shown[name].loss_pairs if math.isfinite(v)]
        assert min(finite) == 0 and max(finite) == last_finite, name
        assert set(range(NAN_STEP - 10, NAN_STEP + 1)) <= {s for s, _ in shown[name].loss_pairs}
    assert shown["rank-1"].nonfinite_step == NAN_STEP

    res = run_ups("plot", str(run.path), "--metric", "loss", "--plain", "--width", "80")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert f"not finite: rank 0 from step {NAN_STEP + 1}, rank 1 from step {NAN_STEP}" in res.stdout, res.stdout
    assert re.fullmatch(rf"\s*step 0\s+{NAN_STEP}", lines[-2]), res.stdout  # drawn from step 0 to the last finite one
    assert "● rank 0  o rank 1" in lines[-1]
    body = "\n".join(ln.split("|", 1)[1] for ln in lines if "|" in ln)
    assert body.count("o") >= 20 and body.count("●") >= 20, res.stdout  # a curve, not a handful of points
