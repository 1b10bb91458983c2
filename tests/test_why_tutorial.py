"""`ups why` on a program nobody here wrote: the DDP tutorial (tests/programs/ddp_tutorial.py,
its own Dataset, DistributedSampler, two DataLoader workers a rank, gloo), launched with no
flag and default thresholds. Each fault (a worker hung in ``__getitem__``, in ``open()`` or
``h5py.File()`` of a file on a hung mount, a worker's exception, an all_reduce one rank makes
alone, all_reduce against broadcast) must be named with who, where and the class within 15 s
of showing, and no verdict asked for every 0.2 s on the way may blame anyone else."""

from __future__ import annotations

import json

import pytest
from helpers import run_ups
from why_drills import TUTORIAL_DRILLS, assert_drill, ended

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("drill", TUTORIAL_DRILLS, ids=[d.name for d in TUTORIAL_DRILLS])
def test_an_outside_ddp_script_gets_the_right_verdict_and_never_a_wrong_one(drill, runs_root, tmp_path):
    assert_drill(drill, tmp_path)


def test_a_rank_stopped_from_outside_is_named_as_such(runs_root, tmp_path):
    """A scheduler's SIGTERM (preemption, a time limit) that neither ups nor torchrun sent: the
    rank that got it is named, and the verdict says it came from outside."""
    import os
    import signal

    from helpers import wait_for
    from why_drills import tutorial

    from ups.runs.view import load_run_view
    from ups.why import diagnose

    run = tutorial(epochs=1000)(tmp_path)
    try:
        def rank1():
            p = load_run_view(run).process("rank-1")
            return p is not None and p.record.step >= 5 and p.record
        rec = wait_for(rank1, 90, interval=0.2, message="rank 1 training")
        os.kill(rec.pid, signal.SIGTERM)  # what a scheduler does to a preempted job's process
        wait_for(lambda: ended(run), 60, interval=0.2, message="the run to end")
        v = wait_for(lambda: (d := diagnose(run).to_dict())["mode"] == "stopped_from_outside" and d, 15, interval=0.2,
                     message="the verdict")
        assert v["who"]["rank"] == 1 and v["headline"].startswith("rank 1 was stopped from outside (SIGTERM, not sent by ups")
        assert "preemption" in v["evidence"][0] and "scheduler" in v["next"]

        # The same end on a GPU box whose GPU 1 (rank 1's, by local rank) reported Xid 79, read
        # through the GPU layer's fake provider: the hardware is named, not the signal.
        fake = tmp_path / "gpus.json"
        device = {"name": "NVIDIA H100", "uuid": None, "memory_total": 80 * 2**30, "memory_used": 0,
                  "utilization_gpu": 0, "temperature_c": 40, "power_w": 70.0}
        fake.write_text(json.dumps({"available": True, "devices": [{"index": 0, **device},
                                                                  {"index": 1, **device, "xid_errors": [79]}]}))
        res = run_ups("why", str(run.path), "--json", env={"UPS_FAKE_GPU": str(fake)})
        hw = json.loads(res.stdout)["verdict"]
        assert hw["mode"] == "gpu_hardware" and hw["who"]["rank"] == 1, hw
        assert hw["headline"] == ("rank 1 failed on GPU 1 (NVIDIA H100), which reported a hardware fault: "
                                  "Xid 79: GPU has fallen off the bus")
        assert hw["next"].startswith("drain this node")
    finally:
        if not ended(run):
            run_ups("kill", str(run.path), "--grace", "3")
