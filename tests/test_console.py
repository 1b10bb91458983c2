"""The console driven through Textual's Pilot, on run folders made by real job processes."""

from __future__ import annotations

import asyncio
import stat

import psutil
import pytest
from helpers import run_ups

from console.app import UpsConsole
from console.screens.confirm import ConfirmKill
from ups.data.synth import synthesize
from ups.runs.rundir import RunDir, list_runs


async def until(pilot, predicate, timeout: float = 30.0, message: str = "condition"):
    loops = int(timeout / 0.1)
    for _ in range(loops):
        try:
            value = predicate()
        except Exception:  # noqa: BLE001 - widgets may not exist yet
            value = None
        if value:
            return value
        await pilot.pause(0.1)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {message}")


def cell(table, row: str, col: str) -> str:
    value = table.get_cell(row, col)
    return getattr(value, "plain", str(value))


async def _test_hung_worker_shows_unresponsive_and_is_killed_then_fallback(hung_precompute, runs_root):
    run = hung_precompute
    app = UpsConsole(runs_root, refresh=0.3)
    async with app.run_test(size=(120, 36)) as pilot:
        await until(pilot, lambda: app.snapshot and app.snapshot.runs, message="the run listed")
        await pilot.press("enter")
        workers = await until(pilot, lambda: app.screen.query_one("#workers"), message="run screen")
        await until(pilot, lambda: "unresponsive" in cell(workers, "rank-0-worker-1", "health"), 40,
                    message="worker 1 unresponsive on screen")
        assert "no heartbeat" in cell(workers, "rank-0-worker-1", "why")
        pid = int(cell(workers, "rank-0-worker-1", "pid"))
        # the FIFO it hangs opening is the run's, in its faults/ folder (never left behind in /tmp)
        fifo = run.path / "faults" / f"hang-fifo-{pid}"
        assert fifo.exists() and stat.S_ISFIFO(fifo.lstat().st_mode), sorted(p.name for p in fifo.parent.iterdir())

        workers.focus()
        workers.move_cursor(row=workers.get_row_index("rank-0-worker-1"))
        await pilot.press("k")
        modal = await until(pilot, lambda: isinstance(app.screen, ConfirmKill) and app.screen, message="kill confirmation")
        text = " ".join(str(w.render()) for w in modal.query("Label"))
        assert f"pid {pid}" in text and "command:" in text and "user" in text
        await pilot.press("t")
        await until(pilot, lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie", 20,
                    message="the hung worker gone")
        kills = [e for e in run.read_events() if e["event"] == "signal" and e["actor"] == "console"]
        assert kills and kills[0]["pid"] == pid

        await pilot.press("f")
        await until(pilot, lambda: any(e["event"] == "control.handled" for e in run.read_events()), 30,
                    message="the job to take the fallback request")
    assert any(e["event"] == "fallback" and e["actor"] == "job" for e in run.read_events())
    from helpers import wait_for

    wait_for(lambda: run.read_manifest()["state"] in ("succeeded", "partial", "failed", "killed"), 120, message="run end")
    assert run.read_manifest()["state"] == "succeeded"  # every sample cached in legacy mode


async def _test_readonly_removes_every_action(hung_precompute, runs_root):
    app = UpsConsole(runs_root, refresh=0.3, readonly=True)
    async with app.run_test(size=(120, 36)) as pilot:
        await until(pilot, lambda: app.snapshot and app.snapshot.runs, message="the run listed")
        await pilot.press("enter")
        await until(pilot, lambda: app.screen.query_one("#workers"), message="run screen")
        await pilot.press("k")
        await pilot.press("f")
        await pilot.pause(0.5)
        assert not isinstance(app.screen, ConfirmKill)
        footer_keys = {key for key, ab in app.screen.active_bindings.items() if ab.enabled and ab.binding.show}
        assert "escape" in footer_keys
        assert not footer_keys & {"k", "K", "s", "f", "r"}
    assert not [e for e in hung_precompute.read_events() if e.get("actor") == "console"], [e for e in hung_precompute.read_events() if e.get("actor") == "console"]


async def _test_corrupt_run_is_a_row_not_a_crash(runs_root):
    good = RunDir.create(runs_root, "precompute")
    bad = runs_root / "20990101-000000-train-dead"
    (bad / "status").mkdir(parents=True)
    (bad / "run.json").write_text("{half")
    (good.status_dir / "rank-0.json").write_text("{torn")
    app = UpsConsole(runs_root, poll=False)
    async with app.run_test(size=(80, 24)) as pilot:
        table = await until(pilot, lambda: app.screen.query_one("#runs"), message="runs table")
        assert cell(table, bad.name, "health") == "unreadable" and "not valid JSON" in cell(table, bad.name, "why")
        assert "unreadable status file" in cell(table, good.run_id, "why")
        app.open_run(good.run_id)
        header = await until(pilot, lambda: app.screen.query_one("#run-header"), message="run screen")
        await pilot.pause(0.2)
        assert "unreadable status file rank-0.json" in str(header.render())


