"""How each job kind's end maps to a run state: one rule per kind, in the table :data:`RULES`.

torchrun runs (our ``train`` and any ``ups launch torchrun``) share one rule, and so do
single-process runs: a run is ``succeeded`` only when the top process exited 0 **and** every
rank's final record says done, i.e. every rank left through a normal interpreter exit.
"""

from __future__ import annotations

import math
import re
import signal
import time
from typing import Any

from ups.runs.outcome import (
    End,
    Outcome,
    default_finalizer,
    describe_returncode,
)
from ups.runs.view import RunView
from ups.status.host import boot_id

PRECOMPUTE_PARTIAL = 3
STOPPED_CODES = (130, 143)  # exited after SIGINT / SIGTERM
NO_NORMAL_EXIT = "ended without a normal interpreter exit (os._exit or a signal)"


def precompute_outcome(view: RunView, end: End) -> Outcome:
    summary = (view.manifest or {}).get("precompute") or {}
    if end.terminated or end.returncode in STOPPED_CODES:
        return Outcome("killed", f"stopped ({describe_returncode(end.returncode)}); rerun to resume from the cache")
    if end.returncode == PRECOMPUTE_PARTIAL:
        q = summary.get("quarantined") or []
        names = ", ".join(f"{x['task_split']}:{x['source']}" for x in q[:5]) + (" ..." if len(q) > 5 else "")
        return Outcome("partial", f"{summary.get('cached', '?')}/{summary.get('total', '?')} samples cached; {len(q)} quarantined: {names}")
    outcome = default_finalizer(view, end)
    if outcome.state == "succeeded" and summary:
        return Outcome("succeeded", f"{summary.get('cached')}/{summary.get('total')} samples cached")
    return outcome


# --------------------------------------------------------------------------- torchrun
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


def _first_line(text: str | None, limit: int = 160) -> str:
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _log_tail(view: RunView) -> str:
    from ups.status.safeio import try_tail

    return try_tail(view.run.log_path("job"), 200_000) or ""


