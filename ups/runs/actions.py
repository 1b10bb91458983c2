"""Operator actions on a run, shared by the CLI and the console (neither imports the other).

Every signal goes through :mod:`ups.runs.signals` (identity-checked, logged with its actor
and reason); requests to a live job go through the run's ``control/`` folder.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ups.errors import UpsError
from ups.runs.ownership import JobScope
from ups.runs.rundir import FINAL_RUN_STATES, RunDir
from ups.runs.signals import KillResult, end_unrecorded, is_alive, log_event, terminate
from ups.runs.view import RunView, load_run_view, node_view


def kill_run(run: RunDir, view: RunView, *, actor: str, reason: str, grace: float, force: bool) -> list[KillResult]:
    """Stop a whole run: ask the launcher first (it stops the job's process group), then make
    sure of every process the records name, and mark the run killed if it is not final yet.

    A multi-node run: this node's part (its launcher, its processes, its node manifest); the
    other nodes' ranks fail in their next collective, or are stopped there (``--remote``)."""
    JobScope.of_run(run.path)  # a folder that is no run, or not this user's: refused before anything is written
    # The grace is the launcher's to honour too (it stops the job's process group, then ends
    # whatever is left): it must finish before this waits out its own grace for the launcher.
    log_event(run, "kill", actor=actor, target="run", reason=reason, force=force, grace=grace)
    view = node_view(view)
    launcher = [p.record for p in view.processes if p.record.role == "launcher"]
    results: list[KillResult] = []
    if launcher and is_alive(launcher[0]) and not force:
        results += terminate(run, launcher, actor=actor, reason=reason, grace=grace + 5.0)
    rest = [p for p in node_view(load_run_view(run)).processes if p.record.role != "launcher" and is_alive(p.record)]
    results += terminate(run, [p.record for p in rest], actor=actor, reason=reason, grace=grace, force=force)
    if force and launcher:
        results += terminate(run, launcher, actor=actor, reason=reason, grace=grace, force=True)
    # What no record named (a job killed before its first record, workers started a moment
    # ago, orphans of a dead launcher): the kernel's session and parentage say it is the job's.
    results += end_unrecorded(run, JobScope.of_run(run.path), [r.pid for r in results], actor=actor, reason=reason, grace=grace, force=force)
    if run.read_own_manifest().get("state") not in FINAL_RUN_STATES:
        try:
            run.set_state("killed", summary=f"killed by {actor}: {reason}")
        except OSError as exc:  # a full disk: the processes are stopped; a reader settles the state later
            print(f"ups: the run's state not written to {run.manifest_path}: {exc.strerror or exc}", file=sys.stderr, flush=True)
    return results


def find_logs(run: RunDir, rank: int | None) -> list[Path]:
    """The job's log, or one rank's logs (``logs/rank-R.log`` or torchrun's stdout + stderr)."""
    if rank is None:
        path = run.log_path("job")
        if not path.exists() and run.is_multinode:  # a reader on no node of the run: the first node's log
            return sorted(run.logs_dir.glob("job@*.log"))[:1] or [path]
        return [path]
    direct = run.log_path(f"rank-{rank}")
    if direct.exists():
        return [direct]
    # torchrun --log-dir layout: logs/torchrun/<id>/attempt_N/<rank>/{stdout,stderr}.log
    attempts = sorted(run.logs_dir.glob(f"**/attempt_*/{rank}"), key=lambda p: p.stat().st_mtime)
    if attempts:
        return [p for p in (attempts[-1] / "stdout.log", attempts[-1] / "stderr.log") if p.exists()]
    raise UpsError(f"run {run.run_id} has no log for rank {rank} under {run.logs_dir}")


def request_fallback(run: RunDir, *, actor: str) -> Path:
    """Ask a live precompute to drop its DataLoader workers and go on in-process."""
    m = run.read_manifest()
    if m.get("kind") != "precompute":
        raise UpsError(f"run {run.run_id} is a {m.get('kind')} run; in-process fallback applies to precompute runs "
                       f"(`ups relaunch {run.run_id} --num-workers 0` reruns any run without DataLoader workers)")
    if m.get("state") not in ("launching", "running"):
        raise UpsError(f"run {run.run_id} is {m.get('state')}; nothing to fall back")
    return run.put_control("fallback", actor=actor)
