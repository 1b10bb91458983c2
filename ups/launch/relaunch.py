"""Run a run's command again, as a new run: the operator's fallback for programs we do not own.

``ups relaunch RUN --num-workers 0`` stops the run if it is alive and starts the same
command (same folder, same arguments, the run's extra environment) as a new run in which
the instrumentation forces every DataLoader to ``num_workers=0`` (``UPS_FORCE_NUM_WORKERS``).
A precompute gets ``num_workers: 0`` in its config too, and resumes from its cache. Both runs
log the relaunch as an event naming the other.
"""

from __future__ import annotations

import json
import time

from ups.errors import UpsError
from ups.launch.spawn import launch_run
from ups.runs.actions import kill_run
from ups.runs.rundir import FINAL_RUN_STATES, RunDir
from ups.runs.view import load_run_view

# Manifest fields a relaunch carries over as they were.
CARRIED = ("program", "world_size", "nproc", "nnodes", "mode", "samples")
STOP_WAIT_S = 30.0


def relaunch(run: RunDir, runs_root: str, *, num_workers: int | None, actor: str, grace: float = 5.0) -> RunDir:
    m = run.read_manifest()
    template = m.get("command_template") or m.get("command")
    if not template:
        raise UpsError(f"run {run.run_id} has no command to run again")
    if num_workers is not None and num_workers < 0:
        raise UpsError("--num-workers must be >= 0")
    if m.get("state") not in FINAL_RUN_STATES:
        kill_run(run, load_run_view(run), actor=actor, reason="relaunch", grace=grace, force=False)
        deadline = time.monotonic() + STOP_WAIT_S
        while run.read_manifest().get("state") not in FINAL_RUN_STATES and time.monotonic() < deadline:
            time.sleep(0.1)
    env = dict(m.get("env") or {})
    config = dict(m.get("config") or {})
    files = _run_files(run)
    if num_workers is not None:
        env["UPS_FORCE_NUM_WORKERS"] = str(num_workers)
        if m.get("kind") == "precompute":
            config["num_workers"] = num_workers  # legacy mode: no worker or writer processes at all
            files["config.json"] = json.dumps(config, indent=1).encode()
    extra = {k: m[k] for k in CARRIED if k in m}
    extra["relaunched_from"] = run.run_id
    if m.get("kind") == "precompute" and num_workers == 0:
        extra["mode"] = "legacy"
    new = launch_run(
        runs_root, m.get("kind") or "run", template, argv=m.get("argv"), config=config, env=env,
        thresholds=m.get("thresholds"), extra=extra, files=files, name=m.get("name"),
        instrument=m.get("top_role") if m.get("instrument") else None, cwd=m.get("cwd"),
        observe_only=m.get("automatic") == "observe",
    )
    run.append_event("relaunch", actor=actor, new_run=new.run_id, num_workers=num_workers)
    new.append_event("relaunched_from", actor=actor, run=run.run_id, num_workers=num_workers)
    return new


def _run_files(run) -> dict[str, bytes]:  # noqa: ANN001
    """The run's own input files (config.json, plan.json) to copy: regular files of at most
    1 MiB; anything else in their place is refused with its name and why."""
    from ups.errors import UpsError
    from ups.status.safeio import BadFile, read_bytes

    files = {}
    for p in run.path.glob("*.json"):
        if p.name == "run.json":
            continue
        try:
            files[p.name] = read_bytes(p)
        except (OSError, BadFile) as exc:
            raise UpsError(f"{p}: {exc}") from None
    return files
