"""Where an attached job's output goes when its stdout is a pipe (issue 49): the file that the
command on the right of the shell's ``|`` writes (tee), never a file of a parent that collects
its child's output on another descriptor (subprocess's ``stdout=PIPE``, a test runner, an IDE).
Real processes, read only through /proc (ups.attach.output.piped_log)."""

from __future__ import annotations

import subprocess
import sys

import psutil
import pytest
from helpers import wait_for

from ups.attach.output import piped_log

pytestmark = pytest.mark.notorch  # also run on each other Python, without torch (tests/test_pythons.py)

WRITER = "import time\nprint('step 1', flush=True)\ntime.sleep(60)\n"


def child_of(parent: int) -> int | None:
    try:
        with open(f"/proc/{parent}/task/{parent}/children") as f:
            kids = [int(k) for k in f.read().split()]
    except OSError:
        return None
    return kids[0] if kids else None


def test_the_file_tee_writes_behind_a_pipe_is_the_log(tmp_path):
    log = tmp_path / "train.log"
    shell = subprocess.Popen(["bash", "-c", f"{sys.executable} -c \"{WRITER}\" 2>&1 | tee {log} > /dev/null"],
                             start_new_session=True)
    try:
        wait_for(lambda: log.exists() and "step 1" in log.read_text(), 30, message="tee's first line")
        job = wait_for(lambda: next((c.pid for c in psutil.Process(shell.pid).children()
                                     if c.name().startswith("python")), None), 10, message="the writer")
        found = piped_log(job)
        assert found is not None and found[0] == str(log) and found[2] == "tee", found
    finally:
        subprocess.run(["pkill", "-KILL", "-s", str(shell.pid)])
        shell.wait(timeout=10)


def test_a_parent_collecting_its_childs_output_is_no_log(tmp_path):
    """The parent reads the pipe on its own descriptor (not its stdin) and writes files of its own:
    none of them is the child's log."""
    own = tmp_path / "parent_own.txt"
    parent = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys, time\n"
        f"own = open({str(own)!r}, 'w')\n"
        f"p = subprocess.Popen([sys.executable, '-c', {WRITER!r}], stdout=subprocess.PIPE)\n"
        "own.write(p.stdout.readline().decode()); own.flush()\n"
        "time.sleep(60)\n")])
    try:
        wait_for(lambda: own.exists() and "step 1" in own.read_text(), 30, message="the parent read its child's line")
        child = wait_for(lambda: child_of(parent.pid), 10, message="the child")
        assert piped_log(child) is None
    finally:
        subprocess.run(["pkill", "-KILL", "-P", str(parent.pid)])
        parent.kill()
        parent.wait(timeout=10)
