"""The run screen's bar of where each rank's step goes (input, waiting for peers, backward,
rest) with its straggler score, and the selected rank's step in words: a 4-rank DDP run whose
rank 2 waits 50 ms a step for its DataLoader while the others wait for it inside backward()
(DDP's all-reduce). Fixed clock, synthetic records, fake process table, as the other snapshots."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from test_console_snapshots import app_for, make_run, rec

RUN = "20261122-110000-torchrun-5a7e"
PIDS = (1001, 1002, 2001, 2002)  # alive in the snapshots' process table


def step_parts(data: float, collective: float, backward: float, other: float) -> dict:
    """A rank's metrics.step_parts (ups.status.steptime): medians, and a p90 a fifth above."""
    step = data + collective + backward + other
    return {"n": 80, "window_s": 10.0, "step_mean": step, "runq": 0.01, "cpu": 0.9,
            **{k: [v, round(v * 1.2, 6)] for k, v in (("step", step), ("data", data), ("collective", collective),
                                                      ("backward", backward), ("other", other))}}


@pytest.fixture
def ddp_runs(tmp_path: Path) -> Path:
    root = tmp_path / "runs"
    ranks = []
    for r, pid in enumerate(PIDS):
        # rank 2: 54 ms for its batch, 40 ms of backward; the others 4 ms, and 90 ms in backward
        # (its 40 ms and 50 ms waiting in DDP's all-reduce for rank 2); 2 ms in a loss all_reduce, 30 ms of the rest
        parts = step_parts(0.054, 0.002, 0.040, 0.030) if r == 2 else step_parts(0.004, 0.002, 0.090, 0.030)
        ranks.append(rec(RUN, f"rank-{r}", pid, rank=r, local_rank=r, world_size=4, unit="steps", total=5000, step=1800,
                         rate=7.9, phase="train", metrics={"loss": 0.31, "step_parts": parts}))
    make_run(root, RUN, "torchrun", "running", ranks, world_size=4,
             thresholds={"stalled_after": 60, "unresponsive_after": 10})
    # A run of the same box with no step window (a precompute): its table has no STEP TIME column.
    make_run(root, "20261122-091500-precompute-ab12", "precompute", "running", [
        rec("20261122-091500-precompute-ab12", "rank-0", 1002)])
    return root


async def _open(pilot, run: str = RUN, rank: str = "rank-2") -> None:
    pilot.app.open_run(run)
    await pilot.pause()
    await pilot.pause()
    await _select(pilot, rank)


async def _select(pilot, rank: str) -> None:
    """Move to a rank's row; the next tick (no poller here: one poll now) shows its detail."""
    table = pilot.app.screen.query_one("#ranks")
    table.focus()
    table.move_cursor(row=table.get_row_index(rank))
    await pilot.pause()
    pilot.app.poll_once()
    await pilot.pause()


def _cell(table, row: str, col: str) -> str:
    value = table.get_cell(row, col)
    return getattr(value, "plain", str(value))


def test_each_rank_has_a_bar_of_its_step_and_its_score_and_the_straggler_its_cause(ddp_runs):
    asyncio.run(_bars(ddp_runs))


async def _bars(root: Path) -> None:
    app = app_for(root)
    async with app.run_test(size=(120, 36)) as pilot:
        await _open(pilot)
        screen = pilot.app.screen
        table = screen.query_one("#ranks")
        assert [str(c.label) for c in table.columns.values()][:3] == ["PROCESS", "HEALTH", "STEP TIME"]
        # 12 cells in proportion: rank 2's 54 ms of input, no wait, 42 ms backward and collectives, 30 ms rest ...
        assert _cell(table, "rank-2", "steptime") == "▓▓▓▓▓████▒▒▒ 0.60"
        # ... the others' 4 ms input (no cell), 50 ms waiting for it, the shared 42 ms, 30 ms rest
        for r in (0, 1, 3):
            assert _cell(table, f"rank-{r}", "steptime") == "░░░░░████▒▒▒ 1.00"
        assert _cell(table, "rank-2", "health") == "straggler" and _cell(table, "rank-0", "health") == "ok"
        line = screen.query_one("#steptime")
        assert line.display
        said = str(line.render())
        for words in ("rank 2 step 126 ms", "input 54 ms", "peer wait 0 ms", "backward 42 ms", "rest 30 ms",
                      "score 0.60 (straggler: input)"):
            assert words in said, said
        # Another rank selected: its own figures, no straggler's words.
        await _select(pilot, "rank-0")
        said = str(line.render())
        assert "rank 0 step 126 ms" in said and "peer wait 50 ms" in said and "straggler" not in said, said

        # A run without step windows: the table as it always was, and no line.
        pilot.app.pop_screen()
        await _open(pilot, "20261122-091500-precompute-ab12", "rank-0")
        table = pilot.app.screen.query_one("#ranks")
        assert "STEP TIME" not in [str(c.label) for c in table.columns.values()]
        assert not pilot.app.screen.query_one("#steptime").display


@pytest.mark.parametrize("size", [(80, 24), (120, 36)], ids=["80x24", "120x36"])
def test_straggler_run_snapshot(snap_compare, ddp_runs, size):
    assert snap_compare(app_for(ddp_runs), terminal_size=size, run_before=_open)
