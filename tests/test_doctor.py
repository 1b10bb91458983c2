"""ups doctor: every failing path built for real, and its JSON schema."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
import torch
from helpers import run_ups

from ups.data.cache import prepare_split, write_sample
from ups.data.synth import synthesize


def doctor(*args: str, timeout: float = 120) -> tuple[int, dict]:
    res = run_ups("doctor", "--json", *args, timeout=timeout)
    return res.returncode, json.loads(res.stdout)


def check(report: dict, cid: str) -> dict:
    return next(c for c in report["checks"] if c["id"] == cid)


def test_json_schema_is_stable(tmp_path):
    code, report = doctor("--quick")
    assert set(report) == {"schema", "ok", "summary", "duration_s", "checks"}
    assert report["schema"] == 1 and set(report["summary"]) == {"ok", "warn", "fail", "skip"}
    ids = [c["id"] for c in report["checks"]]
    assert ids == ["python", "config", "torch", "gpu", "torchrun", "shm", "ulimit", "disk", "ram", "fs", "hdf5", "cache",
                   "dataloader", "ddp", "wandb"]
    for c in report["checks"]:
        assert set(c) == {"id", "title", "status", "detail", "hint", "duration_s"}
        assert c["status"] in ("ok", "warn", "fail", "skip")
    assert check(report, "ddp")["status"] == "skip" and "--quick" in check(report, "ddp")["detail"]
    assert code == (0 if report["ok"] else 1)


@pytest.mark.slow
def test_fifo_shard_fails_within_its_timeout_and_is_named(tmp_path):
    synthesize(tmp_path, "burgers1d", "train", 6, shards=2)
    fifo = tmp_path / "burgers1d_train_001.h5"
    fifo.unlink()
    os.mkfifo(fifo)
    code, report = doctor("--only", "hdf5", "--root", str(tmp_path), timeout=60)
    c = check(report, "hdf5")
    assert code == 1 and c["status"] == "fail"
    assert f"opening {fifo} did not return within" in c["detail"]
    assert c["duration_s"] < 30


def test_every_split_under_the_root_is_checked_and_a_bad_one_named(tmp_path):
    synthesize(tmp_path, "advection1d", "train", 4)
    synthesize(tmp_path, "advection1d", "val", 4)
    for manifest in tmp_path.glob("*.index.json"):
        manifest.unlink()  # data from elsewhere comes without our manifests
    fifo = tmp_path / "advection1d_val.h5"
    fifo.unlink()
    os.mkfifo(fifo)
    code, report = doctor("--only", "hdf5", "--root", str(tmp_path), "--timeout-scale", "0.4")
    c = check(report, "hdf5")
    assert code == 1 and c["status"] == "fail" and c["detail"].startswith("1 of 2 shard(s) bad")
    assert f"opening {fifo} did not return within 2 s (a FIFO" in c["detail"]
    # With a config, its tasks and splits are what is checked.
    cfg = tmp_path / "p.yaml"
    cfg.write_text(f"root: {tmp_path}\ntasks: [advection1d]\nsplits: [train]\n")
    code, report = doctor("--only", "hdf5", "--config", str(cfg))
    c = check(report, "hdf5")
    assert code == 0 and c["detail"] == "1 shard(s) of advection1d/train opened, one sample read from each"


def test_corrupt_shard_is_named(tmp_path):
    synthesize(tmp_path, "burgers1d", "train", 6, shards=2)
    bad = tmp_path / "burgers1d_train_000.h5"
    bad.write_bytes(b"garbage" * 100)
    code, report = doctor("--only", "hdf5", "--root", str(tmp_path))
    c = check(report, "hdf5")
    assert code == 1 and c["status"] == "fail" and str(bad) in c["detail"]


def test_cuda_saved_cache_file_fails_with_the_fix(tmp_path, monkeypatch):
    folder = tmp_path / "cache" / "burgers1d_train"
    prepare_split(folder, {"hash": "h", "count": 2}, overwrite=False)
    for i in range(2):
        write_sample(folder, i, torch.zeros(4, 2, 2).half(), torch.zeros(1), torch.zeros(1), hash_="h", source=f"x#{i}")
    monkeypatch.setattr(torch.serialization, "location_tag", lambda storage: "cuda:0")
    torch.save(torch.load(folder / "sample_00001.pt", weights_only=True), folder / "sample_00001.pt")
    monkeypatch.undo()
    code, report = doctor("--only", "cache", "--cache-dir", str(tmp_path / "cache"))
    c = check(report, "cache")
    assert code == 1 and c["status"] == "fail" and "cuda" in c["detail"] and "sample_00001.pt" in c["detail"]
    assert c["hint"].startswith("ups cache fix")


@pytest.mark.xdist_group("port-29500")  # both hold the port: never at the same time
def test_busy_port_29500_is_a_warning(tmp_path):
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", 29500))
        except OSError:
            pytest.skip("29500 already taken by something else")
        s.listen()
        code, report = doctor("--only", "torchrun")
    c = check(report, "torchrun")
    assert code == 0 and c["status"] == "warn" and "29500 is busy" in c["detail"] and "--standalone" in c["hint"]


def test_low_ulimit_fails(tmp_path):
    code = (
        "import resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))\n"
        "sys.argv = ['ups', 'doctor', '--only', 'ulimit', '--json']\n"
        "from ups.cli.app import main\n"
        "main()\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    c = check(json.loads(res.stdout), "ulimit")
    assert res.returncode == 1 and c["status"] == "fail" and "ulimit -n 64" in c["detail"] and c["hint"].startswith("ulimit -n")


def test_bad_config_value_is_named(tmp_path):
    cfg = tmp_path / "p.yaml"
    cfg.write_text("root: data\nnum_workers: -3\n")
    code, report = doctor("--only", "config", "--config", str(cfg))
    c = check(report, "config")
    assert code == 1 and c["status"] == "fail" and c["detail"] == "num_workers: -3 is not valid (expected >= 0)"
    cfg.write_text("root: data\nnum_wrokers: 2\n")
    code, report = doctor("--only", "config", "--config", str(cfg))
    assert "unknown config key 'num_wrokers'" in check(report, "config")["detail"]


def test_unknown_check_is_bad_input():
    res = run_ups("doctor", "--only", "vibes")
    assert res.returncode == 2 and "unknown check 'vibes'" in res.stderr
