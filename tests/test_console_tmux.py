"""The console in a real terminal: tmux runs `ups console`, keys kill a hung worker."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import uuid

import psutil
import pytest
from helpers import wait_for

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux not installed (.ci/run installs it)")


def tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], capture_output=True, text=True, check=False).stdout


@pytest.mark.slow
def test_keys_in_a_real_terminal_kill_the_hung_worker(hung_precompute, runs_root):
    run = hung_precompute
    session = f"ups-test-{uuid.uuid4().hex[:8]}"
    cmd = (f"cd {shlex.quote(os.getcwd())} && env PYTHONPATH={shlex.quote(os.environ['PYTHONPATH'])} "
           f"{shlex.quote(sys.executable)} -m ups console --runs-dir {shlex.quote(str(runs_root))} --refresh 0.3")
    tmux("new-session", "-d", "-s", session, "-x", "120", "-y", "36", cmd)
    try:
        screen = lambda: tmux("capture-pane", "-p", "-t", session)  # noqa: E731
        wait_for(lambda: run.run_id in screen(), 30, interval=0.2, message="the run listed in the terminal")
        tmux("send-keys", "-t", session, "Enter")
        wait_for(lambda: "unresponsive" in screen(), 40, interval=0.2, message="worker 1 unresponsive in the terminal")
        pid = next(int(p.read_text().split('"pid":')[1].split(",")[0]) for p in run.status_dir.glob("rank-0-worker-1.json"))
        tmux("send-keys", "-t", session, "Tab")  # focus the workers table
        wait_for(lambda: True, 0.5)
        tmux("send-keys", "-t", session, "Down")  # worker 1
        tmux("send-keys", "-t", session, "k")
        wait_for(lambda: f"pid {pid}" in screen(), 15, interval=0.2, message="the kill confirmation with the pid")
        tmux("send-keys", "-t", session, "t")
        wait_for(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie", 20, message="worker gone")
        wait_for(lambda: "terminated" in screen() or "killed" in screen(), 15, interval=0.2, message="the result on screen")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n--- terminal ---\n{screen()}") from None
    finally:
        tmux("send-keys", "-t", session, "q")
        tmux("kill-session", "-t", session)
    assert any(e["event"] == "signal" and e["actor"] == "console" and e["pid"] == pid for e in run.read_events())
