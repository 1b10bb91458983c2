"""Lightning as its docs show it: a LightningDataModule that reads its data in ``setup``, a
LightningModule, ``Trainer.fit``, on CPU. The data file is not where the run looks for it (a
path relative to another working directory, a mount missing on this node). It knows nothing
of ups.

    python lit_missing_data.py --data data/train.npy
"""

import argparse

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset


class ArrayData(L.LightningDataModule):
    def __init__(self, path: str, batch_size: int = 8) -> None:
        super().__init__()
        self.path = path
        self.batch_size = batch_size

    def setup(self, stage: str) -> None:
        array = np.load(self.path)
        x = torch.from_numpy(array[:, :16]).float()
        self.train = TensorDataset(x, x.sum(dim=1, keepdim=True))

    def train_dataloader(self):
        return DataLoader(self.train, batch_size=self.batch_size)


class LitRegressor(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.model(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", default="data/train.npy")
    args = p.parse_args()
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False)
    trainer.fit(LitRegressor(), datamodule=ArrayData(args.data))


if __name__ == "__main__":
    main()
