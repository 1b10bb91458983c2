"""Lightning's documented minimal example (a LightningModule, a DataLoader, ``Trainer.fit``),
on CPU with DDP across two processes. It knows nothing of ups.

    python lit.py                      # Lightning starts rank 1 itself (re-executes this script)
    torchrun --nproc-per-node 2 lit.py # torchrun starts both ranks

--fail raise|exit|hang makes --fail-rank misbehave at --fail-step.
"""

import argparse
import os
import time

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset


class LitRegressor(L.LightningModule):
    def __init__(self, args) -> None:
        super().__init__()
        self.args = args
        self.model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        a = self.args
        if a.fail and self.global_rank == a.fail_rank and self.global_step == a.fail_step:
            if a.fail == "raise":
                raise RuntimeError(f"loss is NaN on rank {self.global_rank} at step {self.global_step}")
            if a.fail == "exit":
                os._exit(0)
            if a.fail == "hang":
                time.sleep(3600)
        time.sleep(a.step_time)
        loss = torch.nn.functional.mse_loss(self.model(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--step-time", type=float, default=0.05)
    p.add_argument("--fail", choices=["raise", "exit", "hang"])
    p.add_argument("--fail-rank", type=int, default=1)
    p.add_argument("--fail-step", type=int, default=5)
    p.add_argument("--bar", action="store_true", help="Lightning's tqdm bar on (its default)")
    args = p.parse_args()
    data = TensorDataset(torch.randn(512, 16), torch.randn(512, 1))
    loader = DataLoader(data, batch_size=8, num_workers=args.workers)
    trainer = L.Trainer(devices=2, strategy="ddp", accelerator="cpu", max_steps=args.steps, logger=False,
                        enable_checkpointing=False, enable_progress_bar=args.bar, enable_model_summary=False)
    trainer.fit(LitRegressor(args), loader)


if __name__ == "__main__":
    main()
