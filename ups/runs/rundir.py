"""The run directory: manifest (``run.json``), event log, control requests, sub-folders.

Layout (DESIGN.md)::

    runs/<run_id>/
      run.json       manifest, written atomically under a lock (read-modify-write)
      status/        one record per process (ups.status)
      stacks/        faulthandler output per process
      logs/          stdout/stderr of the launcher and each rank
      events.jsonl   append-only audit log, one JSON object per line
      control/       requests from the operator to the job
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ups.errors import CorruptRun, RunNotFound, UpsError
from ups.status.reporter import write_atomic

MANIFEST_SCHEMA = 1
RUN_STATES = ("launching", "running", "succeeded", "partial", "failed", "killed", "lost")
FINAL_RUN_STATES = ("succeeded", "partial", "failed", "killed", "lost")
"""``lost``: the launcher and every process vanished and nothing recorded how the run ended
(a reboot, everything SIGKILLed)."""
SUBDIRS = ("status", "stacks", "logs", "control")


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
        return self.path.name

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

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

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
    ) -> RunDir:
        """Make ``<runs_root>/<new id>/`` with its sub-folders and a ``launching`` manifest.

        ``name`` (default: the kind) is the readable part of the id."""
        root = Path(runs_root)
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UpsError(f"cannot create runs folder {root}: {exc.strerror or exc}") from None
        for _ in range(20):
            run = cls(root / new_run_id(name or kind))
            try:
                run.path.mkdir()
                break
            except FileExistsError:
                continue
        else:  # pragma: no cover - 20 collisions of 16 random bits in one second
            raise UpsError(f"could not allocate a run id under {root}")
        for sub in SUBDIRS:
            (run.path / sub).mkdir()
        manifest = {
            "schema": MANIFEST_SCHEMA,
            "id": run.run_id,
            "kind": kind,
            "name": name or kind,
            "state": "launching",
            "created_at": time.time(),
            "ended_at": None,
            "host": socket.gethostname(),
            "argv": list(argv or []),
            "config": config or {},
            "launcher": None,
            "ranks": {},
        }
        manifest.update(extra or {})
        run.write_manifest(manifest)
        return run

    # -- manifest ------------------------------------------------------------------------
    def read_manifest(self) -> dict[str, Any]:
        """The manifest; CorruptRun (one line, where and what) when it cannot be read."""
        try:
            text = self.manifest_path.read_text()
        except FileNotFoundError:
            raise CorruptRun(f"{self.manifest_path}: missing run.json") from None
        except OSError as exc:
            raise CorruptRun(f"{self.manifest_path}: unreadable ({exc.strerror or exc})") from None
        if not text.strip():
            raise CorruptRun(f"{self.manifest_path}: empty run.json")
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise CorruptRun(f"{self.manifest_path}: not valid JSON ({exc.msg}, line {exc.lineno})") from None
        if not isinstance(data, dict):
            raise CorruptRun(f"{self.manifest_path}: not a JSON object")
        if not isinstance(data.get("schema"), int) or data["schema"] > MANIFEST_SCHEMA:
            raise CorruptRun(f"{self.manifest_path}: unknown manifest schema {data.get('schema')!r}")
        return data

    def write_manifest(self, manifest: dict[str, Any]) -> None:
        write_atomic(self.manifest_path, (json.dumps(manifest, indent=2, default=str) + "\n").encode())

    @contextlib.contextmanager
    def _manifest_lock(self) -> Iterator[None]:
        with open(self.path / ".run.json.lock", "a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def update_manifest(self, **changes: Any) -> dict[str, Any]:
        """Read-modify-write under a lock; nested dicts given as values replace whole keys."""
        with self._manifest_lock():
            manifest = self.read_manifest()
            manifest.update(changes)
            self.write_manifest(manifest)
            return manifest

    def settle(self, state: str, **changes: Any) -> bool:
        """Write a final state only if none was written yet (under the lock): several readers
        may notice at once that a run lost its launcher; one of them writes."""
        if state not in FINAL_RUN_STATES:
            raise ValueError(f"not a final run state: {state!r}")
        with self._manifest_lock():
            manifest = self.read_manifest()
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
        """Append one JSON line to events.jsonl (a single O_APPEND write: no interleaving)."""
        entry = {"ts": time.time(), "event": event, "actor": actor, **fields}
        line = (json.dumps(entry, default=str) + "\n").encode()
        fd = os.open(self.events_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
        return entry

    def read_events(self, limit: int | None = None) -> list[dict[str, Any]]:
        """Events in order; unparseable lines become ``{"event": "unreadable", ...}``."""
        try:
            lines = self.events_path.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return []
        if limit is not None:
            lines = lines[-limit:]
        out: list[dict[str, Any]] = []
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                if not isinstance(obj, dict):
                    raise ValueError
                out.append(obj)
            except ValueError:
                out.append({"event": "unreadable", "line": n, "text": line[:200]})
        return out

    # -- control requests ----------------------------------------------------------------
    def put_control(self, request: str, *, actor: str, **args: Any) -> Path:
        """Ask the job to do something (e.g. ``fallback``); the job polls ``control/``."""
        self.control_dir.mkdir(exist_ok=True)
        body = {"request": request, "actor": actor, "ts": time.time(), **args}
        path = self.control_dir / f"{time.time_ns()}-{request}.json"
        write_atomic(path, json.dumps(body).encode())
        self.append_event("control", actor=actor, request=request, **args)
        return path

    def pending_controls(self) -> list[tuple[Path, dict[str, Any]]]:
        """Requests not yet handled, oldest first (unreadable ones are skipped)."""
        out = []
        try:
            names = sorted(p for p in os.listdir(self.control_dir) if p.endswith(".json") and not p.startswith("."))
        except FileNotFoundError:
            return []
        for name in names:
            path = self.control_dir / name
            try:
                out.append((path, json.loads(path.read_text())))
            except (OSError, ValueError):
                continue
        return out

    def ack_control(self, path: Path, *, actor: str, result: str) -> None:
        """Mark a request handled: renamed to ``*.done`` and logged as an event."""
        with contextlib.suppress(OSError):
            os.replace(path, path.with_suffix(".done"))
        self.append_event("control.handled", actor=actor, request_file=path.name, result=result)

    # -- logs ----------------------------------------------------------------------------
    def log_path(self, name: str) -> Path:
        return self.logs_dir / f"{name}.log"


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
        return RunSummary(path.name, path, None, None, created, None, None, str(exc))
    return RunSummary(
        run_id=str(m.get("id", path.name)),
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
