"""What another user wrote never runs as you (issue 31, item 1).

A run folder planted by a second local user in a shared (1777) runs folder names a command in
its run.json. Every path that turns run-folder content into a process (`ups relaunch`, with
and without `--num-workers 0`, `ups adopt`, a launcher started on the folder by hand, the
console's `r`) must refuse it with one line saying whose the run is, and the command must
never run. A run of your own whose run.json others may write is refused the same way. A run
of your own is relaunched, and the command is shown before it runs.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import run_ups, wait_for
from test_hostile_signals import OTHER_USER, one_line_refusal, other_user

from ups.runs.rundir import RunDir, list_runs


def plant_run(root: Path, marker: Path, *, owner=None, mode: int | None = None) -> RunDir:
    """A finished run whose run.json names a command that would create ``marker``."""
    run = RunDir.create(root, "python", extra={
        "command": ["sh", "-c", f"touch {marker}"], "command_template": ["sh", "-c", f"touch {marker}"],
        "env": {}, "cwd": str(root), "top_role": "rank", "instrument": False,
    })
    run.update_manifest(state="failed", ended_at=time.time(), summary="planted")
    if owner is not None:
        for dirpath, _, files in os.walk(run.path):
            os.chown(dirpath, owner.pw_uid, owner.pw_gid)
            for f in files:
                os.chown(os.path.join(dirpath, f), owner.pw_uid, owner.pw_gid)
    if mode is not None:
        run.manifest_path.chmod(mode)
    return run


@pytest.fixture
def shared(tmp_path: Path) -> Path:
    root = tmp_path / "shared"
    root.mkdir()
    root.chmod(0o1777)
    tmp_path.chmod(0o755)
    return root


def test_a_run_planted_by_another_user_is_never_run_as_you(shared, tmp_path):
    user = other_user()
    marker = tmp_path / "ran-as-me"
    run = plant_run(shared, marker, owner=user)
    before = sorted(p.name for p in shared.iterdir())
    for args in (["relaunch", str(run.path), "--detach"], ["relaunch", str(run.path), "--num-workers", "0", "--detach"],
                 ["adopt", str(run.path), "--detach"]):
        started = time.monotonic()
        res = run_ups(*args, "--runs-dir", str(shared))
        assert time.monotonic() - started < 10
        one_line_refusal(res, f"belongs to {OTHER_USER}", "not to you")
        assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    # A launcher started on the folder by hand (what ups launch, relaunch, adopt, a restart and
    # a pipeline's stages all start) refuses it as well, before it writes anything.
    res = subprocess.run([sys.executable, "-m", "ups.launch.supervise", str(run.path)], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 2 and f"belongs to {OTHER_USER}" in res.stderr, res.stderr
    time.sleep(1.0)  # anything wrongly started has had time to run `touch`
    assert not marker.exists(), "the planted command ran as this user"
    assert sorted(p.name for p in shared.iterdir()) == before, "a new run was created"
    assert json.loads(run.manifest_path.read_text())["state"] == "failed"
    assert not run.events_path.exists() or "relaunch" not in run.events_path.read_text()


def test_a_run_of_yours_that_others_may_write_is_not_run(runs_root, tmp_path):
    marker = tmp_path / "ran"
    run = plant_run(runs_root, marker, mode=0o666)
    res = run_ups("relaunch", str(run.path), "--detach")
    one_line_refusal(res, "writable by other users")
    run.manifest_path.chmod(0o644)
    run.path.chmod(0o777)
    res = run_ups("relaunch", str(run.path), "--detach")
    one_line_refusal(res, "run folder is writable by other users")
    assert not marker.exists()


def test_relaunch_of_your_own_run_shows_the_command_then_runs_it(runs_root, tmp_path):
    marker = tmp_path / "ran"
    run = plant_run(runs_root, marker)
    res = run_ups("relaunch", str(run.path), "--json")
    assert res.returncode == 0, res.stderr
    assert f"sh -c 'touch {marker}'" in res.stderr.splitlines()[0]
    assert marker.exists()
    new = RunDir(json.loads(res.stdout)["run_dir"])
    assert new.read_manifest()["relaunched_from"] == run.run_id


@pytest.mark.slow
def test_the_console_refuses_a_planted_run_and_asks_before_relaunching_yours(shared, tmp_path):
    """The console's `r`: another user's run is refused with the owner named; your own run's
    command is shown in the confirmation, and nothing runs until it is confirmed."""
    from console.app import UpsConsole
    from console.screens.confirm import ConfirmRelaunch

    user = other_user()
    theirs_marker, mine_marker = tmp_path / "theirs", tmp_path / "mine"
    theirs = plant_run(shared, theirs_marker, owner=user)
    mine = plant_run(shared, mine_marker)
    notes: list[str] = []

    async def drive() -> tuple[list[str], list[str]]:
        app = UpsConsole(shared, run_id=theirs.run_id, refresh=0.2)
        app.notify = lambda message, **kw: notes.append(message)  # type: ignore[method-assign]
        async with app.run_test(size=(160, 40)) as pilot:
            await pilot.pause(0.5)
            await pilot.press("r")
            await pilot.pause(0.3)
            assert not isinstance(app.screen, ConfirmRelaunch)
            refused = list(notes)
            app.pop_screen()
            app.open_run(mine.run_id)
            await pilot.pause(0.5)
            await pilot.press("r")
            await pilot.pause(0.3)
            assert isinstance(app.screen, ConfirmRelaunch)
            shown = [str(label.render()) for label in app.screen.query("Label")]
            assert not mine_marker.exists()  # asked, not run
            await pilot.press("y")
            for _ in range(300):  # the action runs in a worker thread: wait for its run, 30 s at most
                if mine_marker.exists():
                    break
                await pilot.pause(0.1)
            return refused, shown

    refused, shown = asyncio.run(drive())
    assert any(f"belongs to {OTHER_USER}" in n for n in refused), refused
    assert any(f"touch {mine_marker}" in line for line in shown), shown
    wait_for(mine_marker.exists, 30, message="the confirmed relaunch ran")
    assert not theirs_marker.exists()
    assert len([s for s in list_runs(shared)]) == 3  # theirs, mine, and mine relaunched
