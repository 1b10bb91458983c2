"""The run directory: manifest (``run.json``), event log, control requests, sub-folders.

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

import contextlib
import errno
import fcntl
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ups.errors import CorruptRun, Refused, RunNotFound, UpsError
from ups.runs.manifest_spec import MANIFEST_SCHEMA, RUN_STATES, check_manifest
from ups.status import confined
from ups.status.confined import Unsafe, open_append, open_own_dir, write_atomic_at
from ups.status.host import hostname
from ups.status.printable import printable
from ups.status.safeio import (
    BadFile,
    decode_json,
    number,
    read_json,
    read_tail,
    safe_value,
)

FINAL_RUN_STATES = ("succeeded", "partial", "failed", "killed", "lost")
"""``lost``: the launcher and every process vanished and nothing recorded how the run ended
(a reboot, everything SIGKILLed)."""
SUBDIRS = ("status", "stacks", "logs", "control")
NODES_DIR = "nodes"
TORCHRUN_LOGS = "torchrun"  # logs/torchrun: the --log-dir ups hands to torchrun (ups.launch.programs)
RUN_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
# The per-node keys of a multi-node manifest; the run's own (shared) keys stay in run.json.
NODE_STATE_ORDER = ("killed", "failed", "lost", "partial", "succeeded")
DIR_MODE = 0o755  # a run's folders: only their owner writes there, whatever the umask
EVENTS_TAIL_BYTES = 8 << 20  # events.jsonl is read from its last 8 MiB (a run's log is ~KBs)
CONTROL_MAX_BYTES = 64 << 10


def check_run_id(run_id: str) -> str:
    """A run id given by the user (``--run-id``, a rendezvous id) is a folder name: letters,
    digits, ``.``, ``_`` and ``-`` only."""
    if not run_id or run_id.startswith((".", "-")) or not set(run_id) <= RUN_ID_CHARS or len(run_id) > 120:
        raise UpsError(f"run id {printable(run_id)!r} must be 1-120 letters, digits, '.', '_' or '-' "
                       "(not starting with '.' or '-')")
    return run_id


def merge_node_states(nodes: dict[str, dict[str, Any]], nnodes: int | None = None) -> dict[str, Any]:
    """The run's state from its nodes' manifests (those this reader sees: every node's on a
    shared folder, its own otherwise): running while any node runs; once every node has
    ended, the worst of their ends (killed, failed, lost, partial, succeeded), with a summary
    that names the nodes that did not succeed. ``nnodes``: how many nodes the run has."""
    if not nodes:
        return {"state": "launching"}
    states = {host: n.get("state") for host, n in nodes.items()}
    running = [h for h, s in states.items() if s not in FINAL_RUN_STATES]
    bad = sorted(h for h, s in states.items() if s in FINAL_RUN_STATES and s != "succeeded")
    out: dict[str, Any] = {"failed_nodes": bad}
    if running:
        out["state"] = "launching" if all(s == "launching" for s in states.values()) else "running"
        if bad:
            out["summary"] = "; ".join(f"node {h} {states[h]}: {nodes[h].get('summary') or '-'}" for h in bad)
        return out
    final = [s for s in states.values() if s in FINAL_RUN_STATES]
    out["state"] = next(s for s in NODE_STATE_ORDER if s in final)
    out["ended_at"] = max((n.get("ended_at") or 0.0) for n in nodes.values()) or None
    if bad:
        out["summary"] = "; ".join(f"node {h} {states[h]}: {nodes[h].get('summary') or '-'}" for h in bad)
        first = nodes[bad[0]].get("failure")
        out["failure"] = dict(first, node=bad[0]) if isinstance(first, dict) else {"node": bad[0]}
    else:
        out["summary"] = f"every node ({len(nodes)}{f' of {nnodes}' if nnodes and nnodes > len(nodes) else ''}) succeeded"
    return out


def new_run_id(kind: str, now: float | None = None) -> str:
    """``<date>-<time>-<kind or name>-<4 hex>``; a name is cut to 40 safe characters."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now if now is not None else time.time()))
    label = "".join(c if c.isalnum() or c in "._-" else "-" for c in kind).strip(".-")[:40] or "run"
    return f"{stamp}-{label}-{os.urandom(2).hex()}"


