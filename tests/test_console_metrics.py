"""The run screen's Metrics tab: per-rank sparklines and the run-level loss chart, drawn from
the ranks' series files (written by the same SeriesWriter the heartbeat thread uses)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from test_console_snapshots import T0, app_for, make_run, rec
from textual.widgets import Sparkline

from ups.status.series import SeriesWriter

RUN = "20261122-100000-torchrun-ef56"


def _series(root: Path, name: str, *, nan_from: int | None = None, slow_from: int | None = None) -> None:
    w = SeriesWriter(root / RUN, name)
    for i in range(80):
        loss = 2.0 * 0.97 ** i + 0.05 * ((i * 7) % 5) / 5
        if nan_from is not None and i >= nan_from:
            loss = float("nan")
        w.add({"t": T0 - 80 + i, "step": i * 5, "loss": loss, "lr": 1e-3,
               "rate": 4.0 if slow_from is None or i < slow_from else 1.5, "mem": (2 << 30) + i * (8 << 20)})
    w.maybe_write(force=True)


@pytest.fixture
def train_runs(tmp_path: Path) -> Path:
    root = tmp_path / "runs"
    make_run(root, RUN, "torchrun", "running", [
        rec(RUN, "rank-0", 2001, unit="steps", total=1000, step=395, rate=4.0, phase="train", metrics={"loss": 0.04}),
        rec(RUN, "rank-1", 2002, rank=1, unit="steps", total=1000, step=395, rate=1.5, phase="train",
            metrics={"loss": "nan", "loss_nonfinite": {"step": 300, "value": "nan", "at": T0 - 20}}),
    ], world_size=2, thresholds={"stalled_after": 60, "unresponsive_after": 10})
    _series(root, "rank-0")
    _series(root, "rank-1", nan_from=60, slow_from=60)
    return root


async def _open(pilot) -> None:
    pilot.app.open_run(RUN)
    await pilot.pause()
    await pilot.pause()


def test_metrics_tab_opens_with_a_sparkline_row_per_rank(train_runs):
    asyncio.run(_metrics_tab(train_runs))


async def _metrics_tab(train_runs: Path) -> None:
    app = app_for(train_runs)
    async with app.run_test(size=(120, 40)) as pilot:
        await _open(pilot)
        screen = pilot.app.screen
        assert screen.query_one("#panels").active == "tab-metrics"  # a training run opens on its metrics
        rows = {row.id: row for row in screen.query("RankSparklines")}
        assert set(rows) == {"spark-rank-0", "spark-rank-1"}
        loss0 = rows["spark-rank-0"].query_one(".spark-loss", Sparkline).data
        assert len(loss0) == 80 and loss0[0] > loss0[-1]  # the whole series, falling
        assert len(rows["spark-rank-1"].query_one(".spark-loss", Sparkline).data) == 60  # NaNs are not drawn
        chart = str(screen.query_one("#metrics-chart").render())
        assert "not finite: rank 1 from step 300" in chart and "rank 0" in chart
        # the verdict on top says the same, naming the first rank and step
        assert "the loss became nan on rank 1 at step 300" in str(screen.query_one("#verdict").render())


@pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=["80x24", "120x40"])
def test_metrics_tab_snapshot(snap_compare, train_runs, size):
    assert snap_compare(app_for(train_runs), terminal_size=size, run_before=_open)
