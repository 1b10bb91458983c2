"""Every read command writes nothing (issue 27).

A dead run (its launcher and every process gone, never settled: a reboot, a kill -9) is the
case where a reader is tempted to write: it decides the run's end from the records. Each read
command (`ups runs`, `status`, `why`, `stacks --group` reading saved stacks, `status --json
--follow`) and the console's poll must answer the same on a read-only folder as on a writable
copy, and leave that copy byte for byte as it was. Writing the end down is `ups runs --settle`.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import run_ups

from ups.runs.rundir import RunDir

CLOCKS = {"age", "read_at", "heartbeat_age", "progress_age", "eta_s"}
PLACES = {"path", "run_dir"}  # the two copies live in two folders


@functools.cache
def stack_dump() -> str:
    """One real faulthandler dump, the same in every copy (its thread address differs from one
    process to the next, and `ups status --json --follow` sends a stack file's text)."""
    return subprocess.run([sys.executable, "-c", "import faulthandler, sys\ndef main():\n"
                           "    faulthandler.dump_traceback(sys.stdout)\nmain()\n"], capture_output=True, text=True).stdout


def dead_run(finished_run: Path, root: Path) -> RunDir:
    """A copy of a real finished run whose end was never written: run.json still says
    running, its launcher's pid belongs to nobody now; rank 0 left a stack dump."""
    shutil.copytree(finished_run, root / finished_run.name, symlinks=True)
    run = RunDir(root / finished_run.name)
    m = json.loads(run.manifest_path.read_text())
    for key in ("summary", "verdict", "failure", "exit_code", "ranks"):
        m.pop(key, None)
    m.update(state="running", ended_at=None)
    m["launcher"] = {**m["launcher"], "pid_start": 1.0}  # the pid is someone else's now, or nobody's
    run.manifest_path.write_text(json.dumps(m))
    (run.stacks_dir / "rank-0.txt").write_text(f"=== stack dump of rank-0 ===\n{stack_dump()}")
    rec = json.loads((run.status_dir / "rank-0.json").read_text())
    (run.status_dir / "rank-0.json").write_text(json.dumps({**rec, "stack_file": "stacks/rank-0.txt"}))
    return run


def without_clocks(value):
    if isinstance(value, dict):
        return {k: without_clocks(v) for k, v in value.items() if k not in CLOCKS | PLACES}
    if isinstance(value, list):
        return [without_clocks(v) for v in value]
    return value


def answers(root: Path, run_id: str) -> dict:
    """What each read command says of the run (clocks aside)."""
    def ups(*args: str, ok: tuple[int, ...] = (0,)) -> str:
        res = run_ups(*args, "--runs-dir", str(root), timeout=60, env={"COLUMNS": "200"})
        assert res.returncode in ok and "Traceback" not in res.stderr, (args, res.stdout, res.stderr)
        return res.stdout

    follow = [json.loads(line) for line in ups("status", run_id, "--json", "--follow", "--interval", "0.2").splitlines()]
    from console.snapshots import Poller

    snap = Poller(root, gpu_provider=None).snapshot(run_id, None)
    return {
        "runs": without_clocks(json.loads(ups("runs", "--json"))["runs"]),
        "status": without_clocks(json.loads(ups("status", run_id, "--json"))),
        "why": json.loads(ups("why", run_id, "--json", ok=(0, 1)))["verdict"],
        "stacks": ups("stacks", run_id, "--group"),
        "follow": without_clocks(follow[-1]),
        "console": [(r.run_id, r.state, r.health, r.reason) for r in snap.runs] + [snap.detail.verdict.headline],
        "tables": [ups("runs").splitlines()[1].split()[:2], ups("status", run_id).splitlines()[0]],
    }


def tree_bytes(root: Path) -> dict[str, tuple[bytes | None, int]]:
    """Every file and folder under root: its bytes (None for a folder) and its mode."""
    out = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        out[str(path.relative_to(root))] = (path.read_bytes() if path.is_file() else None, st.st_mode)
    return out


@pytest.fixture
def read_only(tmp_path):
    """A folder made read-only for this process: a read-only bind mount as root (root writes
    through file modes), file modes otherwise. Yields (the source folder, its read-only view)."""
    src, ro = tmp_path / "src", tmp_path / "ro"
    src.mkdir()
    if os.geteuid() != 0:
        yield src, src
        for path in [src, *src.rglob("*")]:
            if not path.is_symlink():
                path.chmod(path.stat().st_mode | 0o200)
        return
    ro.mkdir()
    mounted = []

    def mount(*args: str) -> None:
        res = subprocess.run(["mount", *args], capture_output=True, text=True)
        if res.returncode != 0:
            pytest.skip(f"mount {' '.join(args)} not permitted here: {res.stderr.strip()}")
        mounted.append(ro)

    yield src, (mount, ro)
    for path in mounted[::-1]:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def test_every_read_command_writes_nothing_on_a_dead_run(finished_run, tmp_path, read_only):
    writable = tmp_path / "writable"
    writable.mkdir()
    run = dead_run(finished_run, writable)
    before = tree_bytes(writable)
    answer = answers(writable, run.run_id)
    assert tree_bytes(writable) == before, "a read command wrote into the run folder"

    src, target = read_only
    dead_run(finished_run, src)
    if isinstance(target, tuple):  # root: a read-only bind mount of the copy
        mount, ro = target
        mount("--bind", str(src), str(ro))
        mount("-o", "remount,ro,bind", str(ro))
    else:
        ro = target
        for path in [ro, *ro.rglob("*")]:
            if not path.is_symlink():
                path.chmod(path.stat().st_mode & ~0o222)
    assert answers(ro, run.run_id) == answer

    # What every reader shows: the end the records tell, decided in memory.
    assert answer["status"]["state"] == "succeeded" and "launcher lost" in answer["status"]["run"]["summary"]
    assert answer["runs"][0]["state"] == "succeeded" and answer["follow"]["state"] == "succeeded"
    assert "rank 0" in answer["stacks"] and "main" in answer["stacks"]
    assert json.loads(run.manifest_path.read_text())["state"] == "running"
    # Writing it down is asked for.
    res = run_ups("runs", "--settle", "--runs-dir", str(writable))
    assert res.returncode == 0 and f"settled {run.run_id}: succeeded" in res.stderr, res.stderr
    assert json.loads(run.manifest_path.read_text())["state"] == "succeeded"
