"""Live processes by their health, when no more specific rule spoke: one that is gone while its
record says running, one stalled or unresponsive (or a rank settling while its peers have not
stopped yet), and a healthy run."""

from __future__ import annotations

from ups.status.health import PAUSE_SAID_AFTER_S, Health
from ups.why.evidence import Evidence
from ups.why.rules.common import in_backward, label_list, where_of
from ups.why.rules.pauses import quiet_for, waited_for
from ups.why.rules.workers import starting_worker, waits_on_worker, worker_verdict
from ups.why.verdict import Verdict, who_of


def dead(ev: Evidence) -> Verdict | None:
    fine_ranks = {p.record.rank for p in ev.processes("rank") if p.record.state == "running"
                  and p.verdict.health in (Health.OK, Health.STARTING, Health.SLOW)}
    # A DataLoader worker gone while its rank goes on is one the loader let go (the end of an
    # epoch with non-persistent workers exits them without a final record); a worker that died
    # unexpectedly stops its rank within seconds, and the rank's failure names it.
    gone = [p for p in ev.processes("rank", "worker", "agent") if p.verdict.health is Health.DEAD
            and not (p.record.role == "worker" and p.record.rank in fine_ranks)]
    if not gone:
        return None
    p = gone[0]
    r = p.record
    fatal = ev.stack(r, "fatal")
    return Verdict("dead", f"{r.label} (pid {r.pid}) is gone while its record says running, last phase {r.phase}",
                   who=who_of(r), where=where_of(ev, r, fatal), since=r.heartbeat_at,
                   evidence=[p.verdict.reason] + ([f"faulthandler: {fatal.title}"] if fatal else
                                                  ["no fatal-signal traceback: os._exit, SIGKILL (the OOM killer?) or a signal without one"]),
                   next=f"ups logs {ev.view.run_id}" + (f" --rank {r.rank}" if r.role == "rank" else ""))