def test_console_command_help_and_bad_run(runs_root):
    res = run_ups("console", "--help")
    assert res.returncode == 0 and "--readonly" in res.stdout
    res = run_ups("console", "nope")
    assert res.returncode == 2 and "no run 'nope'" in res.stderr



@pytest.mark.slow
def test_hung_worker_shows_unresponsive_and_is_killed_then_fallback(hung_precompute, runs_root):
    asyncio.run(_test_hung_worker_shows_unresponsive_and_is_killed_then_fallback(hung_precompute, runs_root))


def test_readonly_removes_every_action(hung_precompute, runs_root):
    asyncio.run(_test_readonly_removes_every_action(hung_precompute, runs_root))


def test_corrupt_run_is_a_row_not_a_crash(runs_root):
    asyncio.run(_test_corrupt_run_is_a_row_not_a_crash(runs_root))


async def _test_launch_form_starts_a_real_run_and_opens_it(tmp_path, runs_root):
    from textual.widgets import Input

    synthesize(tmp_path / "data", "burgers1d", "train", 8)
    app = UpsConsole(runs_root, refresh=0.3)
    async with app.run_test(size=(100, 36)) as pilot:
        await until(pilot, lambda: app.snapshot is not None, message="first snapshot")
        await pilot.press("l")
        form = await until(pilot, lambda: app.screen.query_one("#root", Input), message="launch form")
        form.value = str(tmp_path / "data")
        app.screen.query_one("#cache", Input).value = str(tmp_path / "cache")
        await pilot.press("ctrl+s")
        header = await until(pilot, lambda: app.screen.query_one("#run-header"), 60, message="the new run opened")
        await until(pilot, lambda: "precompute" in str(header.render()), 30, message="its header")
    runs = list_runs(runs_root)
    assert len(runs) == 1 and runs[0].kind == "precompute"
    assert runs[0].manifest["config"]["root"] == str(tmp_path / "data")
    assert next(e for e in runs[0].run.read_events() if e["event"] == "launch")["actor"] == "console"


async def _test_doctor_screen_shows_the_quick_report(runs_root):
    app = UpsConsole(runs_root, poll=False)
    async with app.run_test(size=(100, 36)) as pilot:
        await pilot.press("d")
        table = await until(pilot, lambda: app.screen.query_one("#doctor").row_count == 15 and app.screen.query_one("#doctor"),
                            30, message="15 checks listed")
        statuses = {str(table.get_row_at(i)[0]): getattr(table.get_row_at(i)[1], "plain", "") for i in range(15)}
        assert statuses["python"] == "ok" and statuses["ddp"] == "skip"


def test_launch_form_starts_a_real_run_and_opens_it(tmp_path, runs_root):
    asyncio.run(_test_launch_form_starts_a_real_run_and_opens_it(tmp_path, runs_root))


def test_doctor_screen_shows_the_quick_report(runs_root):
    asyncio.run(_test_doctor_screen_shows_the_quick_report(runs_root))


def test_a_run_whose_launcher_has_not_written_its_record_yet_is_not_settled(tmp_path, procs):
    """The first second of every launch: run.json names a live launcher, no record exists yet.
    The console must read it as supervised, never settle it as gone (a reader did: 'lost')."""
    from helpers import wait_for

    from console.snapshots import Poller
    from ups.runs.rundir import MANIFEST_SCHEMA, RunDir
    from ups.status.procs import process_start_time

    launcher = procs.python("import time; time.sleep(60)")
    start = wait_for(lambda: process_start_time(launcher.pid), 10, message="the stand-in launcher")
    run = RunDir(tmp_path / "runs" / "r1")
    for sub in ("status", "stacks", "logs", "control"):
        (run.path / sub).mkdir(parents=True)
    run.write_manifest({"schema": MANIFEST_SCHEMA, "id": "r1", "kind": "python", "state": "running", "created_at": 0, "argv": [],
                        "config": {}, "launcher": {"pid": launcher.pid, "pid_start": start}})
    snap = Poller(tmp_path / "runs", gpu_provider=None).snapshot("r1", None)
    assert snap.detail.view.supervision == "supervised" and snap.runs[0].state == "running"
    assert run.read_manifest()["state"] == "running"
    assert not (run.path / "events.jsonl").exists() or not run.read_events()
