"""Benchmark of the one read path, ``open_run``. Prints one JSON line.

A real ``ups launch python`` run is made, then read as every reader reads it:

- finished_us: the CPU time of one read of the finished run (median over batches of reads);
- settled_us: the same for the run made dead (run.json still says running, its launcher's
  pid is nobody's: a reboot, a kill -9), which every read settles in memory.

CPU time, not wall time, so that a busy box moves the figures less. Run it at two commits
to compare them.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ups.runs.read import open_run  # noqa: E402
from ups.runs.rundir import RunDir, list_runs  # noqa: E402


def per_read_us(run: RunDir, reads: int = 200, batches: int = 7) -> float:
    times = []
    for _ in range(batches):
        t = time.process_time()
        for _ in range(reads):
            open_run(run)
        times.append((time.process_time() - t) / reads * 1e6)
    return statistics.median(times)


def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        root = Path(d) / "runs"
        root.mkdir()
        prog = Path(d) / "prog.py"
        prog.write_text("print('done')\n")
        env = {**os.environ, "UPS_RUNS_DIR": str(root), "PYTHONPATH": str(REPO)}
        subprocess.run([sys.executable, "-m", "ups", "launch", "python", str(prog)], env=env, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)
        done = RunDir(list_runs(root)[0].path)
        dead = RunDir(shutil.copytree(done.path, Path(d) / "dead" / done.path.name, symlinks=True))
        manifest = json.loads(dead.manifest_path.read_text())
        manifest.update(state="running", ended_at=None, launcher={**manifest["launcher"], "pid_start": 1.0})
        dead.manifest_path.write_text(json.dumps(manifest))
        view = open_run(dead)
        assert view.settled is not None and view.state == "succeeded", (view.supervision, view.state)
        print(json.dumps({
            "finished_us": round(per_read_us(done), 1),
            "settled_us": round(per_read_us(dead), 1),
        }))


if __name__ == "__main__":
    main()
