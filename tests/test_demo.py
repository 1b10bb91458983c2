"""`ups demo` on a fresh folder: data made on first use, precompute, then 2-rank training."""

from __future__ import annotations

import json

import pytest
from helpers import run_ups

from ups.runs.rundir import list_runs


@pytest.mark.slow
def test_demo_end_to_end_without_a_terminal(tmp_path, runs_root):
    res = run_ups("demo", "--train-steps", "10", cwd=tmp_path, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert (tmp_path / "data" / "demo" / "burgers1d_train.index.json").exists()
    runs = list_runs(runs_root)
    assert [(r.kind, r.state) for r in runs] == [("train", "succeeded"), ("precompute", "succeeded")]
    assert "making demo data" in res.stderr
    assert run_ups("cache", "verify", str(tmp_path / "cache" / "demo")).returncode == 0
    again = run_ups("demo", "--train-steps", "0", "--json", cwd=tmp_path, timeout=300)  # data reused, cache resumed
    assert "making demo data" not in again.stderr
    assert json.loads(again.stdout.strip().splitlines()[0])["run_id"]
