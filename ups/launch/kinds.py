"""How each job kind's end maps to a run state (registered with ups.launch.finalize)."""

from __future__ import annotations

import re
import signal

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


# ---------------------------------------------------------------------------- train
_FAILURE_RE = re.compile(
    r"rank\s*:\s*(?P<rank>\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(?P<code>-?\d+)\s*\(pid:\s*(?P<pid>\d+)\)"
)


def torchrun_failures(log_text: str) -> tuple[dict[int, int], int | None]:
    """Per-rank exit codes from torchrun's failure report, and its root-cause rank."""
    codes = {int(m["rank"]): int(m["code"]) for m in _FAILURE_RE.finditer(log_text)}
    root = None
    if "Root Cause" in log_text:
        m = _FAILURE_RE.search(log_text.split("Root Cause", 1)[1])
        root = int(m["rank"]) if m else None
    return codes, root


def _signal_of(code: int | None) -> str | None:
    if code is None or code >= 0:
        return None
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


@register_finalizer("train")
def train_outcome(view: RunView, returncode: int, terminated: bool) -> Outcome:
    m = view.manifest or {}
    world = int(m.get("world_size") or 0)
    try:
        log = view.run.log_path("job").read_text(errors="replace")[-200_000:]
    except OSError:
        log = ""
    codes, root = torchrun_failures(log)
    records = {p.record.rank: p.record for p in view.ranks()}
    ranks: dict[str, dict] = {}
    for r in sorted(set(range(world)) | set(records) | set(codes)):
        rec = records.get(r)
        code = codes.get(r, 0 if rec is not None and rec.state == "done" else None)
        ranks[str(r)] = {
            "exit_code": code if code is None or code >= 0 else None,
            "signal": _signal_of(code),
            "phase": rec.phase if rec else None,
            "state": rec.state if rec else "no record",
            "error": rec.error if rec else None,
        }
    extra = {"ranks": ranks}
    if terminated or returncode in STOPPED_CODES:
        return Outcome("killed", f"stopped ({describe_returncode(returncode)})", extra=extra)
    all_done = bool(records) and all(v["state"] == "done" for v in ranks.values()) and (not world or len(records) == world)
    if returncode == 0 and all_done:
        return Outcome("succeeded", f"{len(records)} rank(s) done", extra=extra)
    bad = root if root is not None else next((int(r) for r, v in ranks.items() if v["state"] != "done" or v["exit_code"]), None)
    if bad is None:
        return Outcome("failed", describe_returncode(returncode), extra=extra)
    info = ranks[str(bad)]
    how = f"killed by {info['signal']}" if info["signal"] else (info["error"] or f"exit code {info['exit_code']}")
    failure = {"rank": bad, "signal": info["signal"], "exit_code": info["exit_code"], "phase": info["phase"], "error": info["error"]}
    summary = f"rank {bad} {how} in phase {info['phase']}"
    if "collective mismatch" in log or "doesn't match expected size" in log:
        # The rank that crashes is the one that noticed, not always the one that skipped:
        # show where every rank was, so the odd one out stands out.
        steps = ", ".join(f"rank {r} at step {rec.step}" for r, rec in sorted(records.items()))
        summary += f"; the backend reported a collective mismatch (ranks entered different collectives: {steps})"
        failure["collective_mismatch"] = True
    return Outcome("failed", summary, failure, extra=extra)


@register_finalizer("pipeline")
def pipeline_outcome(view: RunView, returncode: int, terminated: bool) -> Outcome:
    stages = (view.manifest or {}).get("stages") or []
    text = ", ".join(f"{s['stage']} {s.get('state')}" + (f" ({s.get('summary')})" if s.get("state") == "partial" else "")
                     for s in stages)
    if terminated or returncode in STOPPED_CODES:
        return Outcome("killed", f"stopped; {text}")
    # A partial stage the job went on from (precompute with --skip-bad-shards): partial.
    if returncode == 0 and stages and all(s.get("state") in ("succeeded", "partial") for s in stages):
        return Outcome("partial" if any(s.get("state") == "partial" for s in stages) else "succeeded", text)
    return Outcome("failed", text or describe_returncode(returncode))