def torchrun_outcome(view: RunView, end: End) -> Outcome:
    """Any job of several ranks: torchrun's, and the other launchers' (accelerate, DeepSpeed,
    srun, ``mp.spawn`` or Lightning under ``ups launch python``), whose ranks say how many
    they are once they joined their process group."""
    m = view.manifest or {}
    world = int(m.get("world_size") or 0)
    if m.get("kind") != "train" and m.get("kind") != "torchrun" or not world:
        world = max((p.record.world_size or 0 for p in view.ranks()), default=0) or world
    boot = boot_id()
    log = _log_tail(view)
    codes, torchrun_root = torchrun_failures(log)
    records = {p.record.rank: p.record for p in view.ranks()}
    expected = set(range(world))
    if m.get("multinode"):  # this node's part (see node_view): its own ranks, however many it runs
        try:
            world = int(m.get("nproc") or 0)
        except (TypeError, ValueError):
            world = 0
        expected = set()
    if not records and not m.get("instrument", True):
        # UPS_INSTRUMENT=0: no process writes a record, so torchrun's own exit is the truth.
        if end.terminated or end.returncode in STOPPED_CODES:
            return Outcome("killed", f"stopped ({describe_returncode(end.returncode)})")
        root = f" (torchrun named rank {torchrun_root})" if torchrun_root is not None else ""
        return Outcome("succeeded" if end.returncode == 0 else "failed",
                       f"torchrun {describe_returncode(end.returncode)}{root} (not instrumented: UPS_INSTRUMENT=0)")
    ranks: dict[str, dict[str, Any]] = {}
    for r in sorted(expected | set(records) | set(codes)):
        rec = records.get(r)
        ex = end.exits.get(rec.name) if rec is not None else None
        state = rec.state if rec is not None else "no record"
        code = codes.get(r)
        if code is None and rec is not None and rec.state != "running":
            code = rec.exit_code
        ranks[str(r)] = {
            "exit_code": code if code is None or code >= 0 else None,
            "signal": _signal_of(code),
            "phase": rec.phase if rec else None,
            "step": rec.step if rec else None,
            "state": state,
            "clean": None if rec is None else state != "running",
            "ended_at": ex.at if ex is not None else None,
            "ended_mono": ex.at_mono if ex is not None and ex.boot_id == boot and ex.at_mono is not None else None,
            "error": rec.error if rec else None,
            "error_site": rec.error_site if rec else None,
        }
    extra = {"ranks": ranks}
    if end.terminated or end.returncode in STOPPED_CODES:
        return Outcome("killed", f"stopped ({describe_returncode(end.returncode)})", extra=extra)

    def abnormal(v: dict[str, Any]) -> bool:
        return v["state"] != "done" or bool(v["exit_code"]) or v["signal"] is not None

    bad_ranks = [r for r, v in ranks.items() if abnormal(v)]
    if end.returncode == 0 and records and not bad_ranks and (not world or len(records) == world):
        return Outcome("succeeded", f"{len(records)} rank(s) done", extra=extra)
    unseen = [r for r in bad_ranks if ranks[r]["state"] == "no record" and ranks[r]["exit_code"] is None
              and ranks[r]["signal"] is None]
    if end.returncode == 0 and bad_ranks and unseen == bad_ranks:
        # The launcher's exit 0 is the truth about ranks ups never saw: not watched is not failed.
        done = f"{len(records)} rank(s) done; " if records else ""
        return Outcome("succeeded", f"{m.get('kind') or 'the job'} exited 0; {done}rank {', '.join(unseen)} wrote no "
                                    "status record (not watched)", extra=extra)

    offset = time.time() - time.monotonic()  # wall - mono, now: to put wall-only times on the same line

    def ended(r: str) -> float:
        """When rank r ended, on this boot's CLOCK_MONOTONIC where known (clock steps between
        two ranks' ends must not reorder them), else converted from wall time."""
        v, rec = ranks[r], records.get(int(r))
        if v["ended_mono"] is not None:
            return v["ended_mono"]
        if v["ended_at"] is not None:
            return v["ended_at"] - offset
        if rec is not None and rec.boot_id == boot and rec.heartbeat_mono is not None:
            return rec.heartbeat_mono
        return rec.heartbeat_at - offset if rec is not None else math.inf

    if not bad_ranks:
        agent = next((p.record for p in view.processes if p.record.role == "agent"), None)
        why = f": {agent.error}" if agent is not None and agent.error else ""
        return Outcome("failed", f"{m.get('kind') or 'the job'} {describe_returncode(end.returncode)}{why}", extra=extra)
    # The root cause is the rank that ended abnormally first, by the supervisor's clock.
    bad_ranks.sort(key=ended)
    bad = int(bad_ranks[0])
    info = ranks[str(bad)]
    if info["signal"]:
        how = f"killed by {info['signal']}"
    elif info["state"] == "running":
        how = NO_NORMAL_EXIT + (f", exit code {info['exit_code']}" if info["exit_code"] is not None else "")
    elif info["state"] == "no record":
        how = f"exit code {info['exit_code']} before it wrote a status record" if info["exit_code"] is not None else "never wrote a status record"
    else:
        how = f"failed: {info['error']}," if info["error"] else f"failed with exit code {info['exit_code']}"
    summary = f"rank {bad} {how}" + (f" in phase {info['phase']}" if info["phase"] else "")
    if info["state"] == "running" and not info["signal"]:
        still = [r for r in ranks if r != str(bad) and ended(r) > ended(str(bad))]
        summary += f", last recorded at step {info['step']}" + (f", while rank {', '.join(still)} still ran" if still else "")
    if torchrun_root is not None and torchrun_root != bad:
        summary += f" (torchrun blamed rank {torchrun_root}, which failed after it)"
    failure: dict[str, Any] = {"rank": bad, "signal": info["signal"], "exit_code": info["exit_code"], "phase": info["phase"],
                               "error": info["error"], "error_site": info["error_site"], "clean": info["clean"],
                               "step": info["step"], "torchrun_root": torchrun_root,
                               "followed_by": [{"rank": int(r), "state": ranks[r]["state"], "signal": ranks[r]["signal"],
                                                "error": _first_line(ranks[r]["error"])} for r in bad_ranks[1:]]}
    if "collective mismatch" in log or "doesn't match expected size" in log:
        # The rank that crashes is the one that noticed, not always the one that skipped:
        # show where every rank was, so the odd one out stands out.
        steps = ", ".join(f"rank {r} at step {rec.step}" for r, rec in sorted(records.items()))
        summary += f"; the backend reported a collective mismatch (ranks entered different collectives: {steps})"
        failure["collective_mismatch"] = True
    return Outcome("failed", summary, failure, extra=extra)


