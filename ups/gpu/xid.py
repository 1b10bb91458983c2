"""Xid critical-error events, read through NVML's event-set API.

The driver reports a hardware or kernel fault (Xid 79: fallen off the bus, 48/94/95: ECC ...)
as an event; counters alone never say which Xid happened. An event set only receives events
that happen after it is registered, so a long-lived process (the console, a supervisor) keeps
one :class:`XidWatcher` open (:func:`process_watcher`) and every snapshot drains it. A one-shot
``ups why`` therefore sees only the Xids reported while it runs; earlier ones are in the
kernel log (``NVRM: Xid``), which the failure classifier reads.

No NVML, no GPU, a driver without event support: the watcher is empty with a reason, never an
exception (the same contract as :mod:`ups.gpu.nvml`).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any, NamedTuple

MAX_EVENTS = 256  # bounded: a GPU in an Xid storm must not grow a long-lived console without end
_XID_CRITICAL = 0x8  # nvmlEventTypeXidCriticalError, when the module does not say
_TIMEOUT, _NOT_SUPPORTED = 10, 3  # NVML_ERROR_TIMEOUT, NVML_ERROR_NOT_SUPPORTED


class XidEvent(NamedTuple):
    gpu: int  # NVML device index
    xid: int
    time: float  # when ups read it (NVML's own timestamp is not in the v2 event data)


class XidWatcher:
    """One NVML event set registered for Xid critical errors on every device it can.

    ``nvml_module`` is the pynvml module (already initialised); by default the one
    :mod:`ups.gpu.nvml` initialised, or nothing when NVML is unavailable.
    """

    def __init__(self, nvml_module: Any = None, max_events: int = MAX_EVENTS) -> None:
        if nvml_module is None:
            from ups.gpu import nvml

            nvml_module = nvml.module()
            self.reason: str | None = nvml.unavailable_reason()
        else:
            self.reason = None
        self._nvml = nvml_module
        self.events: deque[XidEvent] = deque(maxlen=max_events)
        self._set: Any = None
        self._lock = threading.Lock()
        self.devices: list[int] = []  # the indices registered
        if self._nvml is not None:
            self._open()

    def _code(self, exc: BaseException) -> int | None:
        return getattr(exc, "value", None)

    def _open(self) -> None:
        m = self._nvml
        try:
            self._set = m.nvmlEventSetCreate()
        except (m.NVMLError, AttributeError, OSError) as exc:
            self.reason = f"NVML event sets unavailable: {exc}"
            return
        kind = getattr(m, "nvmlEventTypeXidCriticalError", _XID_CRITICAL)
        try:
            count = m.nvmlDeviceGetCount()
        except (m.NVMLError, AttributeError, OSError) as exc:
            count, self.reason = 0, f"no device count: {exc}"
        for i in range(count):
            try:
                m.nvmlDeviceRegisterEvents(m.nvmlDeviceGetHandleByIndex(i), kind, self._set)
                self.devices.append(i)
            except (m.NVMLError, AttributeError, OSError) as exc:
                # NOT_SUPPORTED: GeForce/MIG/vGPU without Xid events; the others still count
                self.reason = f"GPU {i}: Xid events not supported" if self._code(exc) == _NOT_SUPPORTED else f"GPU {i}: {exc}"
        if not self.devices:
            self.close()
            self.reason = self.reason or "no NVIDIA devices"

    def _index(self, handle: Any) -> int:
        m = self._nvml
        try:
            return int(m.nvmlDeviceGetIndex(handle))
        except (m.NVMLError, AttributeError, OSError, TypeError, ValueError):
            return -1

    def poll(self, timeout_ms: int = 0) -> list[XidEvent]:
        """Drain the events waiting (waiting up to ``timeout_ms`` for the first); the new ones."""
        new: list[XidEvent] = []
        with self._lock:
            if self._set is None:
                return new
            m = self._nvml
            wait = getattr(m, "nvmlEventSetWait_v2", None) or m.nvmlEventSetWait
            while True:
                try:
                    data = wait(self._set, timeout_ms)
                except m.NVMLError as exc:
                    if self._code(exc) != _TIMEOUT:
                        self.reason = f"NVML event wait failed: {exc}"
                    break
                except (AttributeError, OSError, TypeError) as exc:
                    self.reason = f"NVML event wait failed: {exc}"
                    break
                if data is None or isinstance(data, int):  # some bindings return the timeout code
                    break
                new.append(XidEvent(self._index(data.device), int(data.eventData), time.time()))
                timeout_ms = 0  # one wait for the first event, then only what is already queued
        self.events.extend(new)
        return new

    def watch(self, seconds: float) -> list[XidEvent]:
        """Collect for ``seconds`` (a CLI probe; the console polls instead)."""
        deadline, got = time.monotonic() + seconds, []
        while self._set is not None and (left := deadline - time.monotonic()) > 0:
            got += self.poll(max(1, int(left * 1000)))
        return got

    def by_gpu(self) -> dict[int, tuple[int, ...]]:
        """The Xid codes seen per device index, oldest first (repeats collapsed)."""
        out: dict[int, list[int]] = {}
        for e in self.events:
            codes = out.setdefault(e.gpu, [])
            if e.xid not in codes:
                codes.append(e.xid)
        return {k: tuple(v) for k, v in out.items()}

    def close(self) -> None:
        with self._lock:
            if self._set is not None:
                try:
                    self._nvml.nvmlEventSetFree(self._set)
                except Exception:  # noqa: BLE001 - freeing at the end; nothing to do about it
                    pass
                self._set = None


_process: dict[str, XidWatcher | None] = {"watcher": None}
_process_lock = threading.Lock()


def process_watcher(nvml_module: Any) -> XidWatcher:
    """This process's watcher on ``nvml_module`` (opened on first use, kept for later snapshots)."""
    from ups.gpu import nvml

    nvml.on_shutdown(reset_process_watcher)  # its event set belongs to that NVML session
    with _process_lock:
        w = _process["watcher"]
        if w is None or w._nvml is not nvml_module:
            if w is not None:
                w.close()
            w = _process["watcher"] = XidWatcher(nvml_module)
        return w


def reset_process_watcher() -> None:
    with _process_lock:
        if _process["watcher"] is not None:
            _process["watcher"].close()
        _process["watcher"] = None
