"""Run a run's command again, as a new run: the operator's fallback for programs we do not own.

``ups relaunch RUN --num-workers 0`` stops the run if it is alive and starts the same
command (same folder, same arguments, the run's extra environment) as a new run in which
the instrumentation forces every DataLoader to ``num_workers=0`` (``UPS_FORCE_NUM_WORKERS``).
A precompute gets ``num_workers: 0`` in its config too, and resumes from its cache. Both runs
log the relaunch as an event naming the other.

A relaunch runs what the run folder says, so it runs only what this user wrote: the run must
be proven the acting user's (:class:`ups.runs.ownership.OwnRun`: the folder and run.json are
theirs and no one else may write them), and everything it carries over is read through that
proof. :func:`plan_relaunch` says what would run, so the CLI and the console show the command
before anything starts.
"""

from __future__ import annotations

import json
import shlex
import time
from dataclasses import dataclass, field
from typing import Any

from ups.errors import UpsError
from ups.launch.spawn import launch_run
from ups.runs.actions import kill_run
from ups.runs.ownership import OwnRun
from ups.runs.rundir import FINAL_RUN_STATES, RunDir
from ups.runs.view import load_run_view

# Manifest fields a relaunch carries over as they were.
CARRIED = ("program", "world_size", "nproc", "nnodes", "mode", "samples")
STOP_WAIT_S = 30.0
NOTHING = "nothing was run"


@dataclass(frozen=True)
class RelaunchPlan:
    """What a relaunch of ``run`` would start, read from the run proven the user's."""

    run: RunDir
    command: list[str]  # as written (the template: ``{RUN}`` is the new run's folder)
    cwd: str | None
    num_workers: int | None
    manifest: dict[str, Any]  # run.json as written
    config: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    files: dict[str, bytes] = field(default_factory=dict)

    def shown(self) -> str:
        """The command as an operator reads it before it runs (safe to print)."""
        from ups.status.printable import printable

        line = shlex.join(self.command)
        where = f" (in {self.cwd})" if self.cwd else ""
        forced = "" if self.num_workers is None else f", every DataLoader with num_workers={self.num_workers}"
        return printable(f"{line}{where}{forced}")


def plan_relaunch(run: RunDir, *, num_workers: int | None) -> RelaunchPlan:
    """The relaunch of ``run``; Refused (one line: whose the run is, and why) when the run is
    not provably this user's, UpsError when it has nothing to run."""
    if num_workers is not None and num_workers < 0:
        raise UpsError("--num-workers must be >= 0")
    with OwnRun(run.path, nothing=NOTHING) as own:
        m = own.manifest
        fields = own.launch_fields()
        template = fields.get("command_template") or fields.get("command")
        if not template:
            raise UpsError(f"run {run.run_id} has no command to run again")
        files = _run_files(own)
        # The training metrics go on in the new run: each rank's series continues, as attempt N+1.
        files.update(_series_files(own))
    env = dict(fields.get("env") or {})
    env["UPS_ATTEMPT"] = str(_int(m.get("attempt")) + 1)
    config = dict(m["config"]) if isinstance(m.get("config"), dict) else {}
    if num_workers is not None:
        env["UPS_FORCE_NUM_WORKERS"] = str(num_workers)
        if m.get("kind") == "precompute":
            config["num_workers"] = num_workers  # legacy mode: no worker or writer processes at all
            files["config.json"] = json.dumps(config, indent=1).encode()
    return RelaunchPlan(run, list(template), fields.get("cwd"), num_workers, m, config, env, files)


def relaunch(run: RunDir, runs_root: str, *, num_workers: int | None, actor: str, grace: float = 5.0,
             plan: RelaunchPlan | None = None) -> RunDir:
    """Stop ``run`` if it is alive and start its command again as a new run (see the module)."""
    plan = plan or plan_relaunch(run, num_workers=num_workers)
    m = plan.manifest
    if run.read_manifest().get("state") not in FINAL_RUN_STATES:
        kill_run(run, load_run_view(run), actor=actor, reason="relaunch", grace=grace, force=False)
        deadline = time.monotonic() + STOP_WAIT_S
        while run.read_manifest().get("state") not in FINAL_RUN_STATES and time.monotonic() < deadline:
            time.sleep(0.1)
    extra = {k: m[k] for k in CARRIED if k in m}
    extra["relaunched_from"] = run.run_id
    if m.get("kind") == "precompute" and plan.num_workers == 0:
        extra["mode"] = "legacy"
    new = launch_run(
        runs_root, str(m.get("kind") or "run"), plan.command, argv=m.get("argv"), config=plan.config, env=plan.env,
        thresholds=m.get("thresholds"), extra=extra, files=plan.files, name=m.get("name"),
        instrument=m.get("top_role") if m.get("instrument") else None, cwd=plan.cwd,
        observe_only=m.get("automatic") == "observe",
    )
    run.append_event("relaunch", actor=actor, new_run=new.run_id, num_workers=plan.num_workers, command=plan.command)
    new.append_event("relaunched_from", actor=actor, run=run.run_id, num_workers=plan.num_workers)
    return new


def _int(v: Any) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else 1


def _run_files(own: OwnRun) -> dict[str, bytes]:
    """The run's own input files (config.json, plan.json) to copy: regular files of the
    user's of at most 1 MiB; anything else in their place is refused with its name and why."""
    return {name: own.read(name) for name in own.names() if name.endswith(".json") and name != "run.json"}


def _series_files(own: OwnRun) -> dict[str, bytes]:
    """The ranks' metrics series (metrics/*.json) to carry over; one that cannot be read as a
    regular file of the user's of at most 1 MiB is left behind (history is a bonus, never a
    reason to refuse)."""
    from ups.errors import Refused

    files = {}
    for name in own.names("metrics"):
        if not name.endswith(".json"):
            continue
        try:
            files[f"metrics/{name}"] = own.read(f"metrics/{name}")
        except (OSError, Refused):
            continue
    return files
