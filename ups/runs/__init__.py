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
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the same names, for readers, type checkers and import-linter (nothing loads here)
    from ups.runs.actions import find_logs as find_logs
    from ups.runs.actions import kill_run as kill_run
    from ups.runs.actions import request_fallback as request_fallback
    from ups.runs.read import open_run as open_run
    from ups.runs.remote import open_sources as open_sources
    from ups.runs.remote import remote_ups as remote_ups
    from ups.runs.remote import stop_sources as stop_sources
    from ups.runs.rundir import FINAL_RUN_STATES as FINAL_RUN_STATES
    from ups.runs.rundir import RunDir as RunDir
    from ups.runs.rundir import check_run_id as check_run_id
    from ups.runs.rundir import list_runs as list_runs
    from ups.runs.signals import dump_stacks as dump_stacks
    from ups.runs.signals import last_stack_dump as last_stack_dump
    from ups.runs.signals import terminate as terminate
    from ups.runs.view import RunView as RunView
    from ups.status.health import Health as Health
    from ups.status.procs import StaticProcessTable as StaticProcessTable
    from ups.status.procs import process_start_time as process_start_time
    from ups.status.procs import same_start as same_start
    from ups.status.record import StatusRecord as StatusRecord
    from ups.status.safeio import BadFile as BadFile
    from ups.status.safeio import read_tail as read_tail
    from ups.status.series import metric_values as metric_values
    from ups.status.series import read_series as read_series
    from ups.status.series import series_path as series_path


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
