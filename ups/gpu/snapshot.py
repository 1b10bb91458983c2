"""Immutable GPU snapshots, from NVML or from a fake provider.

Screens read one :class:`GpuSnapshot` per tick; nothing else calls NVML. No GPU is a normal
snapshot (``available=False`` with the reason), not an error.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

ENV_FAKE_GPU = "UPS_FAKE_GPU"


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_memory: int | None  # bytes; None when NVML does not say (some drivers, MIG)
    kind: str = "compute"  # compute | graphics


@dataclass(frozen=True)
class DeviceSnapshot:
    index: int
    name: str | None
    uuid: str | None
    memory_total: int | None
    memory_used: int | None
    utilization_gpu: int | None  # percent
    temperature_c: int | None
    power_w: float | None
    processes: tuple[GpuProcess, ...] = ()
    # Health counters (None: not supported or not read): the kind of fault that makes a rank
    # crash with a CUDA error, or run slower than its peers.
    xid_errors: tuple[int, ...] = ()  # Xid codes reported recently (NVML critical-error events, the fake's list)
    ecc_uncorrected: int | None = None  # volatile uncorrected ECC errors since the driver loaded
    remapped_rows_pending: bool | None = None  # a row remap waits for a GPU reset
    throttle: tuple[str, ...] = ()  # active clock throttle reasons that slow it: thermal, power
    pci_bus_id: str | None = None  # "0000:3b:00", as the kernel log names it (ups.gpu.kmsg.pci_key)


@dataclass(frozen=True)
class GpuSnapshot:
    available: bool
    reason: str | None
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    devices: tuple[DeviceSnapshot, ...] = ()
    taken_at: float = field(default_factory=time.time)
    source: str = "nvml"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GpuSnapshot:
        devices = tuple(
            DeviceSnapshot(**{**d, "processes": tuple(GpuProcess(**p) for p in d.get("processes", [])),
                              "xid_errors": tuple(d.get("xid_errors") or ()), "throttle": tuple(d.get("throttle") or ())})
            for d in data.get("devices", [])
        )
        return cls(
            available=bool(data.get("available", bool(devices))),
            reason=data.get("reason"),
            driver_version=data.get("driver_version"),
            cuda_driver_version=data.get("cuda_driver_version"),
            devices=devices,
            taken_at=data.get("taken_at", time.time()),
            source=data.get("source", "fake"),
        )


class GpuProvider(Protocol):
    def snapshot(self) -> GpuSnapshot: ...


def _value(v: Any) -> Any:
    from ups.gpu.nvml import NA

    return None if v is NA else v


class NvmlProvider:
    """The real GPUs, through :mod:`ups.gpu.nvml`."""

    def snapshot(self) -> GpuSnapshot:
        from ups.gpu import nvml

        if not nvml.available():
            return GpuSnapshot(False, nvml.unavailable_reason())
        count = _value(nvml.query("nvmlDeviceGetCount")) or 0
        if not count:
            return GpuSnapshot(False, "no NVIDIA devices visible (check CUDA_VISIBLE_DEVICES and the container's device list)")
        # Xid events since this process's watcher opened (one-shot CLIs: only those while they run)
        from ups.gpu.xid import process_watcher

        watcher = process_watcher(nvml.module())
        watcher.poll(0)
        xids = watcher.by_gpu()
        # ... and the ones the kernel log holds, from before any watcher opened (ups.gpu.kmsg)
        from ups.gpu.kmsg import process_watcher as kernel_watcher

        kernel = kernel_watcher()
        kernel.poll()
        kernel_xids = kernel.by_pci()
        cuda = _value(nvml.query("nvmlSystemGetCudaDriverVersion_v2")) or _value(nvml.query("nvmlSystemGetCudaDriverVersion"))
        devices = [self._device(nvml, i, xids.get(i, ()), kernel_xids) for i in range(count)]
        return GpuSnapshot(
            True,
            None,
            driver_version=_value(nvml.query("nvmlSystemGetDriverVersion")),
            cuda_driver_version=None if cuda is None else f"{cuda // 1000}.{cuda % 1000 // 10}",
            devices=tuple(devices),
        )

    @staticmethod
    def _device(nvml: Any, i: int, xids: tuple[int, ...] = (), kernel_xids: dict[str, tuple[int, ...]] | None = None,
                ) -> DeviceSnapshot:
        from ups.gpu.kmsg import pci_key

        h = _value(nvml.query("nvmlDeviceGetHandleByIndex", i))
        if h is None:
            return DeviceSnapshot(i, None, None, None, None, None, None, None, xid_errors=xids)
        pci = _value(nvml.query("nvmlDeviceGetPciInfo", h))
        bus = pci_key(getattr(pci, "busId", None)) if pci is not None else None
        if bus is not None and kernel_xids and bus in kernel_xids:
            xids = tuple(dict.fromkeys((*xids, *kernel_xids[bus])))  # both sources, each Xid once
        mem = _value(nvml.query("nvmlDeviceGetMemoryInfo", h))
        util = _value(nvml.query("nvmlDeviceGetUtilizationRates", h))
        temp = _value(nvml.query("nvmlDeviceGetTemperature", h, 0))  # NVML_TEMPERATURE_GPU
        power = _value(nvml.query("nvmlDeviceGetPowerUsage", h))
        procs = []
        for kind, fn in (("compute", "nvmlDeviceGetComputeRunningProcesses"), ("graphics", "nvmlDeviceGetGraphicsRunningProcesses")):
            for p in _value(nvml.query(fn, h)) or []:
                used = getattr(p, "usedGpuMemory", None)
                procs.append(GpuProcess(int(p.pid), used if isinstance(used, int) and used >= 0 else None, kind))
        ecc = _value(nvml.query("nvmlDeviceGetTotalEccErrors", h, 1, 0))  # uncorrected, volatile
        remap = _value(nvml.query("nvmlDeviceGetRemappedRows", h))  # (corrected, uncorrected, pending, failure)
        reasons = _value(nvml.query("nvmlDeviceGetCurrentClocksThrottleReasons", h))
        return DeviceSnapshot(
            xid_errors=xids,
            ecc_uncorrected=ecc if isinstance(ecc, int) else None,
            remapped_rows_pending=bool(remap[2]) if isinstance(remap, tuple | list) and len(remap) > 2 else None,
            throttle=throttle_reasons(reasons) if isinstance(reasons, int) else (),
            index=i,
            name=_value(nvml.query("nvmlDeviceGetName", h)),
            uuid=_value(nvml.query("nvmlDeviceGetUUID", h)),
            memory_total=None if mem is None else int(mem.total),
            memory_used=None if mem is None else int(mem.used),
            utilization_gpu=None if util is None else int(util.gpu),
            temperature_c=temp,
            power_w=None if power is None else power / 1000.0,
            processes=tuple(procs),
            pci_bus_id=bus,
        )


# NVML clock throttle reason bits that slow a healthy job (not idle, not the application's own clocks).
_THROTTLE_BITS = {0x4: "power (software cap)", 0x20: "thermal (software slowdown)", 0x40: "thermal (hardware slowdown)",
                  0x80: "power (hardware brake)", 0x8: "hardware slowdown"}


def throttle_reasons(mask: int) -> tuple[str, ...]:
    return tuple(name for bit, name in _THROTTLE_BITS.items() if mask & bit)


class FakeProvider:
    """Snapshots from plain data: for tests, and to rehearse screens on a box without a GPU."""

    def __init__(self, snapshot: GpuSnapshot) -> None:
        self._snapshot = snapshot

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FakeProvider:
        return cls(GpuSnapshot.from_dict({"source": "fake", **data}))

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> FakeProvider:
        return cls.from_dict(json.loads(Path(path).read_text()))

    def snapshot(self) -> GpuSnapshot:
        s = self._snapshot
        return GpuSnapshot(s.available, s.reason, s.driver_version, s.cuda_driver_version, s.devices, time.time(), s.source)


def get_provider() -> GpuProvider:
    """NVML, or the fake described by the JSON file in ``UPS_FAKE_GPU`` when set."""
    fake = os.environ.get(ENV_FAKE_GPU)
    if fake:
        try:
            return FakeProvider.from_file(fake)
        except (OSError, ValueError, TypeError) as exc:
            return FakeProvider(GpuSnapshot(False, f"{ENV_FAKE_GPU}={fake}: unreadable fake GPU file ({exc})", source="fake"))
    return NvmlProvider()


def visible_device_count(provider: GpuProvider | None = None) -> int | None:
    """How many GPUs CUDA in a child process would see: ``CUDA_VISIBLE_DEVICES`` when set
    (CUDA stops at the first negative id), else NVML's device count; None when unknown."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        count = 0
        for part in visible.split(","):
            if not part.strip() or part.strip().startswith("-"):
                break
            count += 1
        return count
    snap = (provider or get_provider()).snapshot()
    return len(snap.devices) if snap.available else None
