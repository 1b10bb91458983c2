"""Training overhead of status reporting, and torchrun start-up. Prints one JSON line.

- step_ms_with_reporter / step_ms_without: median step time of the same training loop
  (same model, data and optimizer), alternating blocks (ABBA) with a live Reporter
  (heartbeat thread writing every second, advance + metrics every step) and with none;
  ratio_paired_median is the median over block pairs. Target ratio <= 1.01. The model is
  sized so one CPU step takes ~5-20 ms. reporter_calls_ns_per_step: advance + metrics alone.
- torchrun_first_step_s: `ups launch train --nproc 2` to both ranks' first step (from the
  rank records), on a small cache.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from ups.models.operator import LatentOperator  # noqa: E402
from ups.runs.rundir import RunDir  # noqa: E402
from ups.status.reader import read_status_dir  # noqa: E402
from ups.status.reporter import NullReporter, Reporter  # noqa: E402


def step_times(rep, model, opt, x, y, steps: int) -> list[float]:
    out = []
    for _ in range(steps):
        t = time.perf_counter()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        rep.advance()
        rep.metrics(loss=float(loss.detach()), lr=1e-3)
        out.append(time.perf_counter() - t)
    return out


def overhead(tmp: Path, device: torch.device) -> dict:
    torch.manual_seed(0)
    model = LatentOperator(16, 64, hidden=128, depth=2).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(32, 16, 64, device=device), torch.randn(32, 16, 64, device=device)
    run = RunDir.create(tmp / "runs", "bench")
    sampler = None
    if device.type == "cuda":  # the record carries torch's memory, as a training rank's does
        from ups.gpu.torch_memory import cuda_memory_sampler

        sampler = cuda_memory_sampler(device)
    live = Reporter(run.path, rank=0, total=10_000, unit="steps", gpu_sampler=sampler).start()
    null = NullReporter()
    step_times(null, model, opt, x, y, 20)  # warm-up
    with_rep, without, ratios = [], [], []
    for k in range(20):  # ABBA order cancels slow drift (clocks, allocator); ratio of paired block medians
        order = (live, null) if k % 2 == 0 else (null, live)
        blocks = {id(r): step_times(r, model, opt, x, y, 25) for r in order}
        a, b = statistics.median(blocks[id(live)]), statistics.median(blocks[id(null)])
        ratios.append(a / b)
        with_rep += blocks[id(live)]
        without += blocks[id(null)]
    live.close()
    a, b = statistics.median(with_rep) * 1000, statistics.median(without) * 1000
    n = 20_000
    t = time.perf_counter()
    for _ in range(n):  # the Reporter's own cost per step, measured directly
        live.advance()
        live.metrics(loss=0.5, lr=1e-3)
    per_step_ns = (time.perf_counter() - t) / n * 1e9
    return {"reporter_calls_ns_per_step": round(per_step_ns),
            "ratio_paired_median": round(statistics.median(ratios), 4),
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "step_ms_with_reporter": round(a, 3), "step_ms_without": round(b, 3), "ratio": round(a / b, 4), "ratio_target": 1.01}


def torchrun_start(tmp: Path) -> float:
    env = dict(os.environ, PYTHONPATH=str(REPO), UPS_RUNS_DIR=str(tmp / "runs2"), WANDB_MODE="disabled")
    data, cache = tmp / "data", tmp / "cache"
    subprocess.run([sys.executable, "-m", "ups", "data", "synth", "--task", "burgers1d", "--root", str(data), "--samples", "16",
                    "--timesteps", "8", "--resolution", "32"], env=env, check=True, capture_output=True)
    subprocess.run([sys.executable, "-m", "ups", "launch", "precompute", "--root", str(data), "--tasks", "burgers1d",
                    "--cache-dir", str(cache), "--legacy"], env=env, check=True, capture_output=True)
    cfg = tmp / "t.yaml"
    cfg.write_text("steps: 200\nbatch_size: 8\nwandb_mode: disabled\ndevice: cpu\n")  # gloo, as on CPU-only boxes
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "ups", "launch", "train", "--cache-dir", str(cache), "--tasks", "burgers1d",
                          "--config", str(cfg), "--nproc", "2", "--detach", "--json"], env=env, check=True, capture_output=True, text=True)
    run = RunDir(json.loads(res.stdout)["run_dir"])
    while True:
        ranks = [r for r in read_status_dir(run.status_dir).records if r.role == "rank"]
        if len(ranks) == 2 and all(r.step >= 1 for r in ranks):
            elapsed = time.perf_counter() - t0
            break
        if run.read_manifest().get("state") in ("failed", "killed"):
            raise SystemExit(f"the training run failed: {run.read_manifest().get('summary')}")
        if time.perf_counter() - t0 > 120:
            raise SystemExit("torchrun did not reach the first step within 120 s")
        time.sleep(0.05)
    subprocess.run([sys.executable, "-m", "ups", "kill", run.run_id, "--grace", "2"], env=env, capture_output=True)
    return elapsed


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", help="cpu, cuda or auto (cuda when available) for the overhead loop")
    args = ap.parse_args()
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as d:
        out = overhead(Path(d), device)
        out["torchrun_first_step_s"] = round(torchrun_start(Path(d)), 2)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
