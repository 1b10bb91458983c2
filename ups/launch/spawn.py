"""Create a run and start its supervisor detached from this terminal."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from ups.errors import UpsError
from ups.runs.rundir import RunDir
from ups.status.health import Thresholds


def launch_run(
    runs_root: str | os.PathLike[str],
    kind: str,
    command: list[str],
    *,
    argv: list[str] | None = None,
    config: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
    thresholds: Thresholds | dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
    files: dict[str, bytes] | None = None,
    name: str | None = None,
    instrument: str | None = None,
    cwd: str | None = None,
    observe_only: bool = False,
    run_id: str | None = None,
    multinode: dict[str, Any] | None = None,
) -> RunDir:
    """Write ``runs_root/<id>/`` with the job command, and start the supervisor.

    ``files`` are written into the run folder before anything starts (``{RUN}`` in the
    command is replaced by the run folder's path). ``instrument`` names the role of the
    job's top process (``agent`` for torchrun, ``rank`` for one process) when every Python
    process of the job is to report through ups.instrument; ``UPS_INSTRUMENT=0`` in the
    launching environment turns that off. The supervisor runs in a new session: no
    controlling terminal, its own process group, so Ctrl-C in the launching shell, closing
    the console or losing SSH never stops the job.

    ``run_id`` names the run folder; with ``multinode`` (``{"nnodes": N, "node_rank": R,
    ...}``) this node joins the run of that id (see :meth:`RunDir.create`).
    """
    if isinstance(thresholds, Thresholds):
        thresholds = thresholds.to_dict()
    fields: dict[str, Any] = {
        "command": [str(c) for c in command],  # "{RUN}" is filled in below
        "command_template": [str(c) for c in command],  # as given: what a relaunch runs again
        "env": env or {},
        "cwd": cwd or os.getcwd(),
        "thresholds": thresholds or {},
        "instrument": bool(instrument) and os.environ.get("UPS_INSTRUMENT", "1").lower() not in ("0", "false", "no", "off"),
        "top_role": instrument,
        # Automatic actions on processes (stack dumps, a watchdog's kills): "observe" logs what
        # would be done and does nothing, so a false positive can never become a kill loop.
        "automatic": "observe" if observe_only else "act",
    }
    fields.update(extra or {})
    before = _entries(runs_root)
    try:
        run = RunDir.create(runs_root, kind, argv=argv if argv is not None else sys.argv, config=config, extra=fields,
                            name=name, run_id=run_id, multinode=multinode)
        for name, data in (files or {}).items():  # e.g. the resolved config the job reads
            run.write_file(name, data)
        if any("{RUN}" in c for c in fields["command"]):
            resolved = str(run.path.resolve())
            run.update_manifest(command=[c.replace("{RUN}", resolved) for c in fields["command"]])
    except OSError as exc:
        # A full disk (or a read-only one): no half-made run is left to be listed as corrupt.
        if multinode is None:
            import shutil

            for made in _entries(runs_root) - before:
                shutil.rmtree(Path(runs_root) / made, ignore_errors=True)
        raise UpsError(f"cannot create a run under {runs_root}: {exc.strerror or exc}; nothing was started") from None
    proc = spawn_supervisor(run)
    run.append_event("launch", actor=os.environ.get("UPS_ACTOR", "cli"), kind=kind, supervisor_pid=proc.pid)
    return run


def _entries(root: str | os.PathLike[str]) -> set[str]:
    try:
        return set(os.listdir(root))
    except OSError:
        return set()


def spawn_supervisor(run: RunDir, *, adopt: bool = False) -> subprocess.Popen[bytes]:
    """``python -m ups.launch.supervise RUN`` in a session of its own, its pid in run.json at
    once (a reader can tell a launcher that died before it wrote anything).

    A launcher runs what its run folder says, so the folder must be proven this user's first
    (Refused otherwise, before anything is written there)."""
    from ups.runs.ownership import OwnRun
    from ups.status.procs import process_start_time

    OwnRun(run.path, nothing="no launcher started").close()
    launcher_log = run.open_log("launcher")  # handed to the child
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ups.launch.supervise", str(Path(run.path).resolve()), *(["--adopt"] if adopt else [])],
            stdin=subprocess.DEVNULL,
            stdout=launcher_log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
    finally:
        os.close(launcher_log)
    start = process_start_time(proc.pid)
    if start is not None:
        with run.manifest_lock():  # the supervisor may be writing its own entry
            m = run.read_own_manifest()
            if not (m.get("launcher") or {}).get("pid") == proc.pid:
                previous = m.get("launcher")
                m["launcher"] = {"pid": proc.pid, "pid_start": start, "pgid": proc.pid, "adopted": adopt}
                if adopt and previous:
                    m.setdefault("previous_launchers", []).append(previous)
                run.write_manifest(m)
    return proc
