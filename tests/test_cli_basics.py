"""What a newcomer tries first: --version, tab completion, comma lists, the launcher's row,
the follow line of a finished run."""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
import textwrap
from importlib.metadata import PackageNotFoundError, version

import pytest
from helpers import run_ups, wait_for

from ups.cli.follow import follow_line
from ups.data.synth import synthesize
from ups.launch.spawn import launch_run
from ups.runs.rundir import RunDir
from ups.runs.view import load_run_view

FINAL = ("succeeded", "partial", "failed", "killed")


@pytest.mark.notorch
def test_version_names_ups_python_and_torch():
    res = run_ups("--version")
    assert res.returncode == 0, res.stderr
    try:
        torch = version("torch")
    except PackageNotFoundError:  # ups installed without torch (tests/test_pythons.py)
        torch = "not installed"
    python = platform.python_version()
    assert res.stdout.startswith(f"ups {version('ups')} (python {python}, ") and f"torch {torch})" in res.stdout


def complete(words: str) -> list[str]:
    """What bash offers on <Tab> after ``words``, through the installed entry point's protocol."""
    env = dict(os.environ, _UPS_COMPLETE="complete_bash", COMP_WORDS=words, COMP_CWORD=str(len(words.split()) - 1))
    res = subprocess.run([sys.executable, "-c", "import sys; sys.argv[0] = 'ups'; from ups.cli.app import main; main()"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert res.returncode == 0, res.stderr
    return res.stdout.split()


@pytest.mark.notorch
def test_shell_completion_is_offered_and_completes_commands_and_task_lists():
    help_text = run_ups("--help").stdout
    assert "--install-completion" in help_text and "--show-completion" in help_text
    assert complete("ups launch tr") == ["train"]
    assert complete("ups launch train --tasks advection1d,da") == ["advection1d,darcy2d"]


def test_tasks_and_splits_take_a_comma_list(tmp_path, runs_root):
    for split in ("train", "val"):
        synthesize(tmp_path / "data", "burgers1d", split, 4, timesteps=4, resolution=16)
        synthesize(tmp_path / "data", "advection1d", split, 4, timesteps=4, resolution=16)
    res = run_ups("launch", "precompute", "--root", str(tmp_path / "data"), "--tasks", "burgers1d,advection1d",
                  "--splits", "train,val", "--cache-dir", str(tmp_path / "cache"), "--num-workers", "0", "--json")
    assert res.returncode == 0, res.stderr
    run = RunDir(json.loads(res.stdout)["run_dir"])
    config = run.read_manifest()["config"]
    assert config["tasks"] == ["burgers1d", "advection1d"] and config["splits"] == ["train", "val"]
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [
        "advection1d_train", "advection1d_val", "burgers1d_train", "burgers1d_val"]
    # train: both names of the list are checked (darcy2d has no cache here: named, nothing launched)
    res = run_ups("launch", "train", "--cache-dir", str(tmp_path / "cache"), "--tasks", "advection1d,darcy2d")
    assert res.returncode == 2 and "darcy2d_train: no latent cache" in res.stderr and "Traceback" not in res.stderr
    res = run_ups("launch", "train", "--tasks", ",")
    assert res.returncode == 2 and "--tasks" in res.stderr and "names nothing" in res.stderr
    assert len(list(runs_root.iterdir())) == 1


# A job whose one rank is done at once, then lingers before it exits, as a rank that
# writes a last checkpoint or waits in destroy_process_group does.
LINGER = textwrap.dedent(
    """
    import time
    from ups.status import Reporter
    with Reporter.from_env(total=3, unit="steps", interval=0.2) as rep:
        rep.phase("train")
        rep.advance(3)
        rep.done()
        time.sleep(30)
    """
)


def test_finished_work_reads_done_not_the_launchers_starting(runs_root):
    run = launch_run(runs_root, "train", [sys.executable, "-c", LINGER], argv=["test"])
    try:
        wait_for(lambda: (p := load_run_view(run).process("rank-0")) and p.record.state == "done", 30, message="rank done")
        view = load_run_view(run)
        launcher = view.process("launcher")  # still supervising: its own health must not colour the run's
        assert launcher.record.state == "running" and launcher.verdict.health.value in ("ok", "starting")
        line = follow_line(view)
        assert re.search(r"3/3 \(100%\).*  done$", line), line  # the follow view's line
        row = [r for r in json.loads(run_ups("runs", "--json").stdout)["runs"] if r["id"] == run.run_id][0]
        assert row["health"] == "done"
        status = run_ups("status", run.run_id).stdout
        launcher = [ln for ln in status.splitlines() if ln.startswith("launcher ")]
        assert len(launcher) == 1 and launcher[0].split()[3] == "-", status  # PROGRESS: none to show
    finally:
        run_ups("kill", run.run_id, "--force")
