"""Runs: a run's folder and files (rundir), the one way to read a run (read.open_run: its view,
settled in memory, never written), the outcome rules, the ``--json`` contract (payload),
other nodes' streams (remote), and the proofs and signals every action on a run goes through
(ownership, signals, actions).

This package is also the front a reader reaches the layers through (the console imports its
names from ``ups.runs``, as nvitop's TUI imports only ``nvitop.api``): the names below, each
loaded from its module on first use, so that ``import ups.runs`` stays free and ``ups --help``
fast.
"""

from __future__ import annotations

import importlib
from typing import Any

# name -> the module that defines it
_FRONT = {
    **dict.fromkeys(("RunDir", "FINAL_RUN_STATES", "list_runs", "check_run_id"), "ups.runs.rundir"),
    "open_run": "ups.runs.read",
    "RunView": "ups.runs.view",
    **dict.fromkeys(("dump_stacks", "terminate", "last_stack_dump"), "ups.runs.signals"),
    **dict.fromkeys(("kill_run", "request_fallback", "find_logs"), "ups.runs.actions"),
    **dict.fromkeys(("remote_ups", "open_sources", "stop_sources"), "ups.runs.remote"),
    # what a run's records and files hold, read through the status layer
    "StatusRecord": "ups.status.record",
    "Health": "ups.status.health",
    **dict.fromkeys(("StaticProcessTable", "process_start_time", "same_start"), "ups.status.procs"),
    **dict.fromkeys(("BadFile", "read_tail"), "ups.status.safeio"),
    **dict.fromkeys(("metric_values", "read_series", "series_path"), "ups.status.series"),
}
__all__ = sorted(_FRONT)


def __getattr__(name: str) -> Any:
    module = _FRONT.get(name)
    if module is None:
        raise AttributeError(f"module 'ups.runs' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # loaded once
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_FRONT})
