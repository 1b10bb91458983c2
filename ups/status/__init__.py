"""The shared status protocol: record schema, Reporter (writer), reader, health rules.

Knows nothing of the UI and imports nothing heavy. Names are loaded on first use (PEP 562):
every instrumented process imports ``ups.status.reporter``, and must not pay for the reader
and the health rules it never uses.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "Health": "health", "HealthVerdict": "health", "Thresholds": "health", "classify_health": "health",
    "classify_run": "health", "worst": "health",
    "ReadProblem": "reader", "StatusSnapshot": "reader", "read_status_dir": "reader",
    "SCHEMA_VERSION": "schema", "GpuMemory": "record", "StatusRecord": "record",
    "NullReporter": "reporter", "Reporter": "reporter",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'ups.status' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"ups.status.{module}"), name)
    globals()[name] = value
    return value
