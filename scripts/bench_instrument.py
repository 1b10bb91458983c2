"""Cost of the zero-code-change instrumentation (`ups launch torchrun|python`). One JSON line.

- step_ratio_paired_median: a small model's training step (DataLoader batch, forward,
  backward, optimizer step, one all_reduce on a 1-rank gloo group) with the instrumentation
  on (every torch hook patched in, the process's record written by its heartbeat thread)
  over off (torch's own functions, no record), in alternating blocks in one process (ABBA),
  median over block pairs of the blocks' median CPU time per step. Target <= 1.01. Beside
  it, an A/A control (off against off, interleaved): how far from 1.0 this machine's noise
  alone puts a ratio at the moment (other processes on a 2-core box move it by percents).
  That step is ~1.5-2 ms on one CPU thread: the hooks' worst case, where their fixed cost
  per step (added_us_per_step: one DataLoader batch, one backward, one optimizer step, one
  collective) weighs most.
- typical_step_ratio_paired_median: the same loop with a 4x wider model (~20-30 ms a step
  on this box; a real model's GPU step is longer still), the same ABBA method and control.
- fsdp2_step_ratio_paired_median: the same ABBA method on an FSDP2 loop (fully_shard on 4
  blocks and the root, AdamW, clip_grad_norm_ over DTensor grads; 2 ranks of a gloo group on
  this box, each its own process, toggling the hooks at the same steps), rank 0's CPU time, with fsdp2_collectives_per_step and fsdp2_added_us_per_collective
  (the step's added CPU time over the collectives seen in it). collective_added_us: one
  collective in a micro-loop (an async all_gather_single + Work.wait, as FSDP2 issues it, and
  a plain all_reduce), instrumented minus bare.
- startup_added_ms: `python -c pass` started with the instrumentation's environment minus
  the same without (median of 25 alternating runs each): what every Python process of a job
  pays, torch or not. Target <= 30 ms. Measured on a copy of the package with its bytecode
  compiled, as an installed package has it (pip compiles at install; an editable checkout
  writes __pycache__ on first import): a box that sets PYTHONDONTWRITEBYTECODE=1, as this
  one does, would otherwise make every start compile ups's modules, a cost of that setting,
  not of the instrumentation. That case is measured too and reported beside it,
  startup_added_ms_no_bytecode. torch_import_added_ms: the same for `import torch`
  (post-import patching), compiled, for information.
"""

from __future__ import annotations

import compileall
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# (width of the model, steps per block, block pairs): the small step (~1.5-2 ms on one CPU
# thread, the hooks' worst case: hundreds of batches, backwards and collectives a second) and a
# typical one (~20-30 ms, still far shorter than a GPU step of a real model).
SMALL = (128, 150, 16)
TYPICAL = (512, 12, 12)
FSDP2 = (20, 8)  # FSDP2 loop: steps per block, block pairs
STARTS = 25


def child_env(run_dir: str | None, root: Path = REPO) -> dict[str, str]:
    """The environment of a job's process (``run_dir``) or of the same process without ups,
    with the ups package found under ``root``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("UPS_")}
    env["PYTHONPATH"] = str(root)
    if run_dir is not None:
        site_dir = str(root / "ups" / "instrument" / "site")
        env.update(UPS_RUN_DIR=run_dir, UPS_TOP_ROLE="rank", PYTHONPATH=os.pathsep.join([site_dir, str(root)]))
    return env


def package_copy(dest: Path, *, compiled: bool) -> Path:
    """A copy of the ups package under ``dest``, its bytecode compiled or none at all."""
    shutil.copytree(REPO / "ups", dest / "ups", ignore=shutil.ignore_patterns("__pycache__"))
    if compiled:
        compileall.compile_dir(str(dest / "ups"), quiet=1)
    return dest


def startup_ms(code: str, run_dir: str, root: Path, *, no_bytecode: bool = False) -> tuple[float, float]:
    on, off = [], []
    envs = [child_env(run_dir, root), child_env(None, root)]
    for env in envs:
        if no_bytecode:
            env["PYTHONDONTWRITEBYTECODE"] = "1"  # the copy stays without bytecode
    for _ in range(STARTS):
        for env, out in ((envs[0], on), (envs[1], off)):
            t = time.perf_counter()
            subprocess.run([sys.executable, "-c", code], env=env, check=True)
            out.append((time.perf_counter() - t) * 1000)
    return statistics.median(on), statistics.median(off)


STEP_BENCH = r"""
import json, os, statistics, sys, time
import torch, torch.distributed as dist
from ups.instrument import boot
from ups.instrument.torch import set_enabled

