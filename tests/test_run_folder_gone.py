"""No launcher outlives its run folder (issue 31, item 3).

Users clean up ``runs/`` with ``rm -rf``, sometimes while a run is going. The job is theirs
and goes on; its launcher writes nothing more (never into another folder put in its place)
and ends with the job, saying so. Nothing of the run is left once the job ends.
"""

from __future__ import annotations

import shutil
import time

import pytest
from helpers import job_processes, launcher_processes, run_ups, wait_for

from ups.runs.rundir import RunDir, list_runs

PROGRAM = """\
import time
for i in range(STEPS):
    print(f"step {i}", flush=True)
    time.sleep(0.5)
"""


@pytest.mark.parametrize("how", ["deleted", "replaced"])
@pytest.mark.slow
def test_a_launcher_whose_run_folder_goes_ends_with_its_job(runs_root, tmp_path, how):
    prog = tmp_path / "loop.py"
    prog.write_text(PROGRAM.replace("STEPS", "16"))  # ~8 s of work
    res = run_ups("launch", "python", "--detach", str(prog), timeout=60)
    assert res.returncode == 0, res.stderr
    (summary,) = list_runs(runs_root)
    run = RunDir(summary.path)
    path = run.path.resolve()
    wait_for(lambda: job_processes(run) and (run.status_dir / "rank-0.json").exists(), 30, message="the job running")
    jobs = job_processes(run)
    shutil.rmtree(runs_root)
    if how == "replaced":  # another folder of the same name, e.g. a new runs/ restored from elsewhere
        path.mkdir(parents=True)
        (path / "theirs.txt").write_text("not the launcher's\n")
    # The job goes on: the user's work is never stopped because its folder went.
    time.sleep(1.0)
    assert [p for p in job_processes(run) if p in jobs], "the job stopped when its run folder went"
    # ... and when it ends, its launcher ends too, with nothing of the run left behind.
    wait_for(lambda: not job_processes(run), 60, message="the job's own end")
    wait_for(lambda: not launcher_processes(path), 15, message="the launcher to end with its job")
    assert not job_processes(run)
    if how == "replaced":
        assert sorted(p.name for p in path.iterdir()) == ["theirs.txt"], "the launcher wrote into another folder"
