"""Runs nobody is left to finish, settled in memory from their records.

A run whose launcher died (the OOM killer, a kill -9, a reboot) while some of its processes
still run is ``unsupervised`` (RunView.supervision) until ``ups adopt`` gives it a new
launcher. A run whose launcher *and* every process are gone, and that nobody finished, gets
its final state derived from the records and the exits its launcher logged, exactly as the
launcher would have decided, with the reason "launcher lost": ``succeeded`` only if every
rank's final record says done with exit 0, ``failed`` when a record says how it failed,
``lost`` when nothing does (every process vanished without a word: a reboot, everything
SIGKILLed). Every reader shows that state (:func:`ups.runs.read.open_run`); only ``ups runs
--settle`` and ``ups adopt`` write it down (:mod:`ups.launch.reconcile`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ups.runs.exits import ProcessExit
from ups.runs.kinds import finalize
from ups.runs.outcome import End
from ups.runs.rundir import merge_node_states
from ups.runs.view import RunView, node_view, settled_view
from ups.status.host import hostname
from ups.status.record import StatusRecord

TOP_ROLE = {"torchrun": "agent", "train": "agent"}  # other kinds: the job's process is rank 0


def top_record(kind: str | None, records: Sequence[StatusRecord]) -> StatusRecord | None:
    """The record of the job's own process (torchrun's agent, or rank 0)."""
    role = TOP_ROLE.get(kind or "", "rank")
    return next((r for r in records if r.role == role and (role != "rank" or r.rank == 0)), None)


def derived_returncode(kind: str | None, records: Sequence[StatusRecord]) -> int | None:
    """The job's exit code as its records tell it, None when they do not."""
    top = top_record(kind, records)
    if top is not None and top.is_final:
        return top.exit_code if top.exit_code is not None else (0 if top.state == "done" else 1)
    ranks = [r for r in records if r.role == "rank"]
    if ranks and all(r.state == "done" and not r.exit_code for r in ranks):
        return 0
    return None


def vanished_exits(records: Sequence[StatusRecord], logged: Mapping[str, ProcessExit]) -> dict[str, ProcessExit]:
    """Ends the launcher did not live to log: a record that says running with its pid gone."""
    out = dict(logged)
    for r in records:
        if r.role != "launcher" and r.name not in out and not r.is_final:
            out[r.name] = ProcessExit(r.name, r.pid, r.role, r.rank, r.heartbeat_at, False, r.state, r.phase, r.step,
                                      r.error, r.exit_code)
    return out


def settled(view: RunView, logged: Mapping[str, ProcessExit]) -> RunView:
    """``view``, a run nobody is left to finish (``supervision == "gone"``), with its final
    state decided in memory exactly as its launcher would have (its kind's rule, over the
    records and ``logged``, the ends the launcher logged: ups.runs.exits.read_exits), with the
    reason "launcher lost": ``lost`` when nothing recorded how it ended. Never writes: the
    state is written only by ``ups runs --settle`` and ``ups adopt`` (ups.launch.reconcile)."""
    whole = view.manifest or {}
    node = node_view(view)  # a multi-node run: this node is settled, from its own processes
    records = [p.record for p in node.processes]
    rc = derived_returncode(view.kind, records)
    ends = vanished_exits(records, logged)
    ended_at = whole.get("ended_at") or _last_sign_of_life(records)
    outcome = finalize(node, End(rc, False, ends))
    state = outcome.state
    said = any(r.state == "failed" for r in records if r.role in ("rank", "agent", "worker"))
    if state == "failed" and not said and rc is None:
        state = "lost"  # nothing recorded how it ended
    summary = f"launcher lost (pid {(whole.get('launcher') or {}).get('pid')} gone); {outcome.summary}"
    changes = dict(summary=summary, failure=outcome.failure, exit_code=rc, launcher_lost=True, **outcome.extra,
                   state=state, ended_at=ended_at)
    manifest = dict(whole)
    if manifest.get("multinode"):
        # This node's manifest ends; the run's state is then every node's, merged as on disk.
        nodes = dict(manifest.get("nodes") or {})
        nodes[hostname()] = {**(nodes.get(hostname()) or {}), **changes}
        manifest["nodes"] = nodes
        manifest.update(merge_node_states(nodes, (manifest.get("multinode") or {}).get("nnodes")))
    else:
        manifest.update(changes)
    return settled_view(view, manifest, changes)


def _last_sign_of_life(records: Sequence[StatusRecord]) -> float | None:
    """When a run nobody finished ended, as well as its records tell: its last heartbeat."""
    beats = [r.heartbeat_at for r in records if r.heartbeat_at]
    return max(beats) if beats else None
