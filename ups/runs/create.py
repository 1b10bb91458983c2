"""Making a run folder, or joining a multi-node run's, under the confined-write rules of
docs/safety.md ("Writing into a shared runs folder"; :mod:`ups.status.confined`): every
write relative to the runs folder's descriptor, then the run folder's; no link planted in a
shared runs folder ever followed; a folder that exists proven this user's before the first
write. :meth:`RunDir.create <ups.runs.rundir.RunDir.create>` is the entry point.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any, TypeVar

from ups.errors import Refused, UpsError
from ups.runs.manifest import ManifestFile, manifest_bytes, read_manifest_file
from ups.runs.manifest_spec import MANIFEST_SCHEMA
from ups.runs.runpaths import DIR_MODE, NODES_DIR, SUBDIRS, TORCHRUN_LOGS, RunPaths
from ups.status import confined
from ups.status.confined import Unsafe, open_own_dir, write_atomic_at
from ups.status.host import hostname
from ups.status.printable import printable

R = TypeVar("R", bound=ManifestFile)
RUN_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


def check_run_id(run_id: str) -> str:
    """A run id given by the user (``--run-id``, a rendezvous id) is a folder name: letters,
    digits, ``.``, ``_`` and ``-`` only."""
    if not run_id or run_id.startswith((".", "-")) or not set(run_id) <= RUN_ID_CHARS or len(run_id) > 120:
        raise UpsError(f"run id {printable(run_id)!r} must be 1-120 letters, digits, '.', '_' or '-' "
                       "(not starting with '.' or '-')")
    return run_id


def new_run_id(kind: str, now: float | None = None) -> str:
    """``<date>-<time>-<kind or name>-<4 hex>``; a name is cut to 40 safe characters."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now if now is not None else time.time()))
    label = "".join(c if c.isalnum() or c in "._-" else "-" for c in kind).strip(".-")[:40] or "run"
    return f"{stamp}-{label}-{os.urandom(2).hex()}"


def create_run(
    cls: type[R],
    runs_root: str | os.PathLike[str],
    kind: str,
    *,
    argv: list[str] | None = None,
    config: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
    name: str | None = None,
    run_id: str | None = None,
    multinode: dict[str, Any] | None = None,
) -> R:
    """Make ``<runs_root>/<new id>/`` with its sub-folders and a ``launching`` manifest.

    ``name`` (default: the kind) is the readable part of the id. ``run_id`` names the
    folder exactly (it must not exist yet) unless ``multinode`` is given (``{"nnodes":
    N, ...}``): then this node joins the run of that id, creating it if it is the first,
    and its manifest is ``nodes/<host>.json`` (see :mod:`ups.runs.rundir`)."""
    root = Path(runs_root)
    if multinode is not None and not run_id:
        raise UpsError("a multi-node run needs a run id (--run-id, or torchrun's --rdzv-id)")
    if run_id is not None:
        check_run_id(run_id)
    # Every write below is relative to the runs folder's descriptor, then the run folder's
    # (ups.status.confined): no link planted in a shared runs folder is ever followed.
    try:
        root_fd = confined.open_root(root)
    except Unsafe as exc:
        raise Refused(f"{exc}; nothing written") from None
    try:
        if multinode is not None:
            return _join(cls, root, root_fd, str(run_id), kind, argv=argv, config=config, extra=extra, name=name,
                         multinode=multinode)
        return _make(cls, root, root_fd, run_id, kind, argv=argv, config=config, extra=extra, name=name)
    except Unsafe as exc:
        raise Refused(f"{exc}; nothing written") from None
    finally:
        os.close(root_fd)


def _make(cls: type[R], root: Path, root_fd: int, run_id: str | None, kind: str, *, argv: list[str] | None,
          config: dict[str, Any] | None, extra: dict[str, Any] | None, name: str | None) -> R:
    """A new run folder: ``mkdir`` that fails when the name exists (a link included), then
    opened ``O_NOFOLLOW`` and proven this user's before anything is written in it."""
    for _ in range(1 if run_id is not None else 20):
        folder = run_id if run_id is not None else new_run_id(name or kind)
        try:
            run_fd = confined.make_dir(folder, f"run folder {root / folder}", dir_fd=root_fd)
            break
        except FileExistsError:
            if run_id is not None:
                raise UpsError(f"run {run_id} already exists under {root}: give another --run-id") from None
    else:  # pragma: no cover - 20 collisions of 16 random bits in one second
        raise UpsError(f"could not allocate a run id under {root}")
    run = cls(root / folder)
    try:
        for sub in SUBDIRS:
            os.close(confined.make_dir(sub, f"{run.path}/{sub}", dir_fd=run_fd))
        manifest = _new_manifest(run.run_id, kind, argv=argv, config=config, extra=extra, name=name)
        write_atomic_at(run_fd, "run.json", manifest_bytes(manifest))
    finally:
        os.close(run_fd)
    return run


