"""Distributed data parallel training, the way the PyTorch DDP tutorial writes it.

    torchrun --standalone --nproc-per-node 2 ddp_tutorial.py DATA_DIR [--epochs 2]

DATA_DIR holds one file per sample: raw float32 (``*.bin``) or HDF5 (``*.h5``, dataset ``x``),
17 values each (16 features, 1 target). Gloo on CPU; two DataLoader workers per rank.

For drills, ``DDP_TUTORIAL_FAULT`` (this program's own switch; it knows nothing of any
monitoring tool) makes it misbehave the way real programs do:

    sleep:IDX                  __getitem__ of sample IDX never returns (time.sleep)
    raise:IDX                  __getitem__ of sample IDX raises (a corrupt sample)
    extra_all_reduce:STEP      rank 1 all-reduces a loss flag at STEP that rank 0 never does
    broadcast_vs_all_reduce:STEP   at STEP rank 0 all-reduces while rank 1 broadcasts

A sample file that is a FIFO (a file on a hung network mount) hangs in open() / h5py.File().
"""

import argparse
import os
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


def fault() -> tuple[str | None, int]:
    spec = os.environ.get("DDP_TUTORIAL_FAULT", "")
    kind, _, at = spec.partition(":")
    return (kind or None), int(at or -1)


class SampleFiles(Dataset):
    def __init__(self, root: str) -> None:
        self.files = sorted(os.path.join(root, name) for name in os.listdir(root))
        self.fault, self.fault_at = fault()

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, idx: int):
        path = self.files[idx]
        if self.fault == "sleep" and idx == self.fault_at:
            time.sleep(3600)  # a call that never comes back
        if self.fault == "raise" and idx == self.fault_at:
            raise ValueError(f"corrupt sample {idx}: {path}")
        if path.endswith(".h5"):
            import h5py

            with h5py.File(path, "r") as f:
                values = f["x"][()]
        else:
            with open(path, "rb") as f:
                values = np.frombuffer(f.read(), dtype=np.float32)
        return torch.from_numpy(values[:16].copy()), torch.from_numpy(values[16:17].copy())


class ToyModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net1 = nn.Linear(16, 32)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(32, 1)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def train(data_dir: str, epochs: int, batch_size: int) -> None:
    rank = dist.get_rank()
    kind, at = fault()
    dataset = SampleFiles(data_dir)
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=2)
    model = DDP(ToyModel())
    loss_fn = nn.MSELoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    step = 0
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            if step == at and kind == "extra_all_reduce" and rank == 1:
                flag = torch.tensor([float(torch.isfinite(loss))])
                dist.all_reduce(flag)  # only this rank checks: the others never join
            if step == at and kind == "broadcast_vs_all_reduce":
                t = torch.ones(4)
                if rank == 0:
                    dist.all_reduce(t)
                else:
                    dist.broadcast(t, src=0)
            loss.backward()
            optimizer.step()
            step += 1
        if rank == 0:
            print(f"epoch {epoch} loss {loss.item():.4f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("data_dir")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=4)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    try:
        train(args.data_dir, args.epochs, args.batch_size)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