torch.manual_seed(0)
torch.set_num_threads(1)
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
BLOCK, PAIRS, WIDTH = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
data = torch.utils.data.TensorDataset(torch.randn(4096, WIDTH), torch.randn(4096, WIDTH))
loader = torch.utils.data.DataLoader(data, batch_size=64, shuffle=True)
model = torch.nn.Sequential(torch.nn.Linear(WIDTH, 4 * WIDTH), torch.nn.GELU(), torch.nn.Linear(4 * WIDTH, WIDTH))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
rep = boot.state.rep
batches = iter(loader)

def block(n):
    # CPU time of this process per step (the heartbeat thread included): other processes
    # competing for the cores change it much less than they change wall time.
    global batches
    out = []
    for _ in range(n):
        t = time.process_time()
        try:
            x, y = next(batches)
        except StopIteration:
            batches = iter(loader)
            x, y = next(batches)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        logged = loss.detach().clone()
        dist.all_reduce(logged)
        out.append(time.process_time() - t)
    return statistics.median(out)

def condition(on):
    # on: torch hooks patched in and the heartbeat thread writing; off: neither.
    set_enabled(on)
    beat = rep.heartbeat
    if on and beat.thread is None:
        beat.stopping.clear()
        rep.start()
    elif not on and beat.thread is not None:
        beat.stopping.set()
        beat.wake.set()
        beat.thread.join()
        beat.thread = None
    return block(BLOCK)

assert rep is not None, "the instrumentation did not start"
block(BLOCK)  # warm-up
ratios, control, on_ms, off_ms = [], [], [], []
for k in range(PAIRS):
    order = (True, False) if k % 2 == 0 else (False, True)  # ABBA
    res = {}
    for on in order:
        res[on] = condition(on)
    ratios.append(res[True] / res[False])
    on_ms.append(res[True] * 1000)
    off_ms.append(res[False] * 1000)
    if k % 2 == 0:  # an A/A control pair (off against off): the noise floor of this machine now
        control.append(condition(False) / condition(False))
print(json.dumps({"ratio": statistics.median(ratios), "control": statistics.median(control),
                  "control_spread": statistics.median(abs(c - 1) for c in control),
                  "on_ms": statistics.median(on_ms), "off_ms": statistics.median(off_ms),
                  "record_step": rep.step, "coll_seq": rep._coll_seq}))
"""


FSDP2_BENCH = r"""
import json, statistics, sys, time
import torch, torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from ups.instrument import boot
from ups.instrument.torch import set_enabled

torch.manual_seed(0)
torch.set_num_threads(1)
BLOCK, PAIRS, RANK, STORE = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
dist.init_process_group("gloo", init_method=f"file://{STORE}", rank=RANK, world_size=2)
DIM = 64
model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.LayerNorm(DIM), torch.nn.Linear(DIM, 4 * DIM), torch.nn.GELU(),
                                                  torch.nn.Linear(4 * DIM, DIM)) for _ in range(4)])
for block in model:
    fully_shard(block)
fully_shard(model)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x, y = torch.randn(8, 32, DIM), torch.randn(8, 32, DIM)
rep = boot.state.rep

def block(n):
    out = []
    for _ in range(n):
        t = time.process_time()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        out.append(time.process_time() - t)
    return statistics.median(out)

def micro(n):
    # one collective as FSDP2 issues it (async all_gather_single + Work.wait), and a plain all_reduce
    a, b = torch.zeros(64), torch.zeros(128)
    t = time.process_time()
    for _ in range(n):
        dist.all_gather_single(b, a, async_op=True).wait()
        dist.all_reduce(a)
    return (time.process_time() - t) / (2 * n)

def condition(on, fn, n):
    set_enabled(on)
    return fn(n)

assert rep is not None, "the instrumentation did not start"
block(BLOCK)
seq0 = rep._coll_seq
block(BLOCK)
per_step = (rep._coll_seq - seq0) / BLOCK
ratios, control, on_ms, off_ms, coll_on, coll_off = [], [], [], [], [], []
for k in range(PAIRS):
    order = (True, False) if k % 2 == 0 else (False, True)
    res, mic = {}, {}
    for on in order:
        res[on] = condition(on, block, BLOCK)
        mic[on] = condition(on, micro, 200)
    ratios.append(res[True] / res[False])
    on_ms.append(res[True] * 1000)
    off_ms.append(res[False] * 1000)
    coll_on.append(mic[True] * 1e6)
    coll_off.append(mic[False] * 1e6)
    if k % 2 == 0:
        control.append(condition(False, block, BLOCK) / condition(False, block, BLOCK))
