"""The straggler, shown wherever a reader looks: `ups status --json` and its table, the
Prometheus exporter, `ups plot --metric step_time` and the console. All of them read one real
2-rank job (tests/programs/straggler_ranks.py): each rank a process with its own Reporter,
driven through the calls the torch hooks make, rank 1's own work 10 ms longer a step and
rank 0 waiting for it in an all_reduce, every step (the judgement itself, over made-up
windows, is tests/test_why_rules.py's)."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from pathlib import Path

import pytest
from helpers import run_ups, status_now, wait_for

from ups.launch.spawn import launch_run
from ups.runs.rundir import FINAL_RUN_STATES, RunDir

PROGRAM = str(Path(__file__).parent / "programs" / "straggler_ranks.py")
NARROW = {"COLUMNS": "80"}
PARTS = {"step", "data", "collective", "backward", "other"}


@pytest.fixture(scope="module")
def straggler_run(tmp_path_factory) -> RunDir:
    """The job, running, once its rank 1 is named the straggler (about a second of steps)."""
    root = tmp_path_factory.mktemp("straggler") / "runs"
    root.mkdir()
    run = launch_run(root, "python", [sys.executable, PROGRAM, "10"], argv=["test"],
                     thresholds={"heartbeat_interval": 0.3})
    try:
        wait_for(lambda: status_now(run)["straggler"], 60, interval=0.3, message="rank 1 named the straggler")
        yield run
    finally:
        run_ups("kill", str(run.path), "--force")
        wait_for(lambda: run.read_manifest().get("state") in FINAL_RUN_STATES, 30, message="the job's end")


def test_status_json_names_the_straggler_and_gives_each_rank_its_wait_own_time_and_score(straggler_run):
    res = run_ups("status", str(straggler_run.path), "--json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    found = data["straggler"]
    assert (found["rank"], found["cause"], found["threshold"]) == (1, "compute", 0.85), found
    assert found["score"] < 0.85 and 0 < found["cost"] < 1 and "own work outside backward" in found["why"]
    assert found["gpu_hours_per_day"] == pytest.approx(found["cost"] * 2 * 24, abs=0.02)
    rows = {p["name"]: p for p in data["processes"]}
    assert rows["launcher"]["step_time"] is None  # ranks only
    zero, one = rows["rank-0"], rows["rank-1"]
    assert one["health"] == "straggler" and zero["health"] == "ok"
    for row in (zero, one):
        t, parts = row["step_time"], row["metrics"]["step_parts"]
        # the record's medians, and what ups.status.straggler makes of them: own = step - wait
        assert (t["rank"], t["step_s"], t["collective_s"], t["other_s"]) == (
            row["rank"], parts["step"][0], parts["collective"][0], parts["other"][0])
        assert t["own_s"] == pytest.approx(t["step_s"] - t["wait_s"], abs=2e-6)
    # rank 0 waits ~10 ms a step in the all_reduce for rank 1, which hardly waits
    assert zero["step_time"]["wait_s"] > 0.005 > one["step_time"]["wait_s"]
    assert zero["step_time"]["score"] == 1.0 and one["step_time"]["score"] == found["score"]


def test_status_table_shows_each_ranks_score_and_the_straggler_in_80_columns(straggler_run):
    res = run_ups("status", str(straggler_run.path), env=NARROW)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert max(len(ln) for ln in lines) <= 80, res.stdout
    header = next(ln for ln in lines if ln.startswith("PROCESS"))
    assert "SCORE" in header and "HEALTH" in header, res.stdout
    at = header.index("SCORE")
    zero = next(ln for ln in lines if ln.startswith("rank 0 "))
    one = next(ln for ln in lines if ln.startswith("rank 1 "))
    assert zero[at:at + 5] == "1.00 " and re.fullmatch(r"0\.[0-7]\d ", one[at:at + 5]), res.stdout
    assert one.rstrip().endswith("straggler") and zero.rstrip().endswith("ok"), res.stdout
    text = " ".join(res.stdout.split())
    assert re.search(r"straggler: rank 1, score 0\.\d\d \(cause: compute\); the job runs \d+% below its pace without "
                     r"it, [\d.]+ GPU-hours a day on 2 ranks", text), res.stdout


def test_the_exporter_exports_each_ranks_step_parts_and_straggler_score(straggler_run):
    from prometheus_client.parser import text_string_to_metric_families

    from ups.exporter.collector import RunsCollector
    from ups.exporter.text import exposition

    text = exposition(RunsCollector(run=straggler_run).collect()).decode()
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
    parts = {(s.labels["rank"], s.labels["part"]): s.value for s in samples if s.name == "ups_step_part_seconds"}
    score = {s.labels["rank"]: s.value for s in samples if s.name == "ups_straggler_score"}
    assert set(parts) == {(r, p) for r in ("0", "1") for p in PARTS}, parts
    assert parts[("0", "collective")] > 0.005 > parts[("1", "collective")]  # rank 0 waits in the all_reduce
    assert parts[("1", "other")] > parts[("0", "other")] + 0.005  # rank 1's own work is 10 ms longer
    assert score["0"] == 1.0 and score["1"] < 0.85, score
    for s in samples:
        if s.name in ("ups_step_part_seconds", "ups_straggler_score"):
            assert set(s.labels) == {"run", "kind", "node", "rank"} | ({"part"} if "part" in s.labels else set())
            assert s.labels["run"] == straggler_run.run_id


def test_plot_draws_each_ranks_median_step_time(straggler_run):
    from ups.status.series import metric_values, read_run_series

    def step_times():
        found, _ = read_run_series(straggler_run.path)
        got = {name: [v for _, v in metric_values(data, "step_time")] for name, data in found.items()}
        return got if len(got) == 2 and all(len(v) >= 2 for v in got.values()) else None

    got = wait_for(step_times, 30, interval=0.3, message="the ranks' series with a step time")
    assert all(0.01 < v < 0.5 for values in got.values() for v in values), got  # ~17 ms a step on each rank
    res = run_ups("plot", str(straggler_run.path), "--metric", "step_time", "--plain", "--width", "80")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0] == f"{straggler_run.run_id}: median step time (s)" and max(len(ln) for ln in lines) <= 80
    assert "● rank 0  o rank 1" in res.stdout and lines[-2].strip().startswith("step "), res.stdout
    points = json.loads(run_ups("status", str(straggler_run.path), "--json").stdout)["series"]["rank-1"]["points"]
    assert any(isinstance(p["step_time"], float) for p in points)


def test_console_draws_each_ranks_step_bar_and_names_the_straggler(straggler_run):
    asyncio.run(_console(straggler_run))


async def _console(run: RunDir) -> None:
    from test_console import cell, until

    from console.app import UpsConsole

    app = UpsConsole(run.path.parent, refresh=0.3)
    async with app.run_test(size=(120, 36)) as pilot:
        await until(pilot, lambda: app.snapshot and app.snapshot.runs, message="the run listed")
        app.open_run(run.run_id)
        table = await until(pilot, lambda: app.screen.query_one("#ranks"), message="the run screen")
        await until(pilot, lambda: "STEP TIME" in [str(c.label) for c in table.columns.values()], message="the bars")
        bar = re.compile(r"[▓░█▒]{12} (\d\.\d\d)")
        one = await until(pilot, lambda: bar.fullmatch(cell(table, "rank-1", "steptime")), message="rank 1's bar")
        zero = bar.fullmatch(cell(table, "rank-0", "steptime"))
        assert zero and zero.group(1) == "1.00" and float(one.group(1)) < 0.85
        # rank 1's step is mostly its own rest (▒), rank 0's a good part waiting for it (░)
        assert cell(table, "rank-1", "steptime").count("▒") > cell(table, "rank-0", "steptime").count("▒")
        assert cell(table, "rank-0", "steptime").count("░") >= 4
        assert cell(table, "rank-1", "health") == "straggler"
        table.focus()
        table.move_cursor(row=table.get_row_index("rank-1"))
        line = app.screen.query_one("#steptime")
        await until(pilot, lambda: "rank 1 step" in str(line.render()), message="rank 1's step in words")
        assert "(straggler: compute)" in str(line.render())
