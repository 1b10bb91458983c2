"""Precompute throughput. Prints one JSON line.

By default: whole-command wall time of ``python -m ups launch precompute`` (foreground, as a
user runs it: launch check, supervisor, job, follow view, to exit) against
``python scripts/plain_precompute.py`` (the loop a user writes: shards read into memory, a
DataLoader, the same encoder and seed, one torch.save per sample via temp + rename), on the
same synthetic data with the same workers and batch size, alternated (ABAB) ``--rounds``
times. ``ups_over_plain`` = median plain time / median ups time (throughput ratio; target
>= 0.95). Peak memory of each: the process tree of the command sampled every 20 ms with
psutil, as the largest sum of RSS over the tree (``*_peak_tree_rss_mb``; pages shared
across forks count once per process) and the largest single process
(``*_peak_proc_rss_mb``).

``--limits`` adds the older in-process figures: samples/s for legacy (num_workers=0) and
parallel with 1, 2 and 4 workers (the job alone, no launch), the read-only limit (the same
DataLoader with the same workers, nothing encoded) and the encode-only limit (the encoder on
in-memory batches). Target there: parallel_best / min(read_limit, encode_limit) >= 0.9.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from ups.data.shards import SampleReader, ShardIndex  # noqa: E402
from ups.data.synth import synthesize  # noqa: E402
from ups.faults import Faults  # noqa: E402
from ups.jobs import precompute as job_mod  # noqa: E402
from ups.jobs.readers import SplitDataset, collate  # noqa: E402
from ups.launch.config import PrecomputeConfig  # noqa: E402
from ups.models.encoder import build_encoder  # noqa: E402
from ups.status.reporter import NullReporter  # noqa: E402


def run_job(cfg: PrecomputeConfig) -> float:
    job = job_mod.PrecomputeJob(cfg, NullReporter(), Faults())
    t = time.perf_counter()
    job.execute()
    return job.total / (time.perf_counter() - t)


def read_limit(cfg: PrecomputeConfig, workers: int) -> float:
    index = ShardIndex.discover(cfg.root, cfg.tasks[0], "train")
    ds = SplitDataset(SampleReader(index), list(range(len(index))), Faults(), None)
    kwargs = {"prefetch_factor": cfg.prefetch_factor, "multiprocessing_context": "fork"} if workers else {}
    loader = torch.utils.data.DataLoader(ds, batch_size=cfg.batch_size, num_workers=workers, collate_fn=collate, **kwargs)
    t = time.perf_counter()
    n = sum(len(b["index"]) for b in loader)
    return n / (time.perf_counter() - t)


def encode_limit(cfg: PrecomputeConfig, n: int, device: torch.device) -> float:
    index = ShardIndex.discover(cfg.root, cfg.tasks[0], "train")
    reader = SampleReader(index)
    batches = [torch.stack([torch.from_numpy(reader.read(i).fields) for i in range(s, min(s + cfg.batch_size, n))])
               for s in range(0, n, cfg.batch_size)]
    enc = build_encoder(batches[0].shape[-1], 1, latent_tokens=cfg.latent_tokens, latent_dim=cfg.latent_dim).to(device)
    dtype = torch.float16
    with torch.inference_mode():
        enc(batches[0].to(device)).cpu()  # warm-up
        t = time.perf_counter()
        for b in batches:  # host -> device -> host, as the job does
            enc(b.to(device)).to(dtype).cpu()
    return n / (time.perf_counter() - t)


def measure(cmd: list[str], env: dict[str, str]) -> dict[str, float]:
    """Wall time of ``cmd`` from start to exit, and the peak RSS of its process tree."""
    import psutil

    peak = {"tree": 0, "proc": 0}
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    stop = threading.Event()

    def sample() -> None:
        try:
            top = psutil.Process(proc.pid)
        except psutil.NoSuchProcess:
            return
        while not stop.is_set():
            total = 0
            try:
                procs = [top, *top.children(recursive=True)]
            except psutil.NoSuchProcess:
                break
            for p in procs:
                try:
                    rss = p.memory_info().rss
                except psutil.Error:
                    continue
                total += rss
                peak["proc"] = max(peak["proc"], rss)
            peak["tree"] = max(peak["tree"], total)
            stop.wait(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, err = proc.communicate()
    wall = time.perf_counter() - t
    stop.set()
    sampler.join()
    if proc.returncode != 0:
        sys.exit(f"bench: {' '.join(cmd[:4])} ... exited {proc.returncode}:\n{err.decode()[-2000:]}")
    return {"s": wall, "tree_mb": peak["tree"] / 2**20, "proc_mb": peak["proc"] / 2**20}


def versus_plain(args: argparse.Namespace, root: Path, work: Path, device: torch.device) -> dict:
    """ABAB: the whole ``ups launch precompute`` command against the plain loop."""
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("UPS_RUN_DIR", None)
    ups_cmd = [sys.executable, "-m", "ups", "launch", "precompute", "--root", str(root), "--tasks", "burgers1d",
               "--splits", "train", "--num-workers", str(args.plain_workers), "--batch-size", str(args.batch_size),
               "--device", str(device), "--runs-dir", str(work / "runs")]
    plain_cmd = [sys.executable, str(REPO / "scripts" / "plain_precompute.py"), "--root", str(root), "--task", "burgers1d",
                 "--split", "train", "--workers", str(args.plain_workers), "--batch-size", str(args.batch_size),
                 "--device", str(device)]
    runs: dict[str, list[dict[str, float]]] = {"ups": [], "plain": []}
    for r in range(args.rounds):
        order = ("ups", "plain") if r % 2 == 0 else ("plain", "ups")
        for name in order:
            out = work / f"out_{name}"
            shutil.rmtree(out, ignore_errors=True)
            cmd = ups_cmd + ["--cache-dir", str(out)] if name == "ups" else plain_cmd + ["--out", str(out)]
            runs[name].append(measure(cmd, env))
            shutil.rmtree(out, ignore_errors=True)
    med = {k: statistics.median(x["s"] for x in v) for k, v in runs.items()}
    return {
        "workers": args.plain_workers,
        "rounds": args.rounds,
        "ups_s": [round(x["s"], 2) for x in runs["ups"]],
        "plain_s": [round(x["s"], 2) for x in runs["plain"]],
        "ups_over_plain": round(med["plain"] / med["ups"], 3),
        "ups_over_plain_best": round(min(x["s"] for x in runs["plain"]) / min(x["s"] for x in runs["ups"]), 3),
        "ups_peak_tree_rss_mb": round(max(x["tree_mb"] for x in runs["ups"])),
        "plain_peak_tree_rss_mb": round(max(x["tree_mb"] for x in runs["plain"])),
        "ups_peak_proc_rss_mb": round(max(x["proc_mb"] for x in runs["ups"])),
        "plain_peak_proc_rss_mb": round(max(x["proc_mb"] for x in runs["plain"])),
        "target_ups_over_plain": 0.95,
    }


def limits(args: argparse.Namespace, root: Path, d: str, device: torch.device) -> dict:
    counts = tuple(int(w) for w in args.workers.split(","))
    base = dict(root=str(root), tasks=["burgers1d"], splits=["train"], batch_size=args.batch_size, device=str(device), overwrite=True)
    rates = {}
    for workers in (0, *counts):
        cfg = PrecomputeConfig(**base, cache_dir=str(Path(d) / f"cache{workers}"), num_workers=workers).validate()
        rates[workers] = run_job(cfg)
    cfg = PrecomputeConfig(**base, cache_dir=str(Path(d) / "x"), num_workers=2).validate()
    reads = {w: read_limit(cfg, w) for w in counts}
    enc = encode_limit(cfg, args.samples, device)
    best_workers = max(counts, key=lambda w: rates[w])
    best = rates[best_workers]
    limit = min(reads[best_workers], enc)
    return {
        "legacy_sps": round(rates[0], 1),
        **{f"parallel_{w}_sps": round(rates[w], 1) for w in counts},
        "read_limit_sps": {str(w): round(r, 1) for w, r in reads.items()},
        "encode_limit_sps": round(enc, 1),
        "parallel_best_workers": best_workers,
        "write_workers": job_mod.PrecomputeJob(cfg, NullReporter(), Faults()).write_workers,
        "parallel_best_over_limit": round(best / limit, 3),
        "parallel_best_over_legacy": round(best / rates[0], 3),
        "target_over_limit": 0.9,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=3072)
    ap.add_argument("--resolution", type=int, default=256)
    ap.add_argument("--timesteps", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--device", default="auto", help="auto (cuda when available), cpu or cuda")
    ap.add_argument("--rounds", type=int, default=4, help="runs of each command, alternated (ABAB)")
    ap.add_argument("--plain-workers", type=int, default=2, help="DataLoader workers for both commands")
    ap.add_argument("--limits", action="store_true", help="also the in-process legacy/parallel/read/encode figures")
    ap.add_argument("--no-plain", action="store_true", help="skip the whole-command comparison")
    ap.add_argument("--workers", default="1,2,4", help="with --limits: parallel worker counts, comma-separated")
    args = ap.parse_args()
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    result: dict = {
        "samples": args.samples,
        "sample_shape": [args.timesteps, args.resolution, 1],
        "batch_size": args.batch_size,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
    }
    with tempfile.TemporaryDirectory() as d:
        root = Path(d) / "data"
        synthesize(root, "burgers1d", "train", args.samples, shards=4, timesteps=args.timesteps, resolution=args.resolution)
        if not args.no_plain:
            result.update(versus_plain(args, root, Path(d), device))
        if args.limits:
            result.update(limits(args, root, d, device))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
