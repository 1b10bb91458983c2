"""Xid events through NVML's event-set API, drilled with a fake pynvml module (this box has no
GPU); the real watcher runs on a GPU box (``-m gpu``)."""

from __future__ import annotations

import json
import types

import pytest
from helpers import run_ups, wait_for

from ups.gpu import nvml
from ups.gpu.xid import XidWatcher


def fake_pynvml(xids: list[tuple[int, int]], devices: int = 2) -> types.ModuleType:
    """A pynvml with the calls ups makes: each event waits in the set until read, then timeout."""
    m = types.ModuleType("pynvml")

    class NVMLError(Exception):
        def __init__(self, value: int) -> None:
            self.value = value

    queue = [types.SimpleNamespace(device=("handle", gpu), eventType=0x8, eventData=xid) for gpu, xid in xids]
    m.calls = []

    def wait_v2(event_set, timeout_ms):
        m.calls.append(("wait", event_set, timeout_ms))
        if not queue:
            raise NVMLError(10)  # NVML_ERROR_TIMEOUT: nothing (more) happened
        return queue.pop(0)

    def register(handle, kinds, event_set):
        m.calls.append(("register", handle, kinds, event_set))

    m.NVMLError = NVMLError
    m.nvmlEventTypeXidCriticalError = 0x8
    m.nvmlEventSetCreate = lambda: "set-1"
    m.nvmlEventSetFree = lambda s: m.calls.append(("free", s))
    m.nvmlDeviceRegisterEvents = register
    m.nvmlEventSetWait_v2 = wait_v2
    m.nvmlDeviceGetCount = lambda: devices
    m.nvmlDeviceGetHandleByIndex = lambda i: ("handle", i)
    m.nvmlDeviceGetIndex = lambda h: h[1]
    m.nvmlDeviceGetName = lambda h: "NVIDIA H100"
    m.nvmlDeviceGetUUID = lambda h: f"GPU-{h[1]}"
    m.nvmlSystemGetDriverVersion = lambda: "550.54"
    m.nvmlShutdown = lambda: None
    return m


def test_two_xid_events_reach_the_snapshot_and_the_verdict(nvml_is, runs_root, monkeypatch, tmp_path):
    from ups.gpu import NvmlProvider
    from ups.runs.rundir import RunDir
    from ups.why import diagnose

    monkeypatch.delenv("UPS_FAKE_GPU", raising=False)
    fake = fake_pynvml([(0, 79), (0, 79)])
    nvml_is(fake)
    snap = NvmlProvider().snapshot()
    # registered on both devices for Xid critical errors, then drained until NVML said timeout
    assert [c[1:3] for c in fake.calls if c[0] == "register"] == [(("handle", 0), 0x8), (("handle", 1), 0x8)]
    assert [c[2] for c in fake.calls if c[0] == "wait"] == [0, 0, 0]
    assert snap.available and [d.xid_errors for d in snap.devices] == [(79,), ()]

    # A plain script run by `ups launch` (rank 0, on GPU 0) fails with the CUDA error a rank sees
    # when its GPU falls off the bus.
    script = tmp_path / "train.py"
    script.write_text('raise RuntimeError("CUDA error: unspecified launch failure")\n')
    res = run_ups("launch", "python", "--detach", "--json", str(script), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    run = RunDir(json.loads(res.stdout)["run_dir"])
    wait_for(lambda: run.read_manifest()["state"] in ("succeeded", "failed", "killed"), 90, message="the run to end")
    v = wait_for(lambda: (d := diagnose(run).to_dict())["mode"] != "settling" and d, 60, interval=0.3,
                 message="the verdict")
    assert v["mode"] == "gpu_hardware" and v["who"]["rank"] == 0, v
    assert v["headline"] == ("rank 0 failed on GPU 0 (NVIDIA H100), which reported a hardware fault: "
                             "Xid 79: GPU has fallen off the bus")


def test_unsupported_and_no_nvml_give_nothing_and_never_raise(nvml_is, monkeypatch):
    fake = fake_pynvml([(0, 48)])

    def refuse(handle, kinds, event_set):
        raise fake.NVMLError(3)  # NVML_ERROR_NOT_SUPPORTED (GeForce, vGPU)

    fake.nvmlDeviceRegisterEvents = refuse
    w = XidWatcher(fake)
    assert w.poll(0) == [] and w.watch(0.05) == [] and w.by_gpu() == {}
    assert w.reason == "GPU 1: Xid events not supported" and ("free", "set-1") in fake.calls

    nvml.use(None, "no driver")
    w = XidWatcher()
    assert w.poll(100) == [] and w.watch(0.05) == [] and w.reason == "no driver"


def test_the_list_is_bounded(nvml_is):
    w = XidWatcher(fake_pynvml([(0, 13)] * 10), max_events=4)
    assert len(w.poll(0)) == 10 and len(w.events) == 4


@pytest.mark.gpu
def test_the_real_watcher_runs_a_second_on_a_real_device():
    if not nvml.available():
        pytest.skip(f"no GPU: {nvml.unavailable_reason()}")
    w = XidWatcher()
    try:
        got = w.watch(1.0)  # a healthy GPU reports none; a driver without events is a reason
        assert isinstance(got, list) and all(e.gpu >= 0 for e in got)
        assert w.devices or w.reason
    finally:
        w.close()
