"""2-D parallel training (FSDP2 over "dp", tensor parallel over "tp"), in the shape of PyTorch's
"Large Scale Transformer model training with Tensor Parallel" tutorial / pytorch/examples
distributed/tensor_parallelism/fsdp_tp_example.py: a 2-D DeviceMesh, parallelize_module on
mesh["tp"], fully_shard on mesh["dp"], AdamW(foreach), the same batch on the TP ranks of a DP
replica.  torchrun --standalone --nproc-per-node 4 fsdp_tp_2d_tutorial.py

TUTORIAL_FAULT=hang:STEP|raise:STEP acts on rank 1 (tests/test_sharded.py; the line it prints
first says when) at STEP.
"""
import os
import time

import torch
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


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


tp_size = 2
_world_size = int(os.environ["WORLD_SIZE"])
dp_size = _world_size // tp_size
device_mesh = init_device_mesh("cpu", (dp_size, tp_size), mesh_dim_names=("dp", "tp"))
tp_mesh = device_mesh["tp"]
dp_mesh = device_mesh["dp"]
_rank = device_mesh.get_rank()
dp_rank = dp_mesh.get_local_rank()
fault, fault_step = parse_fault()
num_iters = int(os.environ.get("TUTORIAL_STEPS", "100"))

torch.manual_seed(0)
model = ToyModel()
model = parallelize_module(model, tp_mesh, {"in_proj": ColwiseParallel(), "out_proj": RowwiseParallel()})
sharded_model = fully_shard(model, mesh=dp_mesh)
optimizer = torch.optim.AdamW(sharded_model.parameters(), lr=0.25, foreach=True)

for i in range(num_iters):
    if _rank == 1 and i == fault_step:
        print(f"rank 1: fault {fault} at step {i} at {time.time():.3f}", flush=True)
        if fault == "hang":
            time.sleep(3600)
        elif fault == "raise":
            raise RuntimeError(f"fault injected on rank 1 at step {i}")
    torch.manual_seed(i + dp_rank)  # the same input on the TP ranks of one DP replica
    inp = torch.rand(20, 10)
    output = sharded_model(inp)
    output.sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    if _rank == 0 and i % 25 == 0:
        print(f"2-D iter {i}", flush=True)
if _rank == 0:
    print(f"done {num_iters} steps", flush=True)
torch.distributed.destroy_process_group()
