"""The ``--json`` contract of the read commands, in one place (documented in
docs/status-json.md): ``ups runs --json`` rows, ``ups status --json`` (and each line of
``--json --follow``, which other nodes read), built from a :class:`~ups.runs.view.RunView`.
"""

from __future__ import annotations

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
    processes = []
    for p in view.processes:
        row = p.to_dict()
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


def stream_payload(view: RunView) -> dict:
    """A ``--follow`` line: the status payload, this host's name, and the records whole (a
    reader on another node rebuilds its view from them, with the health judged here)."""
    from ups.status.host import hostname

    payload = status_payload(view)
    payload["host"] = hostname()
    payload["records"] = [p.record.to_dict() for p in view.processes]
    return payload
