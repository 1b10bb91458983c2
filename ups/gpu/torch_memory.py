"""torch's view of a process's CUDA memory, for the Reporter (``gpu_sampler=``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ups.status.record import GpuMemory


def cuda_memory_sampler(device: Any) -> Callable[[], GpuMemory | None]:
    """A callable returning allocated / reserved / peak bytes on ``device``, or None off CUDA."""

    def sample() -> GpuMemory | None:
        import torch

        dev = torch.device(device)
        if dev.type != "cuda" or not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return None
        i = dev.index if dev.index is not None else torch.cuda.current_device()
        return GpuMemory(i, torch.cuda.memory_allocated(i), torch.cuda.memory_reserved(i), torch.cuda.max_memory_allocated(i))

    return sample
