"""Writing down the end of a run nobody is left to finish: ``ups runs --settle`` and ``ups adopt``.

Every reader shows such a run settled in memory (:mod:`ups.runs.settle`, through
:func:`ups.runs.read.open_run`) and writes nothing. Here the settled state is written to
run.json once (under the manifest's lock: several may notice at once), with a ``reconcile``
event and the run's verdict, so later readers and tools find it on disk. ``ups adopt`` gives a
run whose launcher died while its job runs on a new launcher (ups.launch.supervise --adopt).
"""

from __future__ import annotations

import contextlib
import os
import time

from ups.errors import UpsError
from ups.runs.read import open_run
from ups.runs.rundir import RunDir
from ups.runs.view import RunView, load_run_view


def write_settled(run: RunDir, *, actor: str | None = None) -> RunView | None:
    """Write the state a reader decides for ``run`` when nobody is left to finish it; the
    settled view, or None when the run needed no settling (it has a launcher, or has ended).
    OSError (a read-only or full folder) and UpsError pass: the caller says so."""
    from ups.runs.ownership import OwnRun

    view = open_run(run)
    if view.settled is None:
        return None
    OwnRun(run.path, nothing="nothing written").close()  # another user's run is read, never written
    changes = dict(view.settled)
    state = changes.pop("state")
    if run.settle(state, **changes):
        actor = actor or f"cli:{os.getpid()}"
        with contextlib.suppress(OSError):
            run.append_event("reconcile", actor=actor, state=state, summary=changes.get("summary"),
                             launcher_pid=((view.manifest or {}).get("launcher") or {}).get("pid"))
        from ups.launch.ending import record_verdict

        record_verdict(run)
    return view


def adopt(run, *, actor: str, wait_s: float = 10.0) -> int:
    """Give an unsupervised run a new supervisor; its pid. A run that still has its launcher,
    or has ended, is refused; one whose processes are all gone is settled instead. A run that
    is not provably this user's is refused before anything (Refused: whose it is, and why)."""
    from ups.launch.spawn import spawn_supervisor
    from ups.runs.ownership import OwnRun

    OwnRun(run.path, nothing="nothing adopted").close()
    view = load_run_view(run)
    launcher = (view.manifest or {}).get("launcher") or {}
    if view.supervision == "final":
        raise UpsError(f"run {run.run_id} has ended ({view.manifest_state}): nothing to adopt", exit_code=1)
    if view.supervision == "supervised":
        raise UpsError(f"run {run.run_id} is supervised by pid {launcher.get('pid')}: nothing to adopt", exit_code=1)
    if view.supervision == "gone":
        done = write_settled(run, actor=actor)
        m = (done.manifest if done is not None else None) or {}
        raise UpsError(f"run {run.run_id}: every process had ended; settled as {m.get('state')}: "
                       f"{m.get('summary')}", exit_code=1)
    proc = spawn_supervisor(run, adopt=True)
    run.append_event("adopt.request", actor=actor, supervisor_pid=proc.pid, previous_launcher=launcher.get("pid"))
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and (run.read_manifest().get("launcher") or {}).get("adopted") is not True:
        time.sleep(0.05)
    return proc.pid