class RunDir:
    """One run's folder. Cheap to construct; touches the disk only when asked."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    # -- paths ---------------------------------------------------------------------------
    @property
    def run_id(self) -> str:
        """The folder's name, safe to show (a folder planted by someone else may have any
        name; ups's own ids are letters, digits, '.', '_' and '-')."""
        return printable(self.path.name)

    @property
    def manifest_path(self) -> Path:
        return self.path / "run.json"

    @property
    def status_dir(self) -> Path:
        return self.path / "status"

    @property
    def stacks_dir(self) -> Path:
        return self.path / "stacks"

    @property
    def logs_dir(self) -> Path:
        return self.path / "logs"

    @property
    def control_dir(self) -> Path:
        return self.path / "control"

    @property
    def events_path(self) -> Path:
        return self.path / "events.jsonl"

    @property
    def nodes_dir(self) -> Path:
        return self.path / NODES_DIR

    @property
    def is_multinode(self) -> bool:
        """A run of several nodes (it has ``nodes/``): each node writes its own manifest."""
        return self.nodes_dir.is_dir()

    def node_manifest_path(self, host: str | None = None) -> Path:
        return self.nodes_dir / f"{host or hostname()}.json"

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    # -- the folder, as ups writes into it (ups.status.confined) --------------------------
    @contextlib.contextmanager
    def folder(self, sub: str | None = None, *, make: bool = False) -> Iterator[int]:
        """The run folder (or its sub-folder ``sub``) as a descriptor to write relative to: a
        real folder, never a link, of the acting user's that no one else may write; Unsafe (an
        OSError, one line) otherwise; so is a path to it through a link another user planted in a
        shared folder (:func:`~ups.status.confined.check_links`). ``make``: the sub-folder is made
        when missing."""
        confined.check_links(self.path.parent)
        fd = open_own_dir(self.path, f"run folder {self.path}")
        try:
            if sub is not None:
                where = f"{self.path}/{sub}"
                sub_fd = confined.make_dir(sub, where, dir_fd=fd, exist_ok=True) if make else open_own_dir(sub, where, dir_fd=fd)
                os.close(fd)
                fd = sub_fd
            yield fd
        finally:
            os.close(fd)

    def open_log(self, name: str) -> int:
        """``logs/<name>.log`` (:meth:`log_path`) opened for appending, relative to the run
        folder: never through a link, never into another user's folder."""
        with self.folder("logs", make=True) as logs:
            return open_append(self.log_path(name).name, dir_fd=logs)

    def write_file(self, name: str, data: bytes) -> None:
        """A file of the run (``config.json``, ``metrics/rank-0.json``) written atomically, its
        folders made and opened relative to the run folder, no link followed."""
        head, _, tail = name.rpartition("/")
        with self.folder() as fd:
            sub = confined.make_dirs(".", head, dir_fd=fd)
            try:
                write_atomic_at(sub, tail, data)
            finally:
                os.close(sub)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RunDir) and other.path == self.path

    def __hash__(self) -> int:
        return hash(self.path)

    # -- creation ------------------------------------------------------------------------
    @classmethod
    def create(
        cls,
        runs_root: str | os.PathLike[str],
        kind: str,
        *,
        argv: list[str] | None = None,
        config: dict[str, Any] | None = None,
        extra: dict[str, Any] | None = None,
        name: str | None = None,
        run_id: str | None = None,
        multinode: dict[str, Any] | None = None,
    ) -> RunDir:
        """Make ``<runs_root>/<new id>/`` with its sub-folders and a ``launching`` manifest.

        ``name`` (default: the kind) is the readable part of the id. ``run_id`` names the
        folder exactly (it must not exist yet) unless ``multinode`` is given (``{"nnodes":
        N, ...}``): then this node joins the run of that id, creating it if it is the first,
        and its manifest is ``nodes/<host>.json`` (see the module's docstring)."""
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
                return cls._join(root, root_fd, str(run_id), kind, argv=argv, config=config, extra=extra, name=name,
                                 multinode=multinode)
            return cls._make(root, root_fd, run_id, kind, argv=argv, config=config, extra=extra, name=name)
        except Unsafe as exc:
            raise Refused(f"{exc}; nothing written") from None
        finally:
            os.close(root_fd)

    @classmethod
    def _make(cls, root: Path, root_fd: int, run_id: str | None, kind: str, *, argv: list[str] | None,
              config: dict[str, Any] | None, extra: dict[str, Any] | None, name: str | None) -> RunDir:
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
            manifest = cls._new_manifest(run.run_id, kind, argv=argv, config=config, extra=extra, name=name)
            write_atomic_at(run_fd, "run.json", _manifest_bytes(manifest))
        finally:
            os.close(run_fd)
        return run

    @staticmethod
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

    @classmethod
    def _join(cls, root: Path, root_fd: int, run_id: str, kind: str, *, argv: list[str] | None,
              config: dict[str, Any] | None, extra: dict[str, Any] | None, name: str | None,
              multinode: dict[str, Any]) -> RunDir:
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
            cls._prove_joined(run, run_fd)
            for sub in (*SUBDIRS, NODES_DIR):
                os.close(confined.make_dir(sub, f"{run.path}/{sub}", dir_fd=run_fd, exist_ok=True))
            with run.manifest_lock(run_fd):
                run._join_locked(run_fd, host, kind, argv=argv, config=config, extra=extra, name=name,
                                 multinode=multinode)
        finally:
            os.close(run_fd)
        return run

    @staticmethod
    def _prove_joined(run: RunDir, run_fd: int) -> None:
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

    def _join_locked(self, run_fd: int, host: str, kind: str, *, argv: list[str] | None,
                     config: dict[str, Any] | None, extra: dict[str, Any] | None, name: str | None,
                     multinode: dict[str, Any]) -> None:
        run, root, run_id = self, self.path.parent, self.path.name
        if confined.check_entry("run.json", f"{run.path}/run.json", dir_fd=run_fd):
            shared = run._read_json(run.manifest_path)
            if not shared.get("multinode"):
                raise UpsError(f"run {run_id} already exists under {root} and is not a multi-node run: "
                               "give another --run-id")
            if shared.get("kind") != kind:
                raise UpsError(f"run {run_id} is a {shared.get('kind')} run; this node launches {kind}")
        else:
            shared = {"schema": MANIFEST_SCHEMA, "id": run_id, "kind": kind, "name": name or kind, "state": "running",
                      "created_at": time.time(), "ended_at": None, "host": host,
                      "multinode": {k: v for k, v in multinode.items() if k != "node_rank"}}
            write_atomic_at(run_fd, "run.json", _manifest_bytes(shared))
        mine = run.node_manifest_path(host)
        nodes_fd = open_own_dir(NODES_DIR, str(run.nodes_dir), dir_fd=run_fd)
        try:
            if confined.check_entry(mine.name, str(mine), dir_fd=nodes_fd):
                old = run._read_json(mine)
                raise UpsError(f"node {host} has already joined run {run_id} (its launcher: pid "
                               f"{(old.get('launcher') or {}).get('pid')}, {old.get('state')}): give each run a new "
                               "--run-id, and each node its own host name (UPS_HOSTNAME)")
            manifest = self._new_manifest(run_id, kind, argv=argv, config=config, extra=extra, name=name)
            manifest["node_rank"] = multinode.get("node_rank")
            write_atomic_at(nodes_fd, mine.name, _manifest_bytes(manifest))
        finally:
            os.close(nodes_fd)

    # -- manifest ------------------------------------------------------------------------
    @staticmethod
    def _read_json(path: Path) -> dict[str, Any]:
        """One manifest file through the trust boundary (regular file, size cap, UTF-8, every
        key a reader uses checked: :mod:`ups.runs.manifest_spec`); CorruptRun (one line,
        where and what) when it cannot be read."""
        try:
            return check_manifest(read_json(path))
        except FileNotFoundError:
            raise CorruptRun(f"{path}: missing {path.name}") from None
        except BadFile as exc:
            reason = f"empty {path.name}" if str(exc) == "empty file" else str(exc)
            raise CorruptRun(f"{path}: {reason}") from None

    def read_nodes(self) -> dict[str, dict[str, Any]]:
        """Each node's manifest of a multi-node run, by host (an unreadable one says why)."""
        out: dict[str, dict[str, Any]] = {}
        try:
            names = sorted(n for n in os.listdir(self.nodes_dir) if n.endswith(".json") and not n.startswith("."))
        except OSError:
            return out
        for name in names:
            try:
                out[name[:-5]] = self._read_json(self.nodes_dir / name)
            except CorruptRun as exc:
                out[name[:-5]] = {"host": name[:-5], "state": None, "problem": str(exc)}
        return out

    def read_manifest(self) -> dict[str, Any]:
        """The manifest; CorruptRun (one line, where and what) when it cannot be read.

        A multi-node run's is merged: run.json, then this host's node manifest over it (its
        launcher, command, job), ``nodes`` (every node's manifest by host), and the run's
        state, summary and failure from all nodes (:func:`merge_node_states`)."""
        data = self._read_json(self.manifest_path)
        if not data.get("multinode"):
            return data
        nodes = self.read_nodes()
        merged = dict(data)
        own = nodes.get(hostname())
        if own is None or own.get("problem"):  # a reader on no node: the run's settings from a node
            own = next(({k: v for k, v in n.items() if k not in ("launcher", "job", "host", "command")}
                        for n in sorted(nodes.values(), key=lambda n: n.get("node_rank") or 0) if not n.get("problem")), {})
        merged.update(own)
        for key in ("summary", "failure", "ended_at", "exit_code", "signal", "verdict"):
            if key not in data:
                merged.pop(key, None)
        merged["multinode"] = data["multinode"]
        merged["nodes"] = nodes
        merged.update(merge_node_states(nodes, (data.get("multinode") or {}).get("nnodes")))
        return merged

    def read_own_manifest(self) -> dict[str, Any]:
        """What this process may modify: run.json, or this host's node manifest of a
        multi-node run."""
        if self.is_multinode and self.manifest_path.exists():
            mine = self.node_manifest_path()
            if not mine.exists():
                raise UpsError(f"{hostname()} is not a node of multi-node run {self.run_id} (nodes: "
                               f"{', '.join(self.read_nodes()) or 'none yet'}): act on it from one of its nodes, "
                               "or with --remote NODE")
            return self._read_json(mine)
        return self.read_manifest()

    def write_manifest(self, manifest: dict[str, Any]) -> None:
        """Write run.json, or this host's node manifest of a multi-node run."""
        body = {k: v for k, v in manifest.items() if k not in ("nodes", "failed_nodes")}
        multinode = self.is_multinode
        with self.folder(NODES_DIR if multinode else None) as fd:
            write_atomic_at(fd, self.node_manifest_path().name if multinode else "run.json", _manifest_bytes(body))

    @contextlib.contextmanager
    def manifest_lock(self, run_fd: int | None = None) -> Iterator[None]:
        """Writers of the manifest take this; readers never need it. A lock file that is not
        a regular file (a planted FIFO or symlink) is refused, not waited on. ``run_fd``: the
        run folder as the caller opened it."""
        try:
            if run_fd is None:
                with self.folder() as own:
                    fd = open_append(".run.json.lock", dir_fd=own)
            else:
                fd = open_append(".run.json.lock", dir_fd=run_fd)
        except Unsafe:
            raise
        except OSError as exc:
            raise OSError(f"{self.path / '.run.json.lock'}: {_reason(exc)}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def update_manifest(self, **changes: Any) -> dict[str, Any]:
        """Read-modify-write under a lock; nested dicts given as values replace whole keys."""
        with self.manifest_lock():
            manifest = self.read_own_manifest()
            manifest.update(changes)
            self.write_manifest(manifest)
            return manifest

    def settle(self, state: str, **changes: Any) -> bool:
        """Write a final state only if none was written yet (under the lock): several readers
        may notice at once that a run lost its launcher; one of them writes."""
        if state not in FINAL_RUN_STATES:
            raise ValueError(f"not a final run state: {state!r}")
        with self.manifest_lock():
            manifest = self.read_own_manifest()
            if manifest.get("state") in FINAL_RUN_STATES:
                return False
            manifest.update(changes, state=state)
            manifest.setdefault("ended_at", None)
            manifest["ended_at"] = manifest["ended_at"] or time.time()
            self.write_manifest(manifest)
            return True

    def set_state(self, state: str, **changes: Any) -> dict[str, Any]:
        if state not in RUN_STATES:
            raise ValueError(f"unknown run state {state!r}")
        if state in FINAL_RUN_STATES:
            changes.setdefault("ended_at", time.time())
        return self.update_manifest(state=state, **changes)

    # -- events --------------------------------------------------------------------------
    def append_event(self, event: str, *, actor: str, **fields: Any) -> dict[str, Any]:
        """Append one JSON line to events.jsonl (a single O_APPEND write: no interleaving),
        never through a symlink nor into a FIFO planted under its name."""
        entry = {"ts": time.time(), "event": event, "actor": actor, **fields}
        line = (json.dumps(entry, default=str) + "\n").encode()
        try:
            with self.folder() as own:
                fd = open_append("events.jsonl", dir_fd=own)
        except Unsafe:
            raise
        except OSError as exc:
            raise OSError(f"{self.events_path}: {_reason(exc)}") from None
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
        return entry

    def read_events(self, limit: int | None = None) -> list[dict[str, Any]]:
        """Events in order (from the last EVENTS_TAIL_BYTES); a line that is not a JSON
        object becomes ``{"event": "unreadable", ...}``, a file that cannot be read one such
        entry with the reason."""
        try:
            text = read_tail(self.events_path, EVENTS_TAIL_BYTES)
        except FileNotFoundError:
            return []
        except BadFile as exc:
            return [{"event": "unreadable", "line": 0, "text": f"{self.events_path.name}: {exc}"}]
        lines = text.splitlines()
        if len(text.encode()) >= EVENTS_TAIL_BYTES and lines:
            lines = lines[1:]  # the cut first line
        if limit is not None:
            lines = lines[-limit:]
        out: list[dict[str, Any]] = []
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                obj = decode_json(line)
                if not isinstance(obj, dict) or not isinstance(obj.get("event", ""), str):
                    raise BadFile("not an event")
                if "ts" in obj:
                    number()(obj["ts"])  # a time every reader can format
                out.append(safe_value(obj))
            except BadFile:
                out.append({"event": "unreadable", "line": n, "text": line[:200]})
        return out

    # -- control requests ----------------------------------------------------------------
    def put_control(self, request: str, *, actor: str, **args: Any) -> Path:
        """Ask the job to do something (e.g. ``fallback``); the job polls ``control/``."""
        body = {"request": request, "actor": actor, "ts": time.time(), **args}
        path = self.control_dir / f"{time.time_ns()}-{request}.json"
        with self.folder("control", make=True) as control:
            write_atomic_at(control, path.name, json.dumps(body).encode())
        self.append_event("control", actor=actor, request=request, **args)
        return path

    def pending_controls(self, *, actor: str = "job") -> list[tuple[Path, dict[str, Any]]]:
        """Requests not yet handled, oldest first. A request that cannot be read (not a
        regular file, too large, not UTF-8 JSON, not an object naming a ``request``) is
        rejected once: renamed to ``*.rejected`` and logged as a ``control.rejected`` event
        with the reason, so it is neither re-read forever nor in the way of the next one."""
        out = []
        try:
            names = sorted(p for p in os.listdir(self.control_dir) if p.endswith(".json") and not p.startswith("."))
        except OSError:
            return []
        rejected = self.__dict__.setdefault("_rejected_controls", set())
        for name in names:
            path = self.control_dir / name
            if name in rejected:
                continue
            try:
                body = read_json(path, CONTROL_MAX_BYTES)
                if not isinstance(body, dict) or not isinstance(body.get("request"), str):
                    raise BadFile("not a JSON object naming a 'request'")
            except FileNotFoundError:
                continue  # handled meanwhile
            except BadFile as exc:
                rejected.add(name)
                with contextlib.suppress(OSError), self.folder("control") as control:
                    os.replace(name, path.with_suffix(".rejected").name, src_dir_fd=control, dst_dir_fd=control)
                with contextlib.suppress(OSError):
                    self.append_event("control.rejected", actor=actor, request_file=name, reason=str(exc))
                continue
            out.append((path, safe_value(body)))
        return out

    def ack_control(self, path: Path, *, actor: str, result: str) -> None:
        """Mark a request handled: renamed to ``*.done`` and logged as an event."""
        with contextlib.suppress(OSError), self.folder("control") as control:
            os.replace(path.name, path.with_suffix(".done").name, src_dir_fd=control, dst_dir_fd=control)
        self.append_event("control.handled", actor=actor, request_file=path.name, result=result)

    # -- logs ----------------------------------------------------------------------------
    def log_path(self, name: str) -> Path:
        """``logs/<name>.log``; in a multi-node run the launcher's and the job's log are
        this node's: ``logs/job@<host>.log``."""
        if name in ("launcher", "job") and self.is_multinode:
            name = f"{name}@{hostname()}"
        return self.logs_dir / f"{name}.log"


def _manifest_bytes(manifest: dict[str, Any]) -> bytes:
    return (json.dumps(manifest, indent=2, default=str) + "\n").encode()


def _reason(exc: OSError) -> str:
    """Why a run file could not be opened for writing, as the trust boundary says it."""
    if exc.errno == errno.ELOOP:
        return "a symlink (not followed)"
    if exc.errno == errno.ENXIO:
        return "a FIFO"
    return str(exc.strerror or exc)


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
        if (p / "run.json").exists() or any((p / s).is_dir() for s in SUBDIRS):
            out.append(summarize(p))
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
