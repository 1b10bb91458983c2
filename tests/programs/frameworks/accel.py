"""accelerate's documented training loop (``Accelerator()``, ``prepare``, ``accelerator.backward``)
on a tiny model and synthetic data. It knows nothing of ups.

    accelerate launch --multi_gpu --num_processes 2 accel.py   # (CPU here: gloo)
    torchrun --nproc-per-node 2 accel.py

--fail raise|exit|hang makes --fail-rank misbehave at --fail-step.
"""

import argparse
import os
import time

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--step-time", type=float, default=0.05)
    p.add_argument("--fail", choices=["raise", "exit", "hang"])
    p.add_argument("--fail-rank", type=int, default=1)
    p.add_argument("--fail-step", type=int, default=5)
    args = p.parse_args()
    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = TensorDataset(torch.randn(512, 16), torch.randn(512, 1))
    loader = DataLoader(data, batch_size=8, shuffle=True, num_workers=args.workers)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    step = 0
    while step < args.steps:
        for x, y in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            step += 1
            if args.fail and accelerator.process_index == args.fail_rank and step == args.fail_step:
                if args.fail == "raise":
                    raise RuntimeError(f"loss is NaN on rank {accelerator.process_index} at step {step}")
                if args.fail == "exit":
                    os._exit(0)
                if args.fail == "hang":
                    time.sleep(3600)
            time.sleep(args.step_time)
            if step >= args.steps:
                break
    accelerator.end_training()


if __name__ == "__main__":
    main()
