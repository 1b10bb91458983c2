"""The real NVML provider on a machine with an NVIDIA GPU (skipped elsewhere)."""

from __future__ import annotations

import os
import sys
import textwrap

import pytest
from helpers import wait_for

from ups.gpu import NvmlProvider, attribute, records_for_attribution
from ups.runs.rundir import RunDir

SNAP = NvmlProvider().snapshot()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not SNAP.available, reason=f"no GPU: {SNAP.reason}")]


def test_real_devices_have_real_values():
    assert SNAP.driver_version and SNAP.devices
    for d in SNAP.devices:
        assert d.name and d.uuid.startswith("GPU-")
        assert d.memory_total > 0 and 0 <= d.memory_used <= d.memory_total


def test_a_cuda_allocation_is_attributed_to_its_rank(runs_root, procs):
    run = RunDir.create(runs_root, "train")
    code = textwrap.dedent(
        f"""
        import time, torch
        from ups.status import Reporter
        from ups.gpu.torch_memory import cuda_memory_sampler
        x = torch.empty(512 * 1024 * 1024, dtype=torch.uint8, device="cuda")
        with Reporter({str(run.path)!r}, rank=0, interval=0.2, gpu_sampler=cuda_memory_sampler("cuda:0")):
            time.sleep(60)
        """
    )
    p = procs.popen([sys.executable, "-c", code], env=dict(os.environ))
    wait_for(lambda: (run.status_dir / "rank-0.json").exists(), 60, message="rank record")

    def attributed():
        view = attribute(NvmlProvider().snapshot(), records_for_attribution(runs_root))
        return next((x for x in view.processes if x.pid == p.pid and x.status == "run"), None)

    proc = wait_for(attributed, 30, message="the rank's GPU process in NVML")
    assert proc.label == "rank 0" and (proc.used_memory is None or proc.used_memory >= 512 * 1024 * 1024)
    from ups.status.reader import read_status_dir

    rec = wait_for(lambda: (r := read_status_dir(run.status_dir).records[0]).gpu and r, 10, message="torch memory in the record")
    assert rec.gpu.allocated >= 512 * 1024 * 1024


def test_an_uninstrumented_cuda_script_reports_its_memory_through_ups_launch(runs_root, tmp_path):
    """`ups launch python` on a script that knows nothing of ups: the rank's record carries
    torch's CUDA memory of the device the script uses (sampled without initialising CUDA)."""
    import json

    from helpers import run_ups

    script = tmp_path / "cuda_train.py"
    script.write_text(textwrap.dedent(
        """
        import torch
        model = torch.nn.Linear(4096, 4096).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for _ in range(400):
            loss = model(torch.randn(256, 4096, device="cuda")).square().mean()
            opt.zero_grad(); loss.backward(); opt.step()
            torch.cuda.synchronize()
        """
    ))
    res = run_ups("launch", "python", "--detach", "--json", str(script), env={"UPS_HEARTBEAT_INTERVAL": "0.2"}, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    run = RunDir(json.loads(res.stdout)["run_dir"])

    def gpu_in_record():
        from ups.status.reader import read_status_dir

        rec = next((r for r in read_status_dir(run.status_dir).records if r.name == "rank-0"), None)
        return rec is not None and rec.gpu is not None and rec.gpu.allocated and rec

    rec = wait_for(gpu_in_record, 90, message="CUDA memory in the rank's record")
    assert rec.gpu.device == 0 and rec.gpu.allocated >= 4096 * 4096 * 4 and rec.gpu.peak >= rec.gpu.allocated
    wait_for(lambda: run.read_manifest()["state"] in ("succeeded", "failed", "killed"), 120, message="the run to end")
    assert run.read_manifest()["state"] == "succeeded"