def hung(ev: Evidence) -> Verdict | None:
    troubled = [p for p in ev.view.processes if p.record.role != "launcher" and p.verdict.health in (Health.STALLED, Health.UNRESPONSIVE)]
    if not troubled:
        return None
    p = sorted(troubled, key=lambda p: (p.verdict.health.severity, p.record.role == "rank"), reverse=True)[0]
    for q in troubled:  # a rank that waits on its own DataLoader worker: the worker is the one
        worker = waits_on_worker(ev, q) if q.record.role == "rank" else None
        if worker is not None:
            return worker_verdict(ev, worker, [o for o in troubled if o.record.role == "rank" and o is not q])
        starting = starting_worker(ev, q) if q.record.role == "rank" else None
        if starting is not None:  # an epoch's re-warm: its worker is starting
            w, state, doing = starting
            if state == "checking":
                return Verdict("waiting", f"{q.record.label} waits for its DataLoader {w.record.label}, which is starting; "
                                          "checking whether it is working", ok=True,
                               since=max(q.record.progress_at, q.record.phase_at), evidence=[q.verdict.reason],
                               next=f"ups why {ev.view.run_id} again in a few seconds")
            return Verdict("busy", f"{q.record.label} waits for its DataLoader {w.record.label}, busy starting ({doing}), "
                                   f"no progress for {quiet_for(ev, q):.0f} s", ok=True, who=who_of(w.record),
                           where=where_of(ev, w.record), since=max(q.record.progress_at, q.record.phase_at),
                           evidence=[q.verdict.reason, f"{w.record.label}: {doing}, no sample fetched yet"],
                           next=f"nothing to do: its worker is working; ups status {ev.view.run_id}")
    r = p.record
    state, doing = ev.doing(p)
    if state == "busy":  # no progress, but working: long is not stuck
        where = where_of(ev, r)
        return Verdict("busy", f"{r.label} is busy {doing} in phase {r.phase}"
                               + (f" at {where['site']}" if where.get("site") else "")
                               + f", no progress for {quiet_for(ev, p):.0f} s", ok=True, who=who_of(r), where=where,
                       since=max(r.progress_at, r.phase_at), evidence=[p.verdict.reason],
                       next=f"nothing to do: {r.label} is working; ups status {ev.view.run_id}")
    section = ev.stack(r)
    peers = [q for q in ev.processes("rank") if q is not p and q.record.state == "running"
             and q.verdict.health not in (Health.STALLED, Health.UNRESPONSIVE)]
    many = len(ev.processes("rank")) > 1
    if r.role == "rank" and many and (section is None or (peers and (in_backward(ev, p) or r.collective))):
        # A rank of a multi-rank run that stopped while its peers have not (yet): waiting for a
        # peer (DDP's all-reduce in backward, a collective) or stuck itself; its stack and its
        # peers' next seconds decide. Blame no one before that.
        what = "waits in DDP's gradient all-reduce (backward)" if section is not None and in_backward(ev, p) else (
            f"waits in {r.collective['op']}" if r.collective else "has no stack dump yet")
        # A peer within its own limit (a long phase, or limits not learned yet) that has made no
        # progress either, outside any collective, is the one this rank waits for: busy (an
        # upload through curl, a save) or being checked, said as such rather than "settling".
        quiet = [q for q in peers if not q.record.collective and quiet_for(ev, q) >= PAUSE_SAID_AFTER_S]
        for q in quiet:
            pause = waited_for(ev, q, [p], "DDP's gradient all-reduce (backward)" if section is not None
                               and in_backward(ev, p) else (r.collective or {}).get("op"))
            if pause is not None:
                return pause
        others = f" ({label_list(peers)} not in trouble yet)" if peers else ""
        return Verdict("settling", f"{r.label} has made no progress for {quiet_for(ev, p):.0f} s in phase {r.phase} and "
                                   f"{what}; settling…{others}",
                       since=max(r.progress_at, r.phase_at),
                       evidence=[p.verdict.reason], next=f"ups stacks {ev.view.run_id} --group")
    if state == "checking" and p.verdict.health is Health.STALLED:
        return Verdict("waiting", f"{r.label} has made no progress for {quiet_for(ev, p):.0f} s in phase {r.phase}; "
                                  "checking whether it is working", ok=True, since=max(r.progress_at, r.phase_at),
                       evidence=[p.verdict.reason], next=f"ups why {ev.view.run_id} again in a few seconds")
    facts = ev.proc(r)
    ev_lines = [p.verdict.reason] + ([f"kernel: {facts.describe()}"] if facts and facts.describe() else [])
    if state in ("idle", "unsure") and doing:
        ev_lines.append(f"launcher: {state}: {doing}")
    others = [q for q in troubled if q is not p]
    if others:
        ev_lines.append(f"also {', '.join(q.record.label for q in others[:4])}")
    opt = f" --rank {r.rank}" if r.role == "rank" else (f" --rank {r.rank or 0} --worker {r.worker}" if r.role == "worker" else "")
    return Verdict(p.verdict.health.value, f"{r.label} is {p.verdict.health.value} in phase {r.phase}",
                   who=who_of(r), where=where_of(ev, r, section), since=max(r.progress_at, r.phase_at), evidence=ev_lines,
                   next=f"ups stacks {ev.view.run_id}{opt}")


def healthy(ev: Evidence) -> Verdict:
    view = ev.view
    step, total = view.progress
    starting = [p for p in view.processes if p.verdict.health is Health.STARTING and p.record.role != "launcher"]
    if not [p for p in view.processes if p.record.role != "launcher"] or (starting and not step):
        return Verdict("starting", f"nothing wrong yet: the run is starting ({len(view.processes)} process record(s))", ok=True,
                       next=f"ups status {view.run_id}")
    rate = f", {view.rate:.3g} {view.unit}/s" if view.rate else ""
    return Verdict("healthy", f"nothing: healthy, {len(view.processes)} processes, {step}" + (f"/{total}" if total else "")
                   + f" {view.unit}{rate}", ok=True, next=f"ups status {view.run_id}")
