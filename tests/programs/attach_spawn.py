"""Distributed data parallel training started with ``mp.spawn``, the way PyTorch's DDP tutorial
writes it (``python attach_spawn.py``; gloo, CPU), all-reducing its loss for the log each step;
rank 1 sleeps in its own code at step 30, before that all_reduce."""

import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from ddp_tutorial import ToyModel  # the tutorial's model (16 in, 1 out), beside this file
from torch.nn.parallel import DistributedDataParallel as DDP


def setup(rank, world_size, port):
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = port
    dist.init_process_group("gloo", rank=rank, world_size=world_size)


def stuck_here():
    time.sleep(3600)


def demo_basic(rank, world_size, port):
    setup(rank, world_size, port)
    model = DDP(ToyModel())
    loss_fn = nn.MSELoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.001)
    for step in range(100000):
        optimizer.zero_grad()
        loss = loss_fn(model(torch.randn(20, 16)), torch.randn(20, 1))
        loss.backward()
        optimizer.step()
        if rank == 1 and step == 30:
            print(f"rank 1 waits at step {step}", flush=True)
            stuck_here()
        logged = loss.detach().clone()
        dist.all_reduce(logged)  # the mean loss for the log
        time.sleep(0.05)
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(demo_basic, args=(2, sys.argv[1] if len(sys.argv) > 1 else "29533"), nprocs=2, join=True)
