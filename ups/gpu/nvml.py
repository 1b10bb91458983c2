"""The one entry point to NVML (package nvidia-ml-py, imported as ``pynvml``).

Lazy, locked initialisation on first use, shutdown at exit. Every query returns a value or
the :data:`NA` marker: no NVML error ever reaches a caller. Why NVML is unavailable is
kept as one sentence (:func:`unavailable_reason`) for the no-GPU path of every screen.
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Callable
from typing import Any


class _NotAvailable:
    """Marker for a value NVML could not give (no driver, unsupported on this GPU ...)."""

    _instance: _NotAvailable | None = None

    def __new__(cls) -> _NotAvailable:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "N/A"

    def __bool__(self) -> bool:
        return False


NA: Any = _NotAvailable()

_lock = threading.Lock()
_state: dict[str, Any] = {"initialised": False, "tried": False, "reason": None, "module": None}
_on_shutdown: list[Callable[[], None]] = []  # what holds NVML objects of this session (the Xid event set)


def module() -> Any | None:
    """The initialised pynvml module (initialising it on first use), or None when NVML is
    unavailable (:func:`unavailable_reason` says why): for callers that hold NVML objects of
    their own, such as an event set."""
    return _init()


def use(nvml_module: Any | None, reason: str | None = None) -> None:
    """Make ``nvml_module`` this process's initialised NVML, or with None, NVML unavailable for
    ``reason``: the boundary where a fake NVML provider stands in on a machine with no GPU."""
    with _lock:
        _state.update(initialised=nvml_module is not None, tried=True, reason=reason, module=nvml_module)


def on_shutdown(hook: Callable[[], None]) -> None:
    """Call ``hook`` before NVML shuts down: whatever it holds belongs to this NVML session."""
    with _lock:
        if hook not in _on_shutdown:
            _on_shutdown.append(hook)


def _init() -> Any | None:
    """The pynvml module once initialised, or None (reason recorded)."""
    with _lock:
        if _state["tried"]:
            return _state["module"] if _state["initialised"] else None
        _state["tried"] = True
        try:
            import pynvml
        except ImportError:
            _state["reason"] = "nvidia-ml-py is not installed (pip install nvidia-ml-py)"
            return None
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError_LibraryNotFound:
            _state["reason"] = "NVML not found: no NVIDIA driver on this machine"
            return None
        except pynvml.NVMLError_DriverNotLoaded:
            _state["reason"] = "NVIDIA driver not loaded"
            return None
        except pynvml.NVMLError as exc:
            _state["reason"] = f"NVML init failed: {exc}"
            return None
        except OSError as exc:  # a broken libnvidia-ml.so
            _state["reason"] = f"NVML could not be loaded: {exc}"
            return None
        _state["initialised"], _state["module"] = True, pynvml
        atexit.register(shutdown)
        return pynvml


def available() -> bool:
    return _init() is not None


def unavailable_reason() -> str | None:
    _init()
    return _state["reason"]


def query(func: str | Callable[..., Any], *args: Any, default: Any = NA) -> Any:
    """Call an NVML function by name (``"nvmlDeviceGetCount"``) or object; ``default`` on error."""
    nvml = _init()
    if nvml is None:
        return default
    fn = getattr(nvml, func, None) if isinstance(func, str) else func
    if fn is None:  # an older nvidia-ml-py without this function: a value it cannot give
        return default
    try:
        value = fn(*args)
    except nvml.NVMLError:
        return default
    except (AttributeError, TypeError, OSError):  # a function this driver lacks
        return default
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    return value


def shutdown() -> None:
    for hook in list(_on_shutdown):
        try:
            hook()
        except Exception:  # noqa: BLE001 - at shutdown, nothing to do about it
            pass
    with _lock:
        if _state["initialised"]:
            try:
                _state["module"].nvmlShutdown()
            except Exception:  # noqa: BLE001 - at exit, nothing to do about it
                pass
        _state.update(initialised=False, tried=False, module=None)