def _new_manifest(run_id: str, kind: str, *, argv: list[str] | None, config: dict[str, Any] | None,
                  extra: dict[str, Any] | None, name: str | None) -> dict[str, Any]:
    manifest = {
        "schema": MANIFEST_SCHEMA,
        "id": run_id,
        "kind": kind,
        "name": name or kind,
        "state": "launching",
        "created_at": time.time(),
        "ended_at": None,
        "host": hostname(),
        "argv": list(argv or []),
        "config": config or {},
        "launcher": None,
        "ranks": {},
    }
    manifest.update(extra or {})
    return manifest


def _join(cls: type[R], root: Path, root_fd: int, run_id: str, kind: str, *, argv: list[str] | None,
          config: dict[str, Any] | None, extra: dict[str, Any] | None, name: str | None,
          multinode: dict[str, Any]) -> R:
    """This node joins (or starts) the multi-node run ``run_id``. A folder that exists is
    proven this user's (opened ``O_NOFOLLOW``: a real folder of theirs that no one else may
    write, and :class:`~ups.runs.ownership.OwnRun` once it has a run.json) before the first
    write; every name this node writes in it is checked the same way."""
    run = cls(root / run_id)
    host = hostname()
    try:
        os.mkdir(run_id, DIR_MODE, dir_fd=root_fd)
    except FileExistsError:
        pass
    run_fd = open_own_dir(run_id, f"run folder {run.path}", dir_fd=root_fd)
    try:
        _prove_joined(run, run_fd)
        for sub in (*SUBDIRS, NODES_DIR):
            os.close(confined.make_dir(sub, f"{run.path}/{sub}", dir_fd=run_fd, exist_ok=True))
        with run.manifest_lock(run_fd):
            _join_locked(run, run_fd, host, kind, argv=argv, config=config, extra=extra, name=name,
                         multinode=multinode)
    finally:
        os.close(run_fd)
    return run


def _prove_joined(run: RunPaths, run_fd: int) -> None:
    """The names a joining node writes, where they exist: real folders and regular files of
    this user's that no one else may write; and run.json passes OwnRun."""
    from ups.runs.ownership import OwnRun

    for sub in (*SUBDIRS, NODES_DIR):
        confined.check_entry(sub, f"{run.path}/{sub}", dir_fd=run_fd, folder=True)
    for name in ("events.jsonl", ".run.json.lock"):
        confined.check_entry(name, f"{run.path}/{name}", dir_fd=run_fd)
    with contextlib.suppress(FileNotFoundError):  # the log folder handed to torchrun (it follows links)
        logs = open_own_dir("logs", f"{run.path}/logs", dir_fd=run_fd)
        try:
            confined.check_entry(TORCHRUN_LOGS, f"{run.path}/logs/{TORCHRUN_LOGS}", dir_fd=logs, folder=True)
        finally:
            os.close(logs)
    if confined.check_entry("run.json", f"{run.path}/run.json", dir_fd=run_fd):
        try:
            OwnRun(run.path, dir_fd=run_fd, nothing="nothing written").close()
        except Refused as exc:
            raise Unsafe(str(exc).removesuffix(": nothing written").removesuffix("; nothing written")) from None


def _join_locked(run: ManifestFile, run_fd: int, host: str, kind: str, *, argv: list[str] | None,
                 config: dict[str, Any] | None, extra: dict[str, Any] | None, name: str | None,
                 multinode: dict[str, Any]) -> None:
    root, run_id = run.path.parent, run.path.name
    if confined.check_entry("run.json", f"{run.path}/run.json", dir_fd=run_fd):
        shared = read_manifest_file(run.manifest_path)
        if not shared.get("multinode"):
            raise UpsError(f"run {run_id} already exists under {root} and is not a multi-node run: "
                           "give another --run-id")
        if shared.get("kind") != kind:
            raise UpsError(f"run {run_id} is a {shared.get('kind')} run; this node launches {kind}")
    else:
        shared = {"schema": MANIFEST_SCHEMA, "id": run_id, "kind": kind, "name": name or kind, "state": "running",
                  "created_at": time.time(), "ended_at": None, "host": host,
                  "multinode": {k: v for k, v in multinode.items() if k != "node_rank"}}
        write_atomic_at(run_fd, "run.json", manifest_bytes(shared))
    mine = run.node_manifest_path(host)
    nodes_fd = open_own_dir(NODES_DIR, str(run.nodes_dir), dir_fd=run_fd)
    try:
        if confined.check_entry(mine.name, str(mine), dir_fd=nodes_fd):
            old = read_manifest_file(mine)
            raise UpsError(f"node {host} has already joined run {run_id} (its launcher: pid "
                           f"{(old.get('launcher') or {}).get('pid')}, {old.get('state')}): give each run a new "
                           "--run-id, and each node its own host name (UPS_HOSTNAME)")
        manifest = _new_manifest(run_id, kind, argv=argv, config=config, extra=extra, name=name)
        manifest["node_rank"] = multinode.get("node_rank")
        write_atomic_at(nodes_fd, mine.name, manifest_bytes(manifest))
    finally:
        os.close(nodes_fd)