set_enabled(True)
print(json.dumps({"ratio": statistics.median(ratios), "control": statistics.median(control),
                  "control_spread": statistics.median(abs(c - 1) for c in control),
                  "on_ms": statistics.median(on_ms), "off_ms": statistics.median(off_ms),
                  "collectives_per_step": per_step,
                  "coll_us_on": statistics.median(coll_on), "coll_us_off": statistics.median(coll_off)}))
"""


def fsdp2_bench(steps: int, pairs: int, run_dir: str, root: Path) -> dict:
    """Two ranks (processes) of one gloo group, each toggling the hooks at the same steps
    (the schedule is the same on both); rank 0's figures."""
    store = Path(run_dir) / "fsdp2.store"
    ranks = [subprocess.Popen([sys.executable, "-c", FSDP2_BENCH, str(steps), str(pairs), str(r), str(store)],
                              env={**child_env(run_dir, root), "RANK": str(r), "WORLD_SIZE": "2"},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    outs = [p.communicate(timeout=900) for p in ranks]
    for p, (_, err) in zip(ranks, outs, strict=True):
        if p.returncode:
            raise RuntimeError(f"FSDP2 bench rank failed: {err[-2000:]}")
    return json.loads(outs[0][0].strip().splitlines()[-1])


def step_bench(width: int, steps: int, pairs: int, run_dir: str, root: Path) -> dict:
    res = subprocess.run([sys.executable, "-c", STEP_BENCH, str(steps), str(pairs), str(width)], env=child_env(run_dir, root),
                         capture_output=True, text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        (run / "status").mkdir(parents=True)
        compiled = package_copy(Path(tmp) / "compiled", compiled=True)
        on, off = startup_ms("pass", str(run), compiled)
        raw_on, raw_off = startup_ms("pass", str(run), package_copy(Path(tmp) / "raw", compiled=False), no_bytecode=True)
        t_on, t_off = startup_ms("import torch", str(run), compiled)
        step, typical = (step_bench(width, steps, pairs, str(run), compiled) for width, steps, pairs in (SMALL, TYPICAL))
        fsdp2 = fsdp2_bench(*FSDP2, str(run), compiled)
    print(json.dumps({
        "step_ratio_paired_median": round(step["ratio"], 4),
        "control_ratio_off_over_off": round(step["control"], 4),
        "control_median_abs_deviation": round(step["control_spread"], 4),
        "step_ms_on": round(step["on_ms"], 3),
        "step_ms_off": round(step["off_ms"], 3),
        "added_us_per_step": round((step["on_ms"] - step["off_ms"]) * 1000, 1),
        "typical_step_ratio_paired_median": round(typical["ratio"], 4),
        "typical_control_median_abs_deviation": round(typical["control_spread"], 4),
        "typical_step_ms_off": round(typical["off_ms"], 2),
        "fsdp2_step_ratio_paired_median": round(fsdp2["ratio"], 4),
        "fsdp2_control_median_abs_deviation": round(fsdp2["control_spread"], 4),
        "fsdp2_step_ms_off": round(fsdp2["off_ms"], 2),
        "fsdp2_collectives_per_step": fsdp2["collectives_per_step"],
        "fsdp2_added_us_per_collective": round((fsdp2["on_ms"] - fsdp2["off_ms"]) * 1000 / max(fsdp2["collectives_per_step"], 1), 1),
        "collective_us_on": round(fsdp2["coll_us_on"], 1),
        "collective_added_us": round(fsdp2["coll_us_on"] - fsdp2["coll_us_off"], 1),
        "steps_seen_by_record": step["record_step"],
        "collectives_seen_by_record": step["coll_seq"],
        "startup_ms_on": round(on, 1),
        "startup_ms_off": round(off, 1),
        "startup_added_ms": round(on - off, 1),
        "startup_added_ms_no_bytecode": round(raw_on - raw_off, 1),
        "torch_import_added_ms": round(t_on - t_off, 1),
        "targets": {"step_ratio_paired_median": 1.01, "typical_step_ratio_paired_median": 1.01, "startup_added_ms": 30,
                    "fsdp2_step_ratio_paired_median": 1.01},
    }))


if __name__ == "__main__":
    main()
