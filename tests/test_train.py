"""Training under torchrun: 2 real gloo ranks, real signals, real faults."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import psutil
import pytest
import torch
from helpers import run_ups, status_now, wait_for, why_now, write_raw_pdebench

from ups.data.synth import synthesize
from ups.faults import Faults
from ups.jobs import precompute as pre
from ups.jobs import train as train_mod
from ups.launch.config import PrecomputeConfig, TrainConfig
from ups.models.encoder import SteadyMapEncoder, build_encoder
from ups.runs.rundir import RunDir, list_runs
from ups.status.reader import read_status_dir
from ups.status.reporter import NullReporter

FINAL = ("succeeded", "partial", "failed", "killed")
QUICK = """\
steps: 12
batch_size: 8
hidden: 32
checkpoint_every: 5
log_every: 5
wandb_mode: disabled
heartbeat_interval: 0.3
stalled_after: 2
"""


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("train")
    synthesize(root / "data", "burgers1d", "train", 16, seed=2, timesteps=8, resolution=32)
    cfg = PrecomputeConfig(root=str(root / "data"), tasks=["burgers1d"], cache_dir=str(root / "cache"), num_workers=0,
                           device="cpu").validate()
    pre.PrecomputeJob(cfg, NullReporter(), Faults()).execute()
    return root / "cache"


@pytest.fixture
def quick(tmp_path) -> Path:
    path = tmp_path / "quick.yaml"
    path.write_text(QUICK)
    return path


def launch(cache_dir: Path, config: Path, *args: str, timeout: float = 180):
    res = run_ups("launch", "train", "--cache-dir", str(cache_dir), "--tasks", "burgers1d", "--config", str(config),
                  "--nproc", "2", *args, timeout=timeout)
    run = None
    for line in res.stderr.splitlines() + res.stdout.splitlines():
        if line.startswith("run ") and "(" in line:
            run = RunDir(line.split("(", 1)[1].split(")", 1)[0])
        elif line.startswith("{"):
            run = RunDir(json.loads(res.stdout)["run_dir"])
            break
    return res, run


def rank_records(run: RunDir) -> dict[int, object]:
    return {r.rank: r for r in read_status_dir(run.status_dir).records if r.role == "rank"}


def no_process_left(run: RunDir) -> bool:
    pids = [r.pid for r in read_status_dir(run.status_dir).records]
    return not any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in pids)


@pytest.mark.slow
def test_happy_path_rank0_alone_checkpoints_and_talks_to_wandb(cache_dir, tmp_path, runs_root):
    config = tmp_path / "wandb.yaml"
    config.write_text(QUICK.replace("wandb_mode: disabled", "wandb_mode: offline"))
    res, run = launch(cache_dir, config)
    assert res.returncode == 0, res.stderr + run.log_path("job").read_text()
    m = run.read_manifest()
    assert m["state"] == "succeeded" and m["ranks"]["0"]["exit_code"] == 0 and m["ranks"]["1"]["exit_code"] == 0
    recs = rank_records(run)
    assert {r: recs[r].state for r in recs} == {0: "done", 1: "done"}
    assert recs[0].metrics["checkpoints"] == 3 and "checkpoints" not in recs[1].metrics  # steps 5, 10, end
    assert (run.path / "checkpoints" / "last.pt").exists() and not list((run.path / "checkpoints").glob(".*tmp"))
    offline = list((run.path / "wandb").glob("offline-run-*"))
    assert len(offline) == 1 and m["wandb"]["id"] in offline[0].name and m["wandb"]["mode"] == "offline"
    assert recs[0].metrics["loss"] > 0 and recs[0].total == 12 and recs[0].step == 12


@pytest.mark.slow
def test_sigsegv_on_rank1_in_model_build_is_named_with_its_traceback(cache_dir, quick, runs_root):
    res, run = launch(cache_dir, quick, "--inject", "segv:rank=1,phase=model.build")
    assert res.returncode == 1
    m = run.read_manifest()
    assert m["state"] == "failed"
    assert m["failure"]["rank"] == 1 and m["failure"]["signal"] == "SIGSEGV" and m["failure"]["phase"] == "model.build"
    assert m["summary"] == "rank 1 killed by SIGSEGV in phase model.build"
    assert rank_records(run)[1].phase == "model.build"
    stack = (run.path / "stacks" / "rank-1.txt").read_text()
    assert "Fatal Python error: Segmentation fault" in stack and "on_phase" in stack and "ups/jobs/train.py" in stack
    v = m["verdict"]  # what `ups why` says, kept in run.json
    assert v["mode"] == "crashed_by_signal" and v["headline"] == "rank 1 was killed by SIGSEGV in phase model.build"
    assert v["who"]["rank"] == 1 and v["evidence"][0].startswith("faulthandler: Segmentation fault, main thread in train.py:")
    wait_for(lambda: no_process_left(run), 15, message="no rank left running")


@pytest.mark.slow
def test_oom_on_rank1_skips_the_step_on_both_ranks_and_finishes(cache_dir, quick, runs_root):
    res, run = launch(cache_dir, quick, "--inject", "oom:rank=1,step=3")
    assert res.returncode == 0, res.stderr
    recs = rank_records(run)
    assert recs[0].metrics["skipped_steps"] == 1 and recs[1].metrics["skipped_steps"] == 1
    assert recs[0].state == recs[1].state == "done"
    assert "step 3: OOM on 1 rank(s), step skipped on every rank" in run.log_path("job").read_text()
    v = run.read_manifest()["verdict"]
    assert v["ok"] and "rank 1 ran out of memory at step 3 (the step was skipped on every rank (1 so far)" in v["evidence"][0]


@pytest.mark.slow
def test_hang_on_rank1_shows_both_stalled_stacks_why_names_it_and_kill_ends_the_run(cache_dir, quick, runs_root):
    """Rank 1 hangs in Python at step 4, rank 0 waits for it in the step's all_reduce. With no flag:
    both ranks turn stalled, the launcher dumps both stacks on its own, `ups why` names rank 1 and
    its frame, `ups stacks --group` folds them, and `ups kill` ends the run with nothing left."""
    res, run = launch(cache_dir, quick, "--inject", "hang:rank=1,step=4", "--detach", "--json")
    assert res.returncode == 0, res.stderr

    def both_stalled():
        data = status_now(run)
        health = {p["rank"]: p["health"] for p in data["processes"] if p["role"] == "rank"}
        return health == {0: "stalled", 1: "stalled"} and data

    data = wait_for(both_stalled, 90, interval=0.5, message="both ranks stalled")
    assert all("no progress for" in p["reason"] for p in data["processes"] if p["role"] == "rank")

    def named():  # the process and its frame (the frame once the launcher's automatic dump is in)
        v = why_now(run)
        return v["mode"] == "rank_stuck_peers_wait" and (v["where"] or {}).get("function") and v

    v = wait_for(named, 90, interval=0.5, message="the verdict naming rank 1 and its frame")
    assert v["who"]["rank"] == 1 and v["where"]["function"] == "hang_in_python" and v["where"]["site"].startswith("train.py:")
    assert "rank 0 waits for it in all_reduce" in v["headline"] and not v["ok"]

    def dumped():  # both ranks' automatic dumps (the verdict may come from the first one in)
        auto = [e for e in run.read_events() if e["event"] == "stacks.auto"]
        return {e["target"] for e in auto} >= {"rank-0", "rank-1"} and auto

    auto = wait_for(dumped, 15, message="the automatic dumps of both ranks")
    assert all(e["result"].startswith("dumped") for e in auto)
    lines = run_ups("stacks", str(run.path), "--group").stdout.strip().splitlines()
    assert any(ln.startswith("rank 0: all_reduce at train.py:") for ln in lines), lines
    assert any(ln.startswith("rank 1: hang_in_python at train.py:") for ln in lines), lines
    stacks = run_ups("stacks", run.run_id, "--rank", "1").stdout
    assert "hang_in_python" in stacks
    stacks0 = run_ups("stacks", run.run_id, "--rank", "0").stdout
    assert "all_reduce" in stacks0
    res = run_ups("kill", run.run_id, "--grace", "3")
    assert res.returncode == 0, res.stderr
    wait_for(lambda: run.read_manifest()["state"] in FINAL, 30, message="run to end")
    assert run.read_manifest()["state"] == "killed"
    wait_for(lambda: no_process_left(run), 20, message="no process left")


@pytest.mark.xdist_group("port-29500")  # both hold the port: never at the same time
@pytest.mark.slow
def test_launch_starts_while_port_29500_is_busy(cache_dir, quick, runs_root):
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", 29500))
        except OSError:
            pytest.skip("port 29500 is already taken by something else")
        s.listen()
        res, run = launch(cache_dir, quick)
    assert res.returncode == 0, res.stderr
    assert run.read_manifest()["state"] == "succeeded"


def test_bad_input(cache_dir, quick, tmp_path, runs_root):
    res, _ = launch(tmp_path / "empty", quick)
    assert res.returncode == 2 and "no latent cache" in res.stderr and "Traceback" not in res.stderr
    res, _ = launch(cache_dir, quick, "--inject", "segv:rank=1", "--nnodes", "2")
    assert res.returncode == 2 and "--rdzv-endpoint" in res.stderr
    assert list(runs_root.iterdir()) == []


@pytest.mark.slow
def test_skipped_collective_is_named_as_a_mismatch(cache_dir, quick, runs_root):
    res, run = launch(cache_dir, quick, "--inject", "skip_collective:rank=1,step=4")
    assert res.returncode == 1
    m = run.read_manifest()
    assert m["state"] == "failed" and m["failure"]["collective_mismatch"] is True
    assert "collective mismatch" in m["summary"] and "rank 1 at step" in m["summary"]
    wait_for(lambda: no_process_left(run), 20, message="no rank left running")


@pytest.mark.slow
def test_pipeline_precompute_then_train(tmp_path, runs_root):
    synthesize(tmp_path / "data", "burgers1d", "train", 12, seed=3, timesteps=6, resolution=32)
    res = run_ups("launch", "pipeline", "--root", str(tmp_path / "data"), "--tasks", "burgers1d", "--cache-dir",
                  str(tmp_path / "cache"), "--num-workers", "0", "--steps", "6", timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    runs = {r.kind: r for r in list_runs(runs_root)}
    assert set(runs) == {"pipeline", "precompute", "train"}
    assert all(r.state == "succeeded" for r in runs.values())
    stages = runs["pipeline"].manifest["stages"]
    assert [s["stage"] for s in stages] == ["precompute", "train"]
    assert runs["train"].manifest["parent"] == runs["pipeline"].run_id


@pytest.mark.slow
def test_pipeline_with_skip_bad_shards_trains_on_the_rest_and_ends_partial_naming_them(tmp_path, runs_root):
    synthesize(tmp_path / "data", "burgers1d", "train", 24, shards=2, seed=3, timesteps=6, resolution=32)
    bad = tmp_path / "data" / "burgers1d_train_001.h5"
    bad.write_bytes(b"not hdf5" * 100)
    args = ("launch", "pipeline", "--root", str(tmp_path / "data"), "--tasks", "burgers1d", "--cache-dir",
            str(tmp_path / "cache"), "--num-workers", "0", "--steps", "4")
    res = run_ups(*args)
    assert res.returncode == 2 and f"{bad}: not a readable HDF5 file" in res.stderr and "--skip-bad-shards" in res.stderr
    assert list(runs_root.iterdir()) == []
    res = run_ups(*args, "--skip-bad-shards", timeout=300)
    assert res.returncode == 3, res.stderr[-2000:]
    runs = {r.kind: r for r in list_runs(runs_root)}
    assert {k: r.state for k, r in runs.items()} == {"pipeline": "partial", "precompute": "partial", "train": "succeeded"}
    assert bad.name in runs["pipeline"].manifest["summary"] and "train succeeded" in runs["pipeline"].manifest["summary"]
    assert len(list((tmp_path / "cache" / "burgers1d_train").glob("sample_*.pt"))) == 12  # shard 000's samples


@pytest.mark.slow
def test_more_ranks_than_gpus_trains_on_cpu_under_auto_and_is_refused_under_cuda(cache_dir, quick, tmp_path, runs_root):
    # One GPU, seen through a fake NVML (this box has none): the launcher decides before any rank starts.
    gpu = tmp_path / "gpu.json"
    gpu.write_text(json.dumps({"available": True, "reason": None, "driver_version": "570.86", "cuda_driver_version": "12.8",
                               "devices": [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-0", "memory_total": 80 << 30,
                                            "memory_used": 0, "utilization_gpu": 0, "temperature_c": 30, "power_w": 70.0,
                                            "processes": []}]}))
    env = {"UPS_FAKE_GPU": str(gpu)}
    args = ("launch", "train", "--cache-dir", str(cache_dir), "--tasks", "burgers1d", "--nproc", "2")
    cuda = tmp_path / "cuda.yaml"
    cuda.write_text(quick.read_text() + "device: cuda\n")
    res = run_ups(*args, "--config", str(cuda), env=env)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "device: cuda with --nproc 2 needs 2 GPUs, this node has 1 (use --nproc 1, or device: cpu)" in res.stderr
    assert list(runs_root.iterdir()) == []
    res = run_ups(*args, "--config", str(quick), "--detach", "--json", env=env)
    assert res.returncode == 0, res.stderr
    assert "2 ranks but 1 GPU(s) on this node: training on CPU (gloo)" in res.stderr
    run = RunDir(json.loads(res.stdout)["run_dir"])
    wait_for(lambda: run.read_manifest()["state"] in FINAL, 120, message="the CPU training run to end")
    assert run.read_manifest()["state"] == "succeeded" and run.read_manifest()["config"]["device"] == "cpu"


# ------------------------------------------------------------- tasks of different shapes
@pytest.fixture(scope="module")
def two_task_cache(tmp_path_factory) -> Path:
    """The stack's 2-task baseline from raw PDEBench files: advection (T=6) and Darcy (steady)."""
    root = tmp_path_factory.mktemp("two_task")
    write_raw_pdebench(root / "raw", "advection1d", 10, seed=1, timesteps=6, resolution=32)
    write_raw_pdebench(root / "raw", "darcy2d", 20, seed=2, resolution=16)
    cfg = PrecomputeConfig(root=str(root / "raw"), tasks=["advection1d", "darcy2d"], cache_dir=str(root / "cache"),
                           num_workers=0, device="cpu").validate()
    pre.PrecomputeJob(cfg, NullReporter(), Faults()).execute()
    return root / "cache"


