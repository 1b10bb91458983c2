"""A data script with a background thread that refreshes a shared cache under a lock. It
knows nothing of ups.

With forked DataLoader workers it deadlocks: a worker is forked while the refresh thread
holds the lock, so in the worker the lock is held forever (the thread that would release
it does not exist there). With num_workers=0 it runs fine. A classic of fork + threads.
Like many scripts written for workers, it passes multiprocessing_context and prefetch_factor
unconditionally, which DataLoader refuses with num_workers=0.
"""

import argparse
import threading
import time

import torch
from torch.utils.data import DataLoader, Dataset

LOCK = threading.Lock()
CACHE = {"scale": 1.0}


def refresh() -> None:
    while True:
        with LOCK:
            CACHE["scale"] = 1.0
            time.sleep(0.1)
        time.sleep(0.001)


class Scaled(Dataset):
    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> torch.Tensor:
        with LOCK:
            return torch.full((4,), float(i) * CACHE["scale"])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args()
    threading.Thread(target=refresh, daemon=True).start()
    time.sleep(0.05)  # the refresh thread is inside the lock from here on, most of the time
    loader = DataLoader(Scaled(), batch_size=4, num_workers=args.workers, multiprocessing_context="fork",
                        persistent_workers=args.workers > 0, prefetch_factor=2 if args.workers else None)
    total = sum(batch.sum().item() for batch in loader)
    print(f"sum {total:.1f}")


if __name__ == "__main__":
    main()
