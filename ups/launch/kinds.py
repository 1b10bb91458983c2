"""How each job kind's end maps to a run state (registered with ups.launch.finalize)."""

from __future__ import annotations

from ups.launch.finalize import Outcome, default_finalizer, describe_returncode, register_finalizer
from ups.runs.view import RunView

PRECOMPUTE_PARTIAL = 3
STOPPED_CODES = (130, 143)  # exited after SIGINT / SIGTERM


@register_finalizer("precompute")
def precompute_outcome(view: RunView, returncode: int, terminated: bool) -> Outcome:
    summary = (view.manifest or {}).get("precompute") or {}
    if terminated or returncode in STOPPED_CODES:
        return Outcome("killed", f"stopped ({describe_returncode(returncode)}); rerun to resume from the cache")
    if returncode == PRECOMPUTE_PARTIAL:
        q = summary.get("quarantined") or []
        names = ", ".join(f"{x['task_split']}:{x['source']}" for x in q[:5]) + (" ..." if len(q) > 5 else "")
        return Outcome("partial", f"{summary.get('cached', '?')}/{summary.get('total', '?')} samples cached; {len(q)} quarantined: {names}")
    outcome = default_finalizer(view, returncode, terminated)
    if outcome.state == "succeeded" and summary:
        return Outcome("succeeded", f"{summary.get('cached')}/{summary.get('total')} samples cached")
    return outcome
