"""A process that makes no progress: busy, being checked, or idle (docs/design.md, "An action
is not a display"). A rank that evaluates alone, writes a checkpoint or uploads while its peers wait
for it is busy, not stuck, however long it takes; a process with no progress signal at all is
neither healthy nor stalled until the launcher has watched it (ups.launch.proof).

These verdicts come before any that would call the process stuck: while the launcher watches
(``checking``) the verdict names nobody and says what is known; once it has seen the process
idle, the rules that name a stuck process speak.
"""

from __future__ import annotations

from ups.runs.view import ProcessView
from ups.status.health import PAUSE_SAID_AFTER_S, RHYTHM, STACK_READ_EVERY_S, Health
from ups.why.evidence import Evidence
from ups.why.rules.common import in_backward, label_list, shown_function, where_of
from ups.why.verdict import Verdict, who_of


def _for(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def _at(where: dict) -> str:
    if where.get("function") and where.get("site"):
        return f" in `{shown_function(where)}` at {where['site']}"
    return f" at {where['site']}" if where.get("site") else ""


def quiet_for(ev: Evidence, p: ProcessView) -> float:
    """How long the process has made no progress (its phase changes count as progress). Progress
    seen only from the stacks' rhythm is seen only at a read: quiet starts two reads after it."""
    r = p.record
    if not r.step:
        return max(0.0, ev.now - r.started_at)
    quiet = max(0.0, ev.now - max(r.progress_at, r.phase_at))
    if str(r.metrics.get("progress_from", "")).startswith(RHYTHM):
        quiet = max(0.0, quiet - 2 * STACK_READ_EVERY_S)
    return quiet


def waited_for(ev: Evidence, p: ProcessView, waiting: list[ProcessView], waits_in: str | None) -> Verdict | None:
    """The rank its peers wait for (``waits_in``: "all_reduce", "DDP's gradient all-reduce
    (backward)"): busy, or being checked; None when it has been seen idle (the caller names it
    stuck) or there is no launcher to ask (the caller decides as before)."""
    state, doing = ev.doing(p)
    r = p.record
    where = where_of(ev, r)
    peers = f"{label_list(waiting)} {'wait' if len(waiting) > 1 else 'waits'} for it" + (f" in {waits_in}" if waits_in else "")
    if state == "busy":
        return Verdict("busy", f"{r.label} is busy {doing}{_at(where)}, {_for(quiet_for(ev, p))} so far; {peers}",
                       ok=True, who=who_of(r), where=where, since=max(r.progress_at, r.phase_at),
                       evidence=[f"{r.label}: {doing}", f"{label_list(waiting)}: " + (f"in {waits_in}" if waits_in else f"waits for {r.label}")],
                       next=f"nothing to do: {r.label} is working; ups status {ev.view.run_id}")
    if state in ("checking", "unsure"):
        windows = (ev.observed.get(r.name) or {}).get("windows") or 0
        looking = (f"it does not seem to work ({doing}), but no hang is proven: ups acts only on a proven one"
                   if state == "unsure" and windows >= 3 else
                   "checking whether it is working" + (f" (so far: {doing})" if doing else ""))
        return Verdict("waiting", f"{peers.replace(' for it', f' for {r.label}', 1)}; {r.label} has made no progress for "
                       f"{_for(quiet_for(ev, p))} in phase {r.phase}{_at(where)}; {looking}",
                       ok=True, since=max(r.progress_at, r.phase_at), evidence=[f"{r.label}: {p.verdict.reason}"],
                       next=f"ups why {ev.view.run_id} again in a few seconds")
    return None


def busy_pause(ev: Evidence) -> Verdict | None:
    """Ranks busy on their own (an evaluation or a checkpoint on rank 0 alone, an upload) while
    their peers wait for them: what they do, and who waits. Not a problem, however long."""
    ranks = [p for p in ev.processes("rank") if p.record.state == "running"]
    busy = [(p, doing) for p in ranks if p.verdict.health is not Health.NO_SIGNAL  # no_signal says those
            and (state := ev.doing(p))[0] == "busy" and (doing := state[1]) and quiet_for(ev, p) >= PAUSE_SAID_AFTER_S]
    if not busy:
        return None
    waiting = [p for p in ranks if p not in [b for b, _ in busy]
               and (p.record.collective or p.verdict.reason.startswith("waits for") or quiet_for(ev, p) >= PAUSE_SAID_AFTER_S)]
    if len(ranks) > 1 and not waiting and len(busy) < len(ranks):
        return None  # the others go on: a rank's long step is no pause of the run
    p, doing = busy[0]
    r = p.record
    where = where_of(ev, r)
    who = r.label if len(busy) == 1 else label_list([b for b, _ in busy])
    wait = ""
    if waiting:
        c = next((q.record.collective for q in waiting if q.record.collective), None)
        waits_in = c["op"] if c else "DDP's gradient all-reduce (backward)" if any(in_backward(ev, q) for q in waiting) else ""
        wait = f"; {label_list(waiting)} {'wait' if len(waiting) > 1 else 'waits'} for it" + (f" in {waits_in}" if waits_in else "")
    item = f" ({r.item})" if r.item and r.phase in ("checkpoint", "load") else ""
    return Verdict("busy", f"{who} {'is' if len(busy) == 1 else 'are'} busy {doing}{item}{_at(where)}, "
                           f"{_for(quiet_for(ev, p))} so far{wait}", ok=True, who=who_of(r), where=where,
                   since=max(r.progress_at, r.phase_at),
                   evidence=[f"{b.record.label}: {d} (phase {b.record.phase})" for b, d in busy[:4]]
                   + [f"{q.record.label}: {q.verdict.reason}" for q in waiting[:4]],
                   next=f"nothing to do: it is working; ups status {ev.view.run_id}")


def no_signal(ev: Evidence) -> Verdict | None:
    """A process past its first-progress limit that never said how far it is (no steps,
    batches, progress bars, pool tasks or k/n lines): busy, idle (then a hang, once proven:
    the launcher saw it idle twice with the same stack), or simply unknown."""
    quiet = [p for p in ev.view.processes if p.verdict.health is Health.NO_SIGNAL]
    if not quiet:
        return None
    p = sorted(quiet, key=lambda p: (p.record.role != "rank", p.record.rank or 0))[0]
    r = p.record
    state, doing = ev.doing(p)
    where = where_of(ev, r)
    seen = ev.observed.get(r.name) or {}
    if state == "busy":
        return Verdict("busy", f"{r.label} is busy {doing}{_at(where)}; it reports no progress signal "
                               f"({_for(quiet_for(ev, p))} since it started)", ok=True, who=who_of(r), where=where,
                       since=r.started_at, evidence=[p.verdict.reason], next=f"ups logs {ev.view.run_id} -f")
    if state == "idle" and seen.get("proven"):
        return Verdict("hung", f"{r.label} shows no progress signal and is idle{_at(where)}: {doing}; the same stack "
                               "in two dumps", who=who_of(r), where=where, since=r.started_at,
                       evidence=[p.verdict.reason, f"launcher: {doing}"], next=f"ups stacks {ev.view.run_id}")
    seen_text = f" (the launcher sees it {state}: {doing})" if state in ("idle", "unsure") and doing else (
        "; checking whether it is working" if state == "checking" else "")
    return Verdict("no_signal", f"{r.label} reports no progress signal ({_for(quiet_for(ev, p))} since it started, phase "
                                f"{r.phase}{_at(where)}): not judged either way until it reports progress{seen_text}", ok=True,
                   who=who_of(r), where=where, since=r.started_at, evidence=[p.verdict.reason],
                   next=f"ups logs {ev.view.run_id} -f  (print progress, use tqdm, or pass --total-steps)")
