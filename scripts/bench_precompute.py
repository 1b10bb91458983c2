"""Precompute throughput. Prints one JSON line.

Same synthetic data for every mode: samples/s for legacy (num_workers=0) and parallel with
1, 2 and 4 workers (the whole job: read, encode, write), the read-only limit (the same
DataLoader with the same workers, nothing encoded) and the encode-only limit (the encoder
on in-memory batches). Targets: parallel_best / min(read_limit, encode_limit) >= 0.9.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from ups.data.shards import SampleReader, ShardIndex  # noqa: E402
from ups.data.synth import synthesize  # noqa: E402
from ups.faults import Faults  # noqa: E402
from ups.jobs import precompute as job_mod  # noqa: E402
from ups.jobs.config import PrecomputeConfig  # noqa: E402
from ups.models.encoder import build_encoder  # noqa: E402
from ups.status.reporter import NullReporter  # noqa: E402


def run_job(cfg: PrecomputeConfig) -> float:
    job = job_mod.PrecomputeJob(cfg, NullReporter(), Faults())
    t = time.perf_counter()
    job.execute()
    return job.total / (time.perf_counter() - t)


def read_limit(cfg: PrecomputeConfig, workers: int) -> float:
    index = ShardIndex.discover(cfg.root, cfg.tasks[0], "train")
    ds = job_mod.SplitDataset(SampleReader(index), list(range(len(index))), Faults(), None)
    kwargs = {"prefetch_factor": cfg.prefetch_factor, "multiprocessing_context": "fork"} if workers else {}
    loader = torch.utils.data.DataLoader(ds, batch_size=cfg.batch_size, num_workers=workers, collate_fn=job_mod._collate, **kwargs)
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=768)
    ap.add_argument("--resolution", type=int, default=256)
    ap.add_argument("--timesteps", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--device", default="auto", help="auto (cuda when available), cpu or cuda")
    ap.add_argument("--workers", default="1,2,4", help="parallel worker counts to measure, comma-separated")
    args = ap.parse_args()
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    counts = tuple(int(w) for w in args.workers.split(","))
    torch.set_num_threads(max(1, torch.get_num_threads()))
    with tempfile.TemporaryDirectory() as d:
        root = Path(d) / "data"
        synthesize(root, "burgers1d", "train", args.samples, shards=4, timesteps=args.timesteps, resolution=args.resolution)
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
    print(json.dumps({
        "samples": args.samples,
        "sample_shape": [args.timesteps, args.resolution, 1],
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "legacy_sps": round(rates[0], 1),
        **{f"parallel_{w}_sps": round(rates[w], 1) for w in counts},
        "read_limit_sps": {str(w): round(r, 1) for w, r in reads.items()},
        "encode_limit_sps": round(enc, 1),
        "parallel_best_workers": best_workers,
        "write_workers": job_mod.PrecomputeJob(cfg, NullReporter(), Faults()).write_workers,
        "parallel_best_over_limit": round(best / limit, 3),
        "parallel_best_over_legacy": round(best / rates[0], 3),
        "target_over_limit": 0.9,
    }))


if __name__ == "__main__":
    main()
