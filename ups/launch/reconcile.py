"""Runs that stay truthful when their launcher dies (the OOM killer, a kill -9, a reboot).

Every reader (``ups runs``, ``ups status``, the console, the follow view) passes its view
through :func:`settle`. A run whose launcher is gone while some of its processes still run
is ``unsupervised`` (RunView.state) until ``ups adopt`` gives it a new supervisor. A run
whose launcher *and* every process are gone, and that nobody finished, gets its final state
derived from the records and the exits its launcher logged, exactly as the launcher would
have decided, with the reason "launcher lost": ``succeeded`` only if every rank's final
record says done with exit 0, ``failed`` when a record says how it failed, ``lost`` when
nothing does (every process vanished without a word: a reboot, everything SIGKILLed).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time

from ups.errors import UpsError
from ups.launch import kinds as _kinds  # noqa: F401 - registers the per-kind finalizers
from ups.launch.exits import ProcessExit, read_exits
from ups.launch.finalize import End, finalize
from ups.runs.view import RunView, load_run_view, node_view
from ups.status.record import StatusRecord

TOP_ROLE = {"torchrun": "agent", "train": "agent"}  # other kinds: the job's process is rank 0


def top_record(view: RunView) -> StatusRecord | None:
    """The record of the job's own process (torchrun's agent, or rank 0)."""
    role = TOP_ROLE.get(view.kind or "", "rank")
    return next((p.record for p in view.processes if p.record.role == role and (role != "rank" or p.record.rank == 0)), None)


def derived_returncode(view: RunView) -> int | None:
    """The job's exit code as its records tell it, None when they do not."""
    top = top_record(view)
    if top is not None and top.is_final:
        return top.exit_code if top.exit_code is not None else (0 if top.state == "done" else 1)
    ranks = [p.record for p in view.ranks()]
    if ranks and all(r.state == "done" and not r.exit_code for r in ranks):
        return 0
    return None


def vanished_exits(view: RunView, logged: dict[str, ProcessExit]) -> dict[str, ProcessExit]:
    """Ends the launcher did not live to log: a record that says running with its pid gone."""
    out = dict(logged)
    for p in view.processes:
        r = p.record
        if r.role != "launcher" and r.name not in out and not r.is_final:
            out[r.name] = ProcessExit(r.name, r.pid, r.role, r.rank, r.heartbeat_at, False, r.state, r.phase, r.step,
                                      r.error, r.exit_code)
    return out


def settle(view: RunView, *, actor: str | None = None) -> RunView:
    """The final state of a run nobody is left to finish, decided in memory: the view shows
    it whether or not it can be written. Writing it back to run.json (with its event and
    verdict) is best effort: a read-only, full or foreign runs folder never makes a reader
    fail, it only means the next reader decides the same again."""
    if view.supervision != "gone":
        return view
    launcher = (view.manifest or {}).get("launcher") or {}
    whole, view = view, node_view(view)  # a multi-node run: this node is settled, from its own processes
    rc = derived_returncode(view)
    outcome = finalize(view, End(rc, False, vanished_exits(view, read_exits(view.run))))
    state = outcome.state
    said = any(p.record.state == "failed" for p in view.processes if p.record.role in ("rank", "agent", "worker"))
    if state == "failed" and not said and rc is None:
        state = "lost"  # nothing recorded how it ended
    summary = f"launcher lost (pid {launcher.get('pid')} gone); {outcome.summary}"
    changes = dict(summary=summary, failure=outcome.failure, exit_code=rc, launcher_lost=True, **outcome.extra)
    actor = actor or f"reader:{os.getpid()}"
    try:
        written = view.run.settle(state, **changes)
    except (OSError, UpsError):  # EROFS, ENOSPC, EACCES, a planted lock: shown settled all the same
        in_memory = {**(whole.manifest or {}), **changes, "state": state,
                     "ended_at": (whole.manifest or {}).get("ended_at") or time.time()}
        return dataclasses.replace(whole, manifest=in_memory, supervision="final")
    if written:
        with contextlib.suppress(OSError):
            view.run.append_event("reconcile", actor=actor, state=state, summary=summary, launcher_pid=launcher.get("pid"))
        from ups.launch.supervise import record_verdict

        record_verdict(view.run)
    return load_run_view(whole.run)


def load_settled_view(run, **kwargs) -> RunView:  # noqa: ANN001
    """:func:`ups.runs.view.load_run_view`, then :func:`settle`: what every reader should use."""
    return settle(load_run_view(run, **kwargs))


def adopt(run, *, actor: str, wait_s: float = 10.0) -> int:  # noqa: ANN001
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
        settled = settle(view, actor=actor)
        raise UpsError(f"run {run.run_id}: every process had ended; settled as {settled.manifest_state}: "
                       f"{(settled.manifest or {}).get('summary')}", exit_code=1)
    proc = spawn_supervisor(run, adopt=True)
    run.append_event("adopt.request", actor=actor, supervisor_pid=proc.pid, previous_launcher=launcher.get("pid"))
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and (run.read_manifest().get("launcher") or {}).get("adopted") is not True:
        time.sleep(0.05)
    return proc.pid
