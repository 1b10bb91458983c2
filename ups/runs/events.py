"""A run's event log, ``events.jsonl``: append-only, one JSON object per line."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from ups.runs.runpaths import RunPaths
from ups.status.safeio import BadFile, decode_json, number, read_tail, safe_value

EVENTS_TAIL_BYTES = 8 << 20  # events.jsonl is read from its last 8 MiB (a run's log is ~KBs)


class EventLog(RunPaths):
    """The run's audit log: every automatic action and every request is an event here."""

    def append_event(self, event: str, *, actor: str, **fields: Any) -> dict[str, Any]:
        """Append one JSON line to events.jsonl (a single O_APPEND write: no interleaving),
        never through a symlink nor into a FIFO planted under its name."""
        entry = {"ts": time.time(), "event": event, "actor": actor, **fields}
        line = (json.dumps(entry, default=str) + "\n").encode()
        fd = self.open_append("events.jsonl")
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

