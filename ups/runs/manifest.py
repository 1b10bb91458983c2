"""A run's manifest: ``run.json`` (and a multi-node run's ``nodes/<host>.json``), read
through the trust boundary, written atomically under a lock (read-modify-write).

A multi-node run keeps what all nodes share in ``run.json`` and what each node's launcher
knows in ``nodes/<host>.json``; :meth:`ManifestFile.read_manifest` merges them (see
:mod:`ups.runs.rundir`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ups.errors import CorruptRun, UpsError
from ups.runs.manifest_spec import RUN_STATES, check_manifest
from ups.runs.runpaths import NODES_DIR, RunPaths
from ups.status.confined import write_atomic_at
from ups.status.host import hostname
from ups.status.safeio import BadFile, read_json

FINAL_RUN_STATES = ("succeeded", "partial", "failed", "killed", "lost", "ended")
"""``ended``: an attached job whose every process was seen to end, its log naming no failure: how each
ended (its exit code) is not visible from outside, so success is never claimed (ups.attach.ending).
``lost``: the launcher and every process vanished and nothing recorded how the run ended
(a reboot, everything SIGKILLed)."""
# The per-node keys of a multi-node manifest; the run's own (shared) keys stay in run.json.
NODE_STATE_ORDER = ("killed", "failed", "lost", "partial", "ended", "succeeded")


def merge_node_states(nodes: dict[str, dict[str, Any]], nnodes: int | None = None) -> dict[str, Any]:
    """The run's state from its nodes' manifests (those this reader sees: every node's on a
    shared folder, its own otherwise): running while any node runs; once every node has
    ended, the worst of their ends (killed, failed, lost, partial, ended, succeeded), with a summary
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



def manifest_bytes(manifest: dict[str, Any]) -> bytes:
    return (json.dumps(manifest, indent=2, default=str) + "\n").encode()


def read_manifest_file(path: Path) -> dict[str, Any]:
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


class ManifestFile(RunPaths):
    """The run's manifest: read (merged across nodes), written, settled."""

    def read_nodes(self) -> dict[str, dict[str, Any]]:
        """Each node's manifest of a multi-node run, by host (an unreadable one says why)."""
        out: dict[str, dict[str, Any]] = {}
        try:
            names = sorted(n for n in os.listdir(self.nodes_dir) if n.endswith(".json") and not n.startswith("."))
        except OSError:
            return out
        for name in names:
            try:
                out[name[:-5]] = read_manifest_file(self.nodes_dir / name)
            except CorruptRun as exc:
                out[name[:-5]] = {"host": name[:-5], "state": None, "problem": str(exc)}
        return out

    def read_manifest(self) -> dict[str, Any]:
        """The manifest; CorruptRun (one line, where and what) when it cannot be read.

        A multi-node run's is merged: run.json, then this host's node manifest over it (its
        launcher, command, job), ``nodes`` (every node's manifest by host), and the run's
        state, summary and failure from all nodes (:func:`merge_node_states`)."""
        data = read_manifest_file(self.manifest_path)
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
            return read_manifest_file(mine)
        return self.read_manifest()

    def write_manifest(self, manifest: dict[str, Any]) -> None:
        """Write run.json, or this host's node manifest of a multi-node run."""
        body = {k: v for k, v in manifest.items() if k not in ("nodes", "failed_nodes")}
        multinode = self.is_multinode
        with self.folder(NODES_DIR if multinode else None) as fd:
            write_atomic_at(fd, self.node_manifest_path().name if multinode else "run.json", manifest_bytes(body))

    @contextlib.contextmanager
    def manifest_lock(self, run_fd: int | None = None) -> Iterator[None]:
        """Writers of the manifest take this; readers never need it. A lock file that is not
        a regular file (a planted FIFO or symlink) is refused, not waited on. ``run_fd``: the
        run folder as the caller opened it."""
        fd = self.open_append(".run.json.lock", run_fd)
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

