"""The field encoder: a sample's fields (T, X[, Y], C) -> latent tokens (T, tokens, dim).

Small and real: a per-time-step convolution over space, pooled to a fixed number of
tokens, projected to the latent width. Seeded, so two processes that build it with the
same seed hold the same weights; ``weights_hash`` goes into the cache metadata so a cache
never mixes latents from different encoders.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
from torch import nn


class FieldEncoder(nn.Module):
    def __init__(self, channels: int, spatial_dims: int, latent_tokens: int = 16, latent_dim: int = 32, hidden: int = 32) -> None:
        super().__init__()
        if spatial_dims not in (1, 2):
            raise ValueError("spatial_dims must be 1 or 2")
        conv = nn.Conv1d if spatial_dims == 1 else nn.Conv2d
        self.spatial_dims = spatial_dims
        self.tokens = latent_tokens
        self.stem = nn.Sequential(
            conv(channels, hidden, kernel_size=3, padding=1),
            nn.GELU(),
            conv(hidden, hidden, kernel_size=3, padding=1),
            nn.GELU(),
        )
        self.proj = nn.Linear(hidden, latent_dim)

    def forward(self, fields: torch.Tensor) -> torch.Tensor:
        """(B, T, *spatial, C) -> (B, T, tokens, dim)."""
        b, t = fields.shape[:2]
        x = fields.reshape(b * t, *fields.shape[2:]).movedim(-1, 1)  # (BT, C, *spatial)
        h = self.stem(x).flatten(2)  # (BT, hidden, S)
        h = nn.functional.adaptive_avg_pool1d(h, self.tokens)  # (BT, hidden, tokens)
        z = self.proj(h.transpose(1, 2))  # (BT, tokens, dim)
        return z.reshape(b, t, self.tokens, -1)


class SteadyMapEncoder(nn.Module):
    """Encodes a steady sample (one frame) as two latent frames: the coefficient alone, then
    the whole field, so that a trainer that maps frame 0 to frame 1 learns coefficient ->
    solution with the same encoder, cache format and pair logic as a time-dependent task.

    The coefficient frame is the sample with its solution channels zeroed: the encoder sees
    the same channel layout in both frames, and frame 0 holds nothing of the solution.
    """

    def __init__(self, encoder: FieldEncoder, input_channels: int) -> None:
        super().__init__()
        self.encoder = encoder
        self.input_channels = input_channels

    def forward(self, fields: torch.Tensor) -> torch.Tensor:
        """(B, 1, *spatial, C) -> (B, 2, tokens, dim)."""
        if fields.shape[1] != 1:
            raise ValueError(f"a steady sample has one frame, got {fields.shape[1]}")
        coefficient = fields.clone()
        coefficient[..., self.input_channels:] = 0
        return self.encoder(torch.cat([coefficient, fields], dim=1))


def build_encoder(channels: int, spatial_dims: int, *, latent_tokens: int, latent_dim: int, seed: int = 0, checkpoint: str | Path | None = None) -> FieldEncoder:
    """A deterministic encoder: seeded weights, or the state dict in ``checkpoint``."""
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = FieldEncoder(channels, spatial_dims, latent_tokens, latent_dim)
    finally:
        torch.random.set_rng_state(gen_state)
    if checkpoint is not None:
        state = torch.load(checkpoint, map_location="cpu", weights_only=True)
        model.load_state_dict(state.get("encoder", state))
    return model.eval()


def weights_hash(model: nn.Module) -> str:
    """sha256 over every parameter and buffer, in name order (device and dtype independent)."""
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()[:16]
