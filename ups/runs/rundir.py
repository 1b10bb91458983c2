"""The run directory: manifest (``run.json``), event log, control requests, sub-folders.

:class:`RunDir` is the one front every caller uses; each idea has its own room:
:mod:`ups.runs.runpaths` (the folder, its paths, confined writes into it),
:mod:`ups.runs.create` (making a run folder, joining a multi-node run's),
:mod:`ups.runs.manifest` (run.json read, merged across nodes, written under a lock),
:mod:`ups.runs.events` (the event log) and :mod:`ups.runs.control` (control requests).
This module also lists and resolves the runs under a runs folder.

Layout (docs/design.md)::

    runs/<run_id>/
      run.json       manifest, written atomically under a lock (read-modify-write)
      status/        one record per process (ups.status)
      stacks/        faulthandler output per process
      logs/          stdout/stderr of the launcher and each rank
      events.jsonl   append-only audit log, one JSON object per line
      control/       requests from the operator to the job
      nodes/         multi-node runs only: one manifest per node, ``<host>.json``

A multi-node run (``ups launch torchrun --nnodes N ...`` on every node, one run id) keeps
what all nodes share in ``run.json`` (id, kind, name, nnodes) and what each node's launcher
knows in ``nodes/<host>.json`` (its command, launcher and job pids, state, exit code,
summary). Each node writes only its own file; :meth:`RunDir.read_manifest` merges them: the
node of the reading host gives the per-node keys, and the run's state is the nodes' (it
ends when every node has ended, failed when any node failed, naming the node).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ups.errors import CorruptRun, RunNotFound, UpsError
from ups.runs.control import CONTROL_MAX_BYTES, ControlRequests
from ups.runs.create import RUN_ID_CHARS, check_run_id, create_run, new_run_id
from ups.runs.events import EVENTS_TAIL_BYTES
from ups.runs.manifest import FINAL_RUN_STATES, NODE_STATE_ORDER, ManifestFile, merge_node_states
from ups.runs.manifest_spec import MANIFEST_SCHEMA
from ups.runs.runpaths import DIR_MODE, NODES_DIR, SUBDIRS, TORCHRUN_LOGS
from ups.status.confined import user_name
from ups.status.printable import printable

__all__ = [
    "CONTROL_MAX_BYTES", "DIR_MODE", "EVENTS_TAIL_BYTES", "FINAL_RUN_STATES", "MANIFEST_SCHEMA", "NODES_DIR", "NODE_STATE_ORDER",
    "RUN_ID_CHARS", "SUBDIRS", "TORCHRUN_LOGS", "RunDir", "RunSummary", "check_run_id", "list_runs",
    "merge_node_states", "new_run_id", "resolve_run", "summarize",
]


class RunDir(ManifestFile, ControlRequests):
    """One run's folder. Cheap to construct; touches the disk only when asked.

    Its paths and confined writes (:class:`~ups.runs.runpaths.RunPaths`), its manifest
    (:class:`~ups.runs.manifest.ManifestFile`), its event log
    (:class:`~ups.runs.events.EventLog`) and control requests
    (:class:`~ups.runs.control.ControlRequests`)."""

    create = classmethod(create_run)


@dataclass(frozen=True)
class RunSummary:
    """One line of ``ups runs``: what the manifest says, or why it could not be read."""

    run_id: str
    path: Path
    kind: str | None
    state: str | None
    created_at: float | None
    ended_at: float | None
    manifest: dict[str, Any] | None
    problem: str | None = None

    @property
    def run(self) -> RunDir:
        return RunDir(self.path)


def summarize(path: Path) -> RunSummary:
    run = RunDir(path)
    try:
        m = run.read_manifest()
    except CorruptRun as exc:
        try:
            created = path.stat().st_mtime
        except OSError:
            created = None
        return RunSummary(printable(path.name), path, None, None, created, None, None, printable(str(exc)))
    return RunSummary(
        run_id=str(m.get("id", printable(path.name))),
        path=path,
        kind=m.get("kind"),
        state=m.get("state"),
        created_at=m.get("created_at"),
        ended_at=m.get("ended_at"),
        manifest=m,
    )


def _closed(path: Path) -> RunSummary:
    """A folder this user may not enter: listed with whose it is, never read."""
    try:
        st = path.stat()
        why = f"not readable by you (a folder of {user_name(st.st_uid)}, mode {st.st_mode & 0o7777:o})"
    except OSError as exc:
        st, why = None, f"not readable by you ({exc.strerror or exc})"
    return RunSummary(printable(path.name), path, None, None, st.st_mtime if st else None, None, None, why)


def _check_root(root: Path) -> None:
    if not root.exists():
        raise UpsError(f"runs folder {root} does not exist (set --runs-dir or UPS_RUNS_DIR)")
    if not root.is_dir():
        raise UpsError(f"runs folder {root} is not a folder")


def list_runs(runs_root: str | os.PathLike[str], *, missing_ok: bool = False) -> list[RunSummary]:
    """Every run folder under the root, newest first (by manifest time, else folder time).

    A folder counts as a run when it has a ``run.json`` or one of the run sub-folders, so a
    half-written run shows up with its problem instead of vanishing.
    """
    root = Path(runs_root)
    if missing_ok and not root.exists():
        return []
    _check_root(root)
    out = []
    for entry in os.scandir(root):
        if not entry.is_dir() or entry.name.startswith("."):
            continue
        p = Path(entry.path)
        try:
            if (p / "run.json").exists() or any((p / s).is_dir() for s in SUBDIRS):
                out.append(summarize(p))
        except PermissionError:  # another user's private run (an attached job's of theirs: docs/safety.md)
            out.append(_closed(p))
    out.sort(key=lambda s: (s.created_at or 0.0, s.run_id), reverse=True)
    return out


def resolve_run(runs_root: str | os.PathLike[str], ref: str | None) -> RunDir:
    """A run from an id, a unique id prefix, a path to a run folder, or None for the newest."""
    root = Path(runs_root)
    if ref and (os.sep in ref or ref.startswith(".")):
        as_path = Path(ref)
        if not as_path.is_dir():
            raise RunNotFound(f"no run folder at {as_path}")
        return RunDir(as_path)
    _check_root(root)
    if ref is None:
        runs = list_runs(root)
        if not runs:
            raise RunNotFound(f"no runs under {root} (start one with `ups launch` or `ups demo`)")
        return runs[0].run
    exact = root / ref
    if exact.is_dir():
        return RunDir(exact)
    matches = [s for s in list_runs(root) if s.run_id.startswith(ref)]
    if len(matches) == 1:
        return matches[0].run
    if not matches:
        raise RunNotFound(f"no run {ref!r} under {root} (`ups runs` lists them)")
    names = ", ".join(m.run_id for m in matches[:4])
    raise RunNotFound(f"run prefix {ref!r} is ambiguous under {root}: {names}")
