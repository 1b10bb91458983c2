"""The ``--json`` contract of the read commands, in one place (documented in
docs/status-json.md): ``ups runs --json`` rows, ``ups status --json`` (and each line of
``--json --follow``, which other nodes read), built from a :class:`~ups.runs.view.RunView`.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # this module is on the CLI's import path: the view's module is loaded when a run is read
    from ups.runs.view import RunView


def run_row(view: RunView, now: float) -> dict:
    m = view.manifest or {}
    step, total = view.progress
    worst = view.worst
    created = m.get("created_at")
    return {
        "id": view.run_id,
        "path": str(view.run.path),
        "kind": m.get("kind"),
        "state": view.state,
        "supervision": view.supervision,
        "created_at": created,
        "ended_at": m.get("ended_at"),
        "age": None if created is None else round(now - created, 1),
        "step": step,
        "total": total,
        "unit": view.unit,
        "rate": view.rate,
        "health": None if worst is None else worst.health.value,
        "reason": None if worst is None else worst.reason,
        "summary": m.get("summary"),
        "problem": view.manifest_problem,
        "unreadable_records": [f"{p.file}: {p.problem}" for p in view.problems],
    }


def status_payload(view: RunView, gpu_by_pid: dict[int, int] | None = None) -> dict:
    times, straggler = view.step_times
    processes = []
    for p in view.processes:
        row = p.to_dict()
        t = times.get(p.record.name)
        row["step_time"] = None if t is None else t.to_dict()
        used = (gpu_by_pid or {}).get(p.record.pid)
        if used is not None:
            row["gpu"] = dict(row["gpu"] or {"device": None, "allocated": None, "reserved": None, "peak": None})
            row["gpu"]["nvml_used"] = used
        processes.append(row)
    step, total = view.progress
    return {
        "run": view.manifest,
        "state": view.state,
        "supervision": view.supervision,
        "run_dir": str(view.run.path),
        "manifest_problem": view.manifest_problem,
        "progress": {"step": step, "total": total, "rate": view.rate, "unit": view.unit, "eta_s": view.eta_s},
        "processes": processes,
        "nodes": [n.to_dict() for n in view.nodes],
        "straggler": None if straggler is None else straggler.to_dict(),
        "unreadable": [{"file": p.file, "problem": p.problem} for p in view.problems],
        "series": series_payload(view),
        "read_at": view.read_at,
    }


def series_payload(view: RunView) -> dict:
    """Each process's metrics series (ups.status.series), points as dicts; unreadable files
    named with their reason. NaN and infinities are the strings "nan", "inf", "-inf"."""
    from ups.status.series import raw_points, read_run_series

    found, problems = read_run_series(view.run.path)
    out: dict = {}
    for name, data in found.items():
        out[name] = {"attempt": data.get("attempt"), "count": data.get("count"), "stride": data.get("stride"),
                     "first_nonfinite": data.get("first_nonfinite"), "points": raw_points(data)}
    for file, problem in problems.items():
        out[file.removesuffix(".json")] = {"unreadable": problem}
    return out


def gpu_by_pid() -> dict[int, int]:
    """NVML's used memory per pid when the GPU layer is available; empty otherwise."""
    try:
        from ups.gpu import get_provider, gpu_memory_by_pid  # type: ignore[attr-defined]
    except ImportError:
        return {}
    try:
        return gpu_memory_by_pid(get_provider().snapshot())
    except Exception:  # noqa: BLE001 - GPU info is a bonus here, never a reason to fail
        return {}


def stream_payload(view: RunView, sent: dict[str, tuple] | None = None) -> dict:
    """A ``--follow`` line: the status payload, this host's name, the records whole (a reader
    on another node rebuilds its view from them, with the health judged here), and ``stacks``:
    the latest sections of the stack files (:func:`changed_stacks`) that changed since the
    stream's earlier lines (``sent``, kept by the stream), so that the reader's ``ups why``
    names a frame read on this node."""
    from ups.status.host import hostname

    payload = status_payload(view)
    payload["host"] = hostname()
    payload["records"] = [p.record.to_dict() for p in view.processes]
    payload["stacks"] = changed_stacks(view, {} if sent is None else sent)
    return payload


SECTION_START = re.compile(r"^(?:=== stack dump of |=== uncaught exception in |Fatal Python error: )", re.M)
"""Where a section of a stack file begins (its writers: ups.runs.signals, ups.instrument,
ups.attach.pyspy; its reader: ups.why.stacks): a requested dump, an uncaught exception, a
fatal signal's report."""
STACK_READ = 256 << 10  # of a stack file's end (as ups.why.evidence reads it)
STACK_SEND = 32 << 10  # at most, a process, a line


def changed_stacks(view: RunView, sent: dict[str, tuple]) -> dict[str, str]:
    """By record name, the end of each process's stack file that changed since ``sent`` (its
    size and time of change, updated here): from the latest section of each kind on (a dump,
    an exception, a fatal signal's report), as the file has it."""
    out: dict[str, str] = {}
    for p in view.processes:
        rel = p.record.stack_file or f"stacks/{p.record.name}.txt"
        try:
            st = os.stat(view.run.path / rel)
        except (OSError, ValueError):
            continue
        mark = (st.st_size, st.st_mtime_ns, st.st_ino)
        if sent.get(p.record.name) == mark:
            continue
        from ups.status.safeio import try_tail

        text = try_tail(view.run.path / rel, STACK_READ)
        if text is None:
            continue
        sent[p.record.name] = mark
        out[p.record.name] = latest_sections(text)
    return out


def latest_sections(text: str, limit: int = STACK_SEND) -> str:
    """The stack file's text from the latest section of each kind on, within ``limit``
    characters (at least the latest section's end)."""
    starts = [m.start() for m in SECTION_START.finditer(text)]
    if not starts:
        return text[-limit:]
    begin, kinds = starts[-1], set()
    for at in reversed(starts):
        kind = text[at:at + 12]  # "=== stack du", "=== uncaught", "Fatal Python"
        if kind in kinds:
            continue
        if len(text) - at > limit:
            break
        kinds.add(kind)
        begin = at
    return text[begin:][-limit:]
