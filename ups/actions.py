"""The requests a front end makes, in one place: the console acts through this module, as it
reads through :mod:`ups.runs` (nvitop's TUI reaches its layers through ``nvitop.api`` alone).

Stopping a run or a process, dumping stacks, asking a precompute to fall back, adopting a run
whose launcher died, relaunching one, attaching a job ups did not start, asking another node's
``ups``, running the doctor. Each name is defined where its layer owns it (``ups.runs``,
``ups.launch``, ``ups.attach``, ``ups.doctor``) and loaded from there on first use, so that
importing this front costs nothing. Every request carries its actor and goes through the
proofs of :mod:`ups.runs.ownership`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ups.lazy import lazy_front

if TYPE_CHECKING:  # the same names, for readers, type checkers and import-linter (nothing loads here)
    from ups.attach.find import find_job as find_job
    from ups.attach.find import scan as scan
    from ups.attach.start import attach_job as attach_job
    from ups.attach.stop import kill_run as kill_run
    from ups.doctor.runner import options_from as options_from
    from ups.doctor.runner import run_doctor as run_doctor
    from ups.doctor.runner import select as select
    from ups.launch.reconcile import adopt as adopt
    from ups.launch.relaunch import plan_relaunch as plan_relaunch
    from ups.launch.relaunch import relaunch as relaunch
    from ups.runs.actions import request_fallback as request_fallback
    from ups.runs.remote import remote_ups as remote_ups
    from ups.runs.signals import dump_stacks as dump_stacks
    from ups.runs.signals import terminate as terminate

# name -> the module that defines it
_FRONT = {
    # a run of this node: signals (identity-checked, logged) and control requests
    "request_fallback": "ups.runs.actions",
    "kill_run": "ups.attach.stop",  # ups.runs.actions's, and an attached run's end told as its observer would
    **dict.fromkeys(("terminate", "dump_stacks"), "ups.runs.signals"),
    "remote_ups": "ups.runs.remote",  # another node's ups, over ssh
    # a new launcher, or a new run
    "adopt": "ups.launch.reconcile",
    **dict.fromkeys(("plan_relaunch", "relaunch"), "ups.launch.relaunch"),
    # a job ups did not start
    **dict.fromkeys(("scan", "find_job"), "ups.attach.find"),
    "attach_job": "ups.attach.start",
    # the box's checks
    **dict.fromkeys(("options_from", "run_doctor", "select"), "ups.doctor.runner"),
}
__all__ = sorted(_FRONT)

__getattr__, __dir__ = lazy_front(__name__, _FRONT, globals())
