"""A DDP training script shaped like the ones people write. It knows nothing of ups.

    torchrun --nproc-per-node 2 ddp_train.py --steps 30 --workers 2

--fail makes --fail-rank misbehave at --fail-step, as real programs do: raise (a NaN check),
exit (os._exit(0) from a library's error path), sleep (stuck in its own code while its peers
wait), oom (an activation too large to allocate), broadcast (the seeds' OOM handler: it tells
the others to skip with a broadcast that only the failing rank makes), segv (a crash in a
native extension while the model is built).
"""

import argparse
import ctypes
import datetime
import os
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class Trajectories(Dataset):
    """Synthetic (state, next state) pairs."""

    def __init__(self, n: int, dim: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, dim, generator=g)
        self.y = torch.roll(self.x, 1, dims=1) * 0.9

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


def build_model(crash: bool = False) -> torch.nn.Module:
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 32))
    if crash:
        ctypes.string_at(0)  # a native extension reading a null pointer
    return model


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--start-method", default="fork")
    p.add_argument("--step-time", type=float, default=0.0)
    p.add_argument("--fail", choices=["raise", "exit", "sleep", "oom", "broadcast", "segv"])
    p.add_argument("--fail-rank", type=int, default=1)
    p.add_argument("--fail-step", type=int, default=10)
    p.add_argument("--ckpt")
    p.add_argument("--pg-timeout", type=float, default=1800, help="seconds before a collective times out")
    args = p.parse_args()

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.pg_timeout))
    rank = dist.get_rank()
    data = Trajectories(1024, 32)
    sampler = DistributedSampler(data, shuffle=True)
    loader = DataLoader(data, batch_size=16, sampler=sampler, num_workers=args.workers,
                        multiprocessing_context=args.start_method if args.workers else None,
                        persistent_workers=args.workers > 0)
    model = torch.nn.parallel.DistributedDataParallel(build_model(args.fail == "segv" and rank == args.fail_rank))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    step, epoch = 0, 0
    while step < args.steps:
        sampler.set_epoch(epoch)
        for x, y in loader:
            if args.fail and rank == args.fail_rank and step == args.fail_step:
                if args.fail == "raise":
                    raise FloatingPointError(f"loss is NaN at step {step}")
                if args.fail == "exit":
                    os._exit(0)
                if args.fail == "sleep":
                    while True:
                        time.sleep(0.5)
            try:
                if args.fail in ("oom", "broadcast") and rank == args.fail_rank and step == args.fail_step:
                    x = x.new_empty(2**45)  # far more than the box has: the allocator refuses
                loss = torch.nn.functional.mse_loss(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
            except RuntimeError as exc:
                if args.fail != "broadcast" or "can't allocate memory" not in str(exc):
                    raise
                skip = torch.ones(1)
                dist.broadcast(skip, src=rank)  # "skip this step": but the others never enter it
                continue
            logged = loss.detach().clone()
            dist.all_reduce(logged)
            if rank == 0 and step % 10 == 0:
                print(f"step {step} loss {logged.item() / dist.get_world_size():.4f}", flush=True)
            step += 1
            time.sleep(args.step_time)
            if step >= args.steps:
                break
        epoch += 1
    if rank == 0 and args.ckpt:
        torch.save(model.module.state_dict(), args.ckpt)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
