"""Tensor parallel (DTensor) training, in the shape of PyTorch's TP tutorial / pytorch/examples
distributed/tensor_parallelism/tensor_parallel_example.py: a 1-D DeviceMesh, ToyModel with
in_proj ColwiseParallel and out_proj RowwiseParallel through parallelize_module, AdamW(foreach).
The input must be the same on every TP rank: the tutorial seeds torch per iteration; here a
DataLoader over a fixed dataset (no DistributedSampler: TP ranks see the same batch).
torchrun --standalone --nproc-per-node 2 dtensor_tp_tutorial.py

TUTORIAL_FAULT=hang:STEP|raise:STEP|onesided:STEP|nan:STEP acts on rank 1 (tests/test_sharded.py;
the line it prints first says when) at STEP.
"""
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.utils.data import DataLoader, TensorDataset


class ToyModel(nn.Module):
    """MLP based model"""

    def __init__(self):
        super().__init__()
        self.in_proj = nn.Linear(10, 32)
        self.relu = nn.ReLU()
        self.out_proj = nn.Linear(32, 5)

    def forward(self, x):
        return self.out_proj(self.relu(self.in_proj(x)))


def parse_fault():
    kind, _, step = os.environ.get("TUTORIAL_FAULT", "").partition(":")
    return kind, int(step or -1)


_world_size = int(os.environ["WORLD_SIZE"])
device_mesh = init_device_mesh(device_type="cpu", mesh_shape=(_world_size,), mesh_dim_names=("tp",))
_rank = device_mesh.get_rank()
fault, fault_step = parse_fault()
num_iters = int(os.environ.get("TUTORIAL_STEPS", "100"))

torch.manual_seed(0)
tp_model = ToyModel()
optimizer = torch.optim.AdamW(tp_model.parameters(), lr=0.25, foreach=True)
tp_model = parallelize_module(
    module=tp_model,
    device_mesh=device_mesh,
    parallelize_plan={
        "in_proj": ColwiseParallel(),
        "out_proj": RowwiseParallel(),
    },
)

g = torch.Generator().manual_seed(0)
loader = DataLoader(TensorDataset(torch.rand(num_iters * 20, 10, generator=g)), batch_size=20)
for i, (inp,) in enumerate(loader):
    if _rank == 1 and i == fault_step:
        print(f"rank 1: fault {fault} at step {i} at {time.time():.3f}", flush=True)
        if fault == "hang":
            time.sleep(3600)
        elif fault == "raise":
            raise RuntimeError(f"fault injected on rank 1 at step {i}")
        elif fault == "onesided":
            dist.all_reduce(torch.ones(1))
    output = tp_model(inp)
    loss = output.sum()
    if _rank == 1 and fault == "nan" and i >= fault_step:
        loss = loss * float("nan")
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    if _rank == 0 and i % 25 == 0:
        print(f"Tensor Parallel iter {i} loss {loss.item():.4f}", flush=True)
if _rank == 0:
    print(f"done {num_iters} steps", flush=True)
dist.destroy_process_group()
