"""Run directories: manifest, event log, control requests, listing, safe signalling."""

from ups.runs.rundir import FINAL_RUN_STATES, RUN_STATES, RunDir, RunSummary, list_runs, resolve_run
from ups.runs.view import ProcessView, RunView, load_run_view

__all__ = [
    "FINAL_RUN_STATES",
    "RUN_STATES",
    "ProcessView",
    "RunDir",
    "RunSummary",
    "RunView",
    "list_runs",
    "load_run_view",
    "resolve_run",
]
