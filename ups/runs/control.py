"""Control requests: the operator asks a running job to do something (``control/``)."""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any

from ups.runs.events import EventLog
from ups.status.confined import write_atomic_at
from ups.status.safeio import BadFile, read_json, safe_value

CONTROL_MAX_BYTES = 64 << 10


class ControlRequests(EventLog):
    """Requests written to ``control/``, polled and acknowledged by the job; each one logged."""

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

