"""What the rules of ``ups why`` share: the rule's type, where a process is (its phase and the
frame that matters), how processes are named in a sentence, and when one ended."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from ups.runs.view import ProcessView
from ups.status.record import StatusRecord
from ups.why import stacks
from ups.why.evidence import Evidence
from ups.why.verdict import Verdict

Rule = Callable[[Evidence], Verdict | None]
"""The verdict a rule speaks on the evidence, or None to let the next rule speak. A pure
function of its evidence (the view, the run folder's files, the host's facts)."""


Rule = Callable[[Evidence], Verdict | None]


def where_of(ev: Evidence, record: StatusRecord, section: stacks.Section | None = None) -> dict[str, Any]:
    """Phase and the frame that matters: the program's own innermost frame, and the innermost
    of all (the library call it is in) when that is elsewhere."""
    section = section if section is not None else ev.stack(record)
    own = section.own_frame if section else None
    top = section.top if section else None
    site = own.site if own else (record.error_site or None)
    return {"phase": record.phase, "site": site, **function_of(own),
            "frame": str(top) if top is not None and top is not own else None}


def function_of(frame: stacks.Frame | None) -> dict[str, Any]:
    """A ``where``'s function: its own name (what a script compares, the same for every py-spy
    version), and its qualified name where the dump printed one (what a user is shown)."""
    if frame is None:
        return {"function": None}
    return {"function": frame.function, **({"qualname": frame.qualname} if frame.qualname else {})}


def shown_function(where: dict[str, Any]) -> str | None:
    """The name of a ``where``'s function to show: the qualified one where it is known."""
    return where.get("qualname") or where.get("function")


def label_list(views: list[ProcessView]) -> str:
    return stacks.fold_labels([p.record.label for p in views])


def waits(views: list[ProcessView]) -> str:
    """``rank 0 waits`` / ``ranks 0, 2 wait``."""
    return f"{label_list(views)} {'wait' if len(views) > 1 else 'waits'}"


def first_line(text: str | None, limit: int = 200) -> str:
    line = next((ln.strip() for ln in (text or "").splitlines() if ln.strip()), "")
    return line if len(line) <= limit else line[: limit - 1] + "…"


def grep_lines(text: str, pattern: re.Pattern[str], limit: int = 3) -> list[str]:
    return [ln.strip()[:220] for ln in text.splitlines() if pattern.search(ln)][-limit:]


def ended_at(ev: Evidence, record: StatusRecord) -> float | None:
    ex = ev.exits.get(record.name)
    return ex.at if ex else (record.heartbeat_at if record.is_final else None)


def in_backward(ev: Evidence, p: ProcessView, kind: str | None = None) -> bool:
    section = ev.stack(p.record, kind)
    frames = section.stack if section else ()
    return any("autograd" in f.file or f.function in ("_engine_run_backward", "backward") for f in frames)
