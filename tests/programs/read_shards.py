"""A data script shaped like the ones people write: mean and std of every shard's fields,
read by DataLoader workers. It knows nothing of ups.

    python read_shards.py DATA_DIR --per-shard 8 --workers 2
"""

import argparse
import glob
import os

import h5py
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset


class Shards(Dataset):
    def __init__(self, files: list[str], per_shard: int) -> None:
        self.items = [(f, i) for f in files for i in range(per_shard)]
        self.handles: dict[str, h5py.File] = {}

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, k: int) -> torch.Tensor:
        path, i = self.items[k]
        if path not in self.handles:  # opened lazily, in the worker
            self.handles[path] = h5py.File(path, "r")
        return torch.from_numpy(np.asarray(self.handles[path]["tensor"][i], dtype=np.float32))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("root")
    p.add_argument("--per-shard", type=int, default=8)
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args()
    files = sorted(glob.glob(os.path.join(args.root, "*.h5")))
    loader = DataLoader(Shards(files, args.per_shard), batch_size=4, num_workers=args.workers)
    total, sq, n = 0.0, 0.0, 0
    for batch in loader:
        total += batch.sum().item()
        sq += (batch ** 2).sum().item()
        n += batch.numel()
    mean = total / n
    print(f"{len(files)} shards, {n} values, mean {mean:.4f}, std {(sq / n - mean ** 2) ** 0.5:.4f}")


if __name__ == "__main__":
    main()