# ------------------------------------------------------------------------- python
def python_outcome(view: RunView, end: End) -> Outcome:
    """A single-process program: the supervisor's own child is rank 0."""
    rc = end.returncode
    if end.terminated or rc in STOPPED_CODES:
        return Outcome("killed", f"stopped ({describe_returncode(rc)})")
    if any((p.record.rank or 0) > 0 or (p.record.world_size or 1) > 1 for p in view.ranks()):
        # The program started ranks of its own (mp.spawn, Lightning's re-executed script):
        # judged as any job of several ranks is.
        return torchrun_outcome(view, end)
    rec = next((p.record for p in view.ranks() if p.record.rank == 0), None)
    if rec is None:
        if not (view.manifest or {}).get("instrument", True):
            return Outcome("succeeded" if rc == 0 else "failed", f"{describe_returncode(rc)} (not instrumented: UPS_INSTRUMENT=0)")
        return Outcome("failed", f"{describe_returncode(rc)}; the program wrote no status record "
                                 "(python -I, -E or -S skip the instrumentation)")
    where = f"in phase {rec.phase}"
    failure = {"rank": 0, "pid": rec.pid, "phase": rec.phase, "error": rec.error, "error_site": rec.error_site,
               "exit_code": rc if rc is None or rc >= 0 else None, "signal": _signal_of(rc), "step": rec.step}
    if rc == 0 and rec.state == "done":
        return Outcome("succeeded", f"exited 0 after {rec.step} {rec.unit}")
    if rc is not None and rc < 0:
        return Outcome("failed", f"killed by {_signal_of(rc)} {where} at step {rec.step}", failure)
    if rec.state == "running":
        code = f", exit code {rc}" if rc is not None else ""
        return Outcome("failed", f"{NO_NORMAL_EXIT}{code}, {where}, last recorded at step {rec.step}", failure)
    return Outcome("failed", f"{rec.error or describe_returncode(rc)} {where}", failure)


def pipeline_outcome(view: RunView, end: End) -> Outcome:
    stages = (view.manifest or {}).get("stages") or []
    text = ", ".join(f"{s['stage']} {s.get('state')}" + (f" ({s.get('summary')})" if s.get("state") == "partial" else "")
                     for s in stages)
    if end.terminated or end.returncode in STOPPED_CODES:
        return Outcome("killed", f"stopped; {text}")
    # A partial stage the job went on from (precompute with --skip-bad-shards): partial.
    if end.returncode == 0 and stages and all(s.get("state") in ("succeeded", "partial") for s in stages):
        return Outcome("partial" if any(s.get("state") == "partial" for s in stages) else "succeeded", text)
    return Outcome("failed", text or describe_returncode(end.returncode))


def attached_outcome(view: RunView, end: End) -> Outcome:
    """A job ups attached to (``ups attach``): no exit code is ever seen from outside. Its
    observer writes the end it saw (and the cause its log names, ups.attach.observe); this rule
    decides only for a reader settling a run whose observer is gone, from what the records
    and torchrun's own report in the copied log say, and names nothing it did not see."""
    if end.terminated:
        return Outcome("killed", "stopped by request")
    codes, root = torchrun_failures(_log_tail(view))
    if codes and any(codes.values()):
        bad = root if root is not None else min(r for r, c in codes.items() if c)
        return Outcome("failed", f"torchrun reported rank {bad} {describe_returncode(codes.get(bad))} (read from its log)",
                       {"rank": bad, "exit_code": codes.get(bad) if (codes.get(bad) or 0) >= 0 else None,
                        "signal": _signal_of(codes.get(bad)), "torchrun_root": root})
    failed = [p.record for p in view.ranks() if p.record.state == "failed"]
    if failed:
        r = failed[0]
        return Outcome("failed", f"{r.label}: {r.error or 'failed'}", {"rank": r.rank, "error": r.error,
                                                                       "error_site": r.error_site})
    return Outcome("lost", "the job's processes are gone and its observer ended before it could say how: "
                           "exit codes are not visible from outside")


# Which rule decides a run's end, by its kind; any other kind: the default rule.
RULES = {
    "precompute": precompute_outcome,
    "train": torchrun_outcome, "torchrun": torchrun_outcome, "accelerate": torchrun_outcome,
    "deepspeed": torchrun_outcome, "srun": torchrun_outcome,
    "python": python_outcome,
    "pipeline": pipeline_outcome,
    "attached": attached_outcome,
}


def finalize(view: RunView, end: End) -> Outcome:
    """The run's end as its kind's rule decides it (a full disk noted, not blamed)."""
    outcome = RULES.get(view.kind or "", default_finalizer)(view, end)
    return records_incomplete(view, end, outcome)


def records_incomplete(view: RunView, end: End, outcome: Outcome) -> Outcome:
    """A job that exited 0 while the disk was full may have had no room for its final
    records: that is not a failure of the job. It succeeded, with a note that its records are
    incomplete, unless a record it did write says it failed."""
    if outcome.state != "failed" or end.disk_full is None or end.returncode != 0 or end.terminated:
        return outcome
    if any(p.record.state == "failed" for p in view.processes if p.record.role != "launcher"):
        return outcome
    note = f"exited 0; its records are incomplete (disk full: {end.disk_full})"
    return Outcome("succeeded", note, None, {**outcome.extra, "records_incomplete": end.disk_full})