@pytest.mark.slow
def test_advection_and_steady_darcy_train_together_one_task_per_step(two_task_cache, tmp_path, runs_root):
    config = tmp_path / "two.yaml"
    config.write_text(QUICK.replace("batch_size: 8", "batch_size: 4"))
    res = run_ups("launch", "train", "--cache-dir", str(two_task_cache), "--tasks", "advection1d", "--tasks", "darcy2d",
                  "--config", str(config), "--nproc", "2", timeout=180)
    run = RunDir(json.loads(run_ups("runs", "--json").stdout)["runs"][0]["path"])
    assert res.returncode == 0, res.stderr + run.log_path("job").read_text()[-3000:]
    assert run.read_manifest()["state"] == "succeeded"
    recs = rank_records(run)
    assert {r: recs[r].state for r in recs} == {0: "done", 1: "done"}
    # 40 advection pairs and 16 Darcy (coefficient -> solution) pairs, dealt to 2 ranks in batches of 4:
    # 5 + 2 batches an epoch. Both ranks trained the same task at every step, so they count alike.
    m0, m1 = recs[0].metrics, recs[1].metrics
    counts = {t: m0[f"steps_{t}"] for t in ("advection1d", "darcy2d")}
    assert counts == {t: m1[f"steps_{t}"] for t in counts} and sum(counts.values()) == 12 and min(counts.values()) >= 2
    assert m0["eval_loss_darcy2d"] > 0 and m0["eval_loss_advection1d"] > 0
    assert "56 pairs (advection1d 40, darcy2d 16), 2 rank(s)" in run.log_path("job").read_text()


