"""Runs: a run's folder and files (rundir), the one way to read a run (read.open_run: its view,
settled in memory, never written), the outcome rules, the ``--json`` contract (payload),
other nodes' streams (remote), and the proofs and signals every action on a run goes through
(ownership, signals, actions).

This package is also the front a reader reaches the layers through (the console imports its
names from ``ups.runs``, as nvitop's TUI imports only ``nvitop.api``; it acts through
:mod:`ups.actions`): the names below (the run, its records and files, its GPUs), each
loaded from its module on first use, so that ``import ups.runs`` stays free and ``ups --help``
fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ups.lazy import lazy_front

if TYPE_CHECKING:  # the same names, for readers, type checkers and import-linter (nothing loads here)
    from ups.gpu.attribution import AttributedGpu as AttributedGpu
    from ups.gpu.attribution import attribute as attribute
    from ups.gpu.attribution import records_for_attribution as records_for_attribution
    from ups.gpu.snapshot import GpuProvider as GpuProvider
    from ups.gpu.snapshot import get_provider as get_provider
    from ups.runs.actions import find_logs as find_logs
    from ups.runs.read import open_run as open_run
    from ups.runs.remote import open_sources as open_sources
    from ups.runs.remote import stop_sources as stop_sources
    from ups.runs.rundir import FINAL_RUN_STATES as FINAL_RUN_STATES
    from ups.runs.rundir import RunDir as RunDir
    from ups.runs.rundir import check_run_id as check_run_id
    from ups.runs.rundir import list_runs as list_runs
    from ups.runs.signals import last_stack_dump as last_stack_dump
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
    "last_stack_dump": "ups.runs.signals",
    "find_logs": "ups.runs.actions",
    **dict.fromkeys(("open_sources", "stop_sources"), "ups.runs.remote"),
    # what a run's records and files hold, read through the status layer
    "StatusRecord": "ups.status.record",
    "Health": "ups.status.health",
    **dict.fromkeys(("StaticProcessTable", "process_start_time", "same_start"), "ups.status.procs"),
    **dict.fromkeys(("BadFile", "read_tail"), "ups.status.safeio"),
    **dict.fromkeys(("metric_values", "read_series", "series_path"), "ups.status.series"),
    # the GPUs a run's processes use, read through the GPU layer
    **dict.fromkeys(("AttributedGpu", "attribute", "records_for_attribution"), "ups.gpu.attribution"),
    **dict.fromkeys(("GpuProvider", "get_provider"), "ups.gpu.snapshot"),
}
__all__ = sorted(_FRONT)

__getattr__, __dir__ = lazy_front(__name__, _FRONT, globals())
