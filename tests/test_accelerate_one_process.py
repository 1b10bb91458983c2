"""`accelerate launch` with one process (a laptop, one GPU, `accelerate config` answered "no
distributed"): accelerate runs the script as a plain child with no rank in its environment.
It is the job's only rank. It showed as "rank 0 / helper", its DataLoader workers went under
the agent, and a run that printed its last line and exited 0 ended "failed: rank 0 never
wrote a status record"."""

from __future__ import annotations

import pytest
from helpers import run_ups
from test_frameworks import ACCEL, FAST, launched, needs, nothing_left, status


@pytest.mark.slow
@needs("accelerate")
def test_one_process_accelerate_launch_is_rank_0_and_succeeds(runs_root, tmp_path):
    res = run_ups("launch", "accelerate", "--json", "launch", "--num_processes", "1", "--num_machines", "1",
                  "--mixed_precision", "no", "--dynamo_backend", "no", "--cpu", str(ACCEL), "--steps", "8",
                  env=FAST, timeout=300, cwd=tmp_path)
    run = launched(res)
    m = run.read_manifest()
    assert res.returncode == 0 and m["state"] == "succeeded", (m.get("summary"), run.log_path("job").read_text()[-2000:])
    procs = status(run)
    assert not [p for p in procs.values() if p["role"] == "helper"], procs
    rank = procs["rank-0"]
    assert rank["role"] == "rank" and rank["step"] >= 8 and rank["state"] == "done", rank
    workers = [p for p in procs.values() if p["role"] == "worker"]
    assert len(workers) == 2 and all(w["rank"] == 0 and w["name"].startswith("rank-0-") for w in workers), workers
    nothing_left(run)