def test_steady_task_is_cached_as_coefficient_then_solution(two_task_cache):
    meta = json.loads((two_task_cache / "darcy2d_train" / ".cache_metadata.json").read_text())
    assert meta["frames"] == "coefficient,solution" and meta["latent_shape"] == [2, 16, 32]
    assert json.loads((two_task_cache / "advection1d_train" / ".cache_metadata.json").read_text())["latent_shape"][0] == 6
    # Frame 0 sees the coefficient alone: another solution on the same permeability leaves it as it was.
    enc = build_encoder(2, 2, latent_tokens=4, latent_dim=8)
    steady = SteadyMapEncoder(enc, input_channels=1)
    fields = torch.randn(3, 1, 8, 8, 2)
    other = fields.clone()
    other[..., 1] = torch.randn(3, 1, 8, 8)
    with torch.no_grad():
        a, b = steady(fields), steady(other)
        assert a.shape == (3, 2, 4, 8)
        assert torch.equal(a[:, 0], b[:, 0]) and not torch.allclose(a[:, 1], b[:, 1])
        assert torch.allclose(a[:, 1], enc(fields)[:, 0])


def test_steady_cache_without_its_coefficient_frame_is_refused_in_one_line(two_task_cache, tmp_path):
    import shutil

    old = tmp_path / "cache"
    shutil.copytree(two_task_cache, old)
    meta_path = old / "darcy2d_train" / ".cache_metadata.json"
    meta = json.loads(meta_path.read_text())
    del meta["frames"]  # as the precompute wrote Darcy before steady tasks: one latent frame of (a, u)
    meta["latent_shape"] = [1, 16, 32]
    meta_path.write_text(json.dumps(meta))
    cfg = TrainConfig(cache_dir=str(old), tasks=["advection1d", "darcy2d"]).validate()
    with pytest.raises(train_mod.UpsError, match=r"darcy2d is a steady task.*--tasks darcy2d --overwrite"):
        train_mod.check_cache(cfg)


