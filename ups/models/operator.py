"""The latent operator: predicts the latent state at t+1 from the state at t (or, for a
steady task, the solution's latent from the coefficient's).

A token-mixing MLP block stack (mix across tokens, then across channels), residual; small
enough for a CPU step of a few milliseconds, real enough to train. Trained on several tasks,
it learns one embedding per task, added to its input: a batch holds one task, and the maps
differ (a time step of advection, Darcy's coefficient -> pressure).
"""

from __future__ import annotations

import torch
from torch import nn


class MixerBlock(nn.Module):
    def __init__(self, tokens: int, dim: int, hidden: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.token_mlp = nn.Sequential(nn.Linear(tokens, hidden), nn.GELU(), nn.Linear(hidden, tokens))
        self.norm2 = nn.LayerNorm(dim)
        self.channel_mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        z = z + self.token_mlp(self.norm1(z).transpose(-1, -2)).transpose(-1, -2)
        return z + self.channel_mlp(self.norm2(z))


class LatentOperator(nn.Module):
    def __init__(self, tokens: int, dim: int, hidden: int = 64, depth: int = 2, tasks: int = 1) -> None:
        super().__init__()
        # One task needs no embedding (and keeps the state dict of a single-task operator).
        self.task_embedding = nn.Embedding(tasks, dim) if tasks > 1 else None
        self.blocks = nn.Sequential(*(MixerBlock(tokens, dim, hidden) for _ in range(depth)))
        self.out = nn.Linear(dim, dim)

    def forward(self, z: torch.Tensor, task: torch.Tensor | None = None) -> torch.Tensor:
        """(B, tokens, dim) at t -> (B, tokens, dim) at t+1 (as a residual update); ``task``
        (B,) task ids when the operator was built for several tasks."""
        h = z
        if self.task_embedding is not None:
            if task is None:
                raise ValueError("this operator was built for several tasks: pass each sample's task id")
            h = z + self.task_embedding(task)[:, None, :]
        return z + self.out(self.blocks(h))
