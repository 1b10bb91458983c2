"""The GPU layer: one NVML entry point, immutable snapshots, attribution of GPU processes
to runs. Knows nothing of the UI; imports pynvml lazily, only when a snapshot is taken."""

from ups.gpu.attribution import (
    AttributedGpu,
    GpuProcessView,
    attribute,
    gpu_memory_by_pid,
    records_for_attribution,
)
from ups.gpu.snapshot import (
    DeviceSnapshot,
    FakeProvider,
    GpuProcess,
    GpuSnapshot,
    NvmlProvider,
    get_provider,
    visible_device_count,
)

__all__ = [
    "AttributedGpu",
    "DeviceSnapshot",
    "FakeProvider",
    "GpuProcess",
    "GpuProcessView",
    "GpuSnapshot",
    "NvmlProvider",
    "attribute",
    "get_provider",
    "gpu_memory_by_pid",
    "records_for_attribution",
    "visible_device_count",
]