def test_task_batches_follow_one_schedule_on_every_rank():
    sizes, world = [40, 16, 3], 2
    ranks = [train_mod.TaskBatchSampler(sizes, 4, rank=r, world=world, seed=7) for r in range(world)]
    assert ranks[0].batches_per_task == [5, 2, 0] and len(ranks[0]) == 7
    orders = set()
    for epoch in (0, 1):
        for s in ranks:
            s.set_epoch(epoch)
        batches = [list(s) for s in ranks]
        tasks = [[{t for t, _ in b} for b in rank_batches] for rank_batches in batches]
        assert tasks[0] == tasks[1] and all(len(t) == 1 for t in tasks[0])  # one task a step, the same on both
        orders.add(tuple(next(iter(t)) for t in tasks[0]))
        for task, n in enumerate(sizes):
            seen = [[k for b in rank_batches for t, k in b if t == task] for rank_batches in batches]
            assert not set(seen[0]) & set(seen[1]) and all(0 <= k < n for k in seen[0] + seen[1])
    assert len(orders) == 2  # reshuffled each epoch


def test_ranks_on_different_tasks_are_caught_by_the_step_all_reduce():
    class TwoRanks:
        rank, world = 1, 2

    same = torch.tensor([0.0, 0.5, 1.0 + 1.0, 1.0 + 1.0])
    train_mod.check_same_task(same, 1, TwoRanks(), 3, ["advection1d", "darcy2d"])
    split = torch.tensor([0.0, 0.5, 0.0 + 1.0, 0.0 + 1.0])
    with pytest.raises(train_mod.TrainError, match="step 3: ranks trained different tasks"):
        train_mod.check_same_task(split, 1, TwoRanks(), 3, ["advection1d", "darcy2d"])
