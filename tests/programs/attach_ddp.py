"""Distributed data parallel training the way the PyTorch DDP tutorial writes it, started with a
plain ``torchrun --standalone --nproc-per-node 2`` (gloo, CPU), knowing nothing of any tool.

``ATTACH_DDP_FAULT`` (this program's own switch) makes rank 1 misbehave at a step:

    sleep:STEP   rank 1 sleeps in its own code (a call that never returns)
    raise:STEP   rank 1 raises ValueError (a bad batch)
    raise_when:PATH   rank 1 raises ValueError once PATH exists
    log_loss:STEP     every rank all-reduces its loss for the log each step; rank 1 sleeps at
                      STEP before its all_reduce (rank 0 waits in an explicit all_reduce)
"""

import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from ddp_tutorial import ToyModel  # the tutorial's model (16 in, 1 out), beside this file
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS = int(os.environ.get("ATTACH_DDP_STEPS", "100000"))


def wait_for_the_answer():
    time.sleep(3600)  # a call that never comes back


def demo_basic():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    kind, _, arg = os.environ.get("ATTACH_DDP_FAULT", "").partition(":")
    at = int(arg) if arg.isdigit() else -1
    model = DDP(ToyModel())
    loss_fn = nn.MSELoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.001)
    for step in range(STEPS):
        if rank == 1 and step == at and kind == "sleep":
            print(f"rank 1 waits at step {step}", flush=True)
            wait_for_the_answer()
        if rank == 1 and kind == "raise_when" and os.path.exists(arg):
            raise ValueError(f"bad batch at step {step}")
        if rank == 1 and step == at and kind == "raise":
            raise ValueError(f"bad batch at step {step}")
        optimizer.zero_grad()
        outputs = model(torch.randn(20, 16))
        loss = loss_fn(outputs, torch.randn(20, 1))
        loss.backward()
        optimizer.step()
        if kind == "log_loss":
            if rank == 1 and step == at:
                print(f"rank 1 waits at step {step}", flush=True)
                wait_for_the_answer()
            logged = loss.detach().clone()
            dist.all_reduce(logged)
        if rank == 0 and step % 10 == 0:
            print(f"step {step}/{STEPS}", flush=True)
        time.sleep(0.05)
    dist.destroy_process_group()


if __name__ == "__main__":
    demo_basic()
