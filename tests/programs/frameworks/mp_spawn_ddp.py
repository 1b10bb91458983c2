"""DDP started with torch.multiprocessing.spawn, as pytorch/examples' imagenet/main.py does it
(``mp.spawn(main_worker, nprocs=ngpus_per_node, args=(ngpus_per_node, args))``, each process
calling ``init_process_group`` with its rank). It knows nothing of ups.

    python mp_spawn_ddp.py --steps 20 --workers 2 [--fail raise|exit|hang --fail-rank 1 --fail-step 5]
"""

import argparse
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def misbehave(args, rank: int, step: int) -> None:
    if args.fail and rank == args.fail_rank and step == args.fail_step:
        if args.fail == "raise":
            raise RuntimeError(f"loss is NaN on rank {rank} at step {step}")
        if args.fail == "exit":
            os._exit(0)
        if args.fail == "hang":
            time.sleep(3600)


def main_worker(gpu: int, ngpus_per_node: int, args) -> None:
    rank = args.node_rank * ngpus_per_node + gpu
    dist.init_process_group("gloo", init_method=args.dist_url, world_size=args.world_size, rank=rank)
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)))
    data = TensorDataset(torch.randn(512, 16), torch.randn(512, 1))
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=8, sampler=sampler, num_workers=args.workers)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    step = 0
    for epoch in range(100):
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            misbehave(args, rank, step)
            time.sleep(args.step_time)
            if step >= args.steps:
                dist.destroy_process_group()
                return


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--step-time", type=float, default=0.05)
    p.add_argument("--fail", choices=["raise", "exit", "hang"])
    p.add_argument("--fail-rank", type=int, default=1)
    p.add_argument("--fail-step", type=int, default=5)
    p.add_argument("--node-rank", type=int, default=0)
    args = p.parse_args()
    ngpus_per_node = 2
    args.world_size = ngpus_per_node
    # a port the kernel says is free now (20000 + pid % 20000 fell in the ephemeral range, and a
    # client's connection there once made rank 0's store fail with EADDRINUSE)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    args.dist_url = f"tcp://127.0.0.1:{port}"
    mp.spawn(main_worker, nprocs=ngpus_per_node, args=(ngpus_per_node, args))


if __name__ == "__main__":
    main()
