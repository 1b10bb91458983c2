"""A training loop whose DataLoader worker hangs reading one sample (a read from a hung mount,
as seen from the worker: it never returns), while the same read in the main process works.
It knows nothing of ups.

    python worker_hang_train.py --steps 60 --hang-index 100 [--num-workers 2]

With ``num_workers=0`` (what ``--on-worker-hang fallback`` relaunches with) it runs to the end.
"""

import argparse
import time

import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info


class Samples(Dataset):
    def __init__(self, n: int, hang_index: int) -> None:
        self.n = n
        self.hang_index = hang_index

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if i == self.hang_index and get_worker_info() is not None:
            while True:  # the worker's read never comes back
                time.sleep(0.5)
        return torch.full((8,), float(i))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--hang-index", type=int, default=100)
    p.add_argument("--num-workers", type=int, default=2)
    p.add_argument("--step-time", type=float, default=0.02)
    args = p.parse_args()

    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(Samples(4 * args.steps, args.hang_index), batch_size=4, num_workers=args.num_workers)
    steps = 0
    for batch in loader:
        loss = model(batch).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(args.step_time)
        steps += 1
    print(f"done: {steps} steps", flush=True)


if __name__ == "__main__":
    main()
