"""The launcher's writes to its run folder, which survive a full disk.

The launcher is what records how the job ended; a write that fails (``ENOSPC`` on a full
disk, ``EDQUOT``, a transient ``EIO``) must neither kill it nor lose the fact. Here a failed
event append or manifest change is kept in memory, in order, and written with the next write
that succeeds (the supervisor also retries once a second, and at the run's end waits for space
to record the truth). The first failure is remembered as evidence: a run whose records are
incomplete because the disk was full says so instead of blaming the job.

A run folder can also vanish under a running job (``rm -rf runs`` while it runs) or be
replaced by another folder of the same name. The job is the user's and goes on; the
launcher then writes nothing more (not into a folder that is not its run) and keeps nothing
to write later: :meth:`LauncherRun.gone` says so, and the supervisor ends with the job.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from ups.runs.rundir import RunDir
from ups.status.files import folder_identity

MAX_PENDING_EVENTS = 10_000  # beyond this, events are counted, not kept


class LauncherRun(RunDir):
    """A :class:`RunDir` whose ``append_event`` and ``update_manifest`` never raise OSError."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__(path)
        self._pending_lock = threading.RLock()
        self._events: list[tuple[str, str, dict[str, Any]]] = []
        self._changes: dict[str, Any] = {}
        self.lost_events = 0
        self.write_failure: dict[str, Any] | None = None  # the first: {"at", "error", "errno"}
        self._identity = folder_identity(self.path)

    def gone(self) -> str | None:
        """Why the run folder is no longer this run's ("deleted", "replaced by another
        folder"), or None while it is."""
        now = folder_identity(self.path)
        if now == self._identity:
            return None
        return "deleted" if now is None else "replaced by another folder"

    @property
    def pending(self) -> bool:
        return bool(self._events or self._changes)

    def _failed(self, exc: OSError) -> None:
        if self.write_failure is None:
            self.write_failure = {"at": time.time(), "error": exc.strerror or str(exc), "errno": exc.errno}
            try:
                print(f"ups: cannot write to the run folder ({exc.strerror or exc}); the launcher keeps what it "
                      "knows and writes it when it can", flush=True)
            except (OSError, ValueError):
                pass

    def _flush_events(self) -> bool:
        while self._events:
            event, actor, fields = self._events[0]
            try:
                RunDir.append_event(self, event, actor=actor, **fields)
            except OSError as exc:
                self._failed(exc)
                return False
            self._events.pop(0)
        return True

    def append_event(self, event: str, *, actor: str, **fields: Any) -> dict[str, Any]:
        entry = {"ts": time.time(), **fields}
        if self.gone():
            return {"event": event, "actor": actor, **entry}
        with self._pending_lock:
            if len(self._events) >= MAX_PENDING_EVENTS:
                self.lost_events += 1
            else:
                self._events.append((event, actor, entry))
            self._flush_events()
        return {"event": event, "actor": actor, **entry}

    def update_manifest(self, **changes: Any) -> dict[str, Any]:
        if self.gone():
            return changes
        with self._pending_lock:
            merged = {**self._changes, **changes}
            try:
                manifest = RunDir.update_manifest(self, **merged)
            except OSError as exc:
                self._failed(exc)
                self._changes = merged
                return merged
            self._changes = {}
            return manifest

    def flush_pending(self) -> bool:
        """Write what is kept; True when nothing is left (or nowhere is left to write it)."""
        if self.gone():
            with self._pending_lock:
                self._events.clear()
                self._changes = {}
            return True
        with self._pending_lock:
            if self._changes:
                self.update_manifest()
            self._flush_events()
            return not self.pending
