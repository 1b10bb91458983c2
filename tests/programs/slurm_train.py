"""A SLURM-aware training script, written the way such PyTorch scripts are: each task ``srun``
starts is a rank, its rank and world size from SLURM_PROCID and SLURM_NTASKS, the store at
MASTER_ADDR/MASTER_PORT (the batch script exports them), gloo on CPU. It knows nothing of ups.

    --steps N         train N steps (0.1 s each), then end
    --hang-rank R     rank R calls a function that never returns at step --hang-at (its peer
                      waits in the all-reduce of the next step)
"""

import argparse
import os
import time

import torch
import torch.distributed as dist


def wait_for_the_answer():
    time.sleep(3600)  # a call that never comes back


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=100000)
    ap.add_argument("--hang-rank", type=int, default=-1)
    ap.add_argument("--hang-at", type=int, default=5)
    args = ap.parse_args()
    rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(args.steps):
        if rank == args.hang_rank and step == args.hang_at:
            print(f"rank {rank} waits at step {step}\n", end="", flush=True)
            wait_for_the_answer()
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(torch.randn(8, 16)), torch.randn(8, 1))
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        opt.step()
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f}\n", end="", flush=True)
        time.sleep(0.1)
    dist.destroy_process_group()
    print(f"rank {rank} done\n", end="", flush=True)


if __name__ == "__main__":
    main()
