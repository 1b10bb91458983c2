"""A single-process loop with ``torch.compile``, as the PyTorch torch.compile tutorial writes it
(``model = torch.compile(model)``), on a tiny model, synthetic data and 2 DataLoader workers.
It knows nothing of ups.

    python compiled.py [--fail raise|exit --fail-step 5]
"""

import argparse
import os
import time

import torch
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--step-time", type=float, default=0.05)
    p.add_argument("--fail", choices=["raise", "exit"])
    p.add_argument("--fail-step", type=int, default=5)
    args = p.parse_args()
    model = torch.compile(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(TensorDataset(torch.randn(256, 16), torch.randn(256, 1)), batch_size=8, shuffle=True,
                        num_workers=args.workers)
    step = 0
    while step < args.steps:
        for x, y in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            step += 1
            if args.fail and step == args.fail_step:
                if args.fail == "raise":
                    raise RuntimeError(f"loss is NaN at step {step}")
                os._exit(0)
            time.sleep(args.step_time)
            if step >= args.steps:
                break
    print(f"trained {step} steps", flush=True)


if __name__ == "__main__":
    main()
