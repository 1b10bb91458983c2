"""Stopping a run, told as its supervisor tells it. A launched run's end is told by its
launcher, which ``ups kill`` asks to stop the job. An attached run's observer is only a watcher:
``ups kill`` stops it first, then the job, and marks the run killed itself. So the end of an
attached run killed here is told here, to the targets its observer tells (``--notify``'s, else
the config file's), once its state is written (the same message a launcher sends:
:func:`ups.launch.ending.notify_end`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ups.runs.actions import kill_run as kill_run_here
from ups.runs.rundir import FINAL_RUN_STATES

if TYPE_CHECKING:
    from ups.runs.rundir import RunDir
    from ups.runs.signals import KillResult
    from ups.runs.view import RunView


def kill_run(run: RunDir, view: RunView, *, actor: str, reason: str, grace: float, force: bool) -> list[KillResult]:
    """:func:`ups.runs.actions.kill_run`; then, for an attached run that this call ended, its
    end told to its notify targets (a slow target holds this call up by at most its time limit)."""
    before = run.read_own_manifest()
    results = kill_run_here(run, view, actor=actor, reason=reason, grace=grace, force=force)
    if before.get("kind") == "attached" and before.get("state") not in FINAL_RUN_STATES \
            and run.read_own_manifest().get("state") == "killed":
        from ups.attach.observe import notifier_for
        from ups.launch.ending import notify_end

        notify_end(run, notifier_for(run))
    return results
