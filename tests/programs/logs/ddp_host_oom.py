"""PyTorch's DDP tutorial (a model wrapped in DistributedDataParallel, gloo on CPU, a few SGD
steps), run by torchrun with two ranks. At step 3 rank 1 asks the host for a buffer no machine
has, and the CPU allocator refuses it, as it does for a batch or an array too big for the RAM.
It knows nothing of ups.

    torchrun --standalone --nproc-per-node 2 ddp_host_oom.py
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


class ToyModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = DDP(ToyModel())
    loss_fn = nn.MSELoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.001)
    try:
        for step in range(6):
            optimizer.zero_grad()
            outputs = model(torch.randn(20, 10))
            if rank == 1 and step == 3:
                cache = torch.empty(1 << 62, dtype=torch.uint8)  # 4 EiB: refused by the host
                outputs = outputs + cache[:1].float()
            loss_fn(outputs, torch.randn(20, 5)).backward()
            optimizer.step()
            print(f"rank {rank} step {step} done", flush=True)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
