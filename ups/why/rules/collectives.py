"""Collectives: ranks in different collectives (one-sided, mismatched), a rank outside any
collective while its peers wait in one (the one they wait for), DDP's gradient all-reduce in
backward, and ranks that died because the backend timed a collective out or saw a mismatch."""

from __future__ import annotations

import re

from ups.runs.view import ProcessView
from ups.status.health import Health
from ups.status.record import StatusRecord
from ups.why.evidence import Evidence
from ups.why.rules.common import (
    ended_at,
    first_line,
    grep_lines,
    in_backward,
    label_list,
    waits,
    where_of,
)
from ups.why.rules.pauses import waited_for
from ups.why.rules.workers import waits_on_worker, worker_verdict
from ups.why.verdict import Verdict, who_of

# A collective that never completed, ended by the backend's timeout: gloo's own words, and
# NCCL's watchdog (10 min by default), which aborts the process (SIGABRT) after saying so.
COLLECTIVE_TIMEOUT = re.compile(r"Timed out waiting \d+ms for (?:send|recv)|Watchdog caught collective operation timeout|"
                                r"collective operation timeout|WorkNCCL\(SeqNum=", re.I)
# The backend saying that ranks entered different collectives: gloo's size check (it aborts the
# process that received the wrong size), TORCH_DISTRIBUTED_DEBUG=DETAIL's fingerprint check,
# and NCCL's desync report / flight recorder.
MISMATCH = re.compile(r"Is there a distributed collective mismatch|Detected mismatch between collectives|"
                      r"doesn't match expected size|Collective sequence number mismatch|collective mismatch|"
                      r"Desync debugging|desync report|mismatched collectives?|ranks? \d+ (?:is|are) running collective", re.I)
FINGERPRINT = re.compile(r"Rank (?P<rank>\d+) is running (?:inconsistent )?collective: CollectiveFingerPrint\((?P<fp>[^)]*)\)")
PROBLEMS = (Health.STALLED, Health.UNRESPONSIVE, Health.DEAD, Health.FAILED)


def collective_timeout(ev: Evidence, record: StatusRecord, text: str) -> Verdict | None:
    """Ranks that died because the backend timed a collective out. Which side times out first
    is a race (the rank in the one-sided call, or a peer waiting elsewhere, which then sees
    "connection closed by peer"), so every rank's record is read: the one that died inside a
    collective its peers were not in is named."""
    ranks = [p for p in ev.processes("rank") if p.record.is_final or p.verdict.health is Health.DEAD]
    texts = [text] + [p.record.error or "" for p in ranks]
    if not any(COLLECTIVE_TIMEOUT.search(t) for t in texts):
        return None
    inside = [p for p in ranks if p.record.collective]
    if not inside:
        return None
    keys = {(p.record.collective["op"], p.record.collective["seq"]) for p in inside}
    line = next((ln for t in texts for ln in grep_lines(t, COLLECTIVE_TIMEOUT, 1)), "")
    outside = [p for p in ev.processes("rank") if not p.record.collective]
    if len(keys) == 1 and not outside:
        r = inside[0].record
        c = r.collective
        return Verdict("collective_timeout",
                       f"every rank timed out together in {c['op']} #{c['seq']} at {c.get('site')}: no rank was missing, "
                       "so the transport failed (network, NCCL) or a rank outside this view left",
                       who=who_of(r), where={"phase": r.phase, "site": c.get("site"), "function": c["op"], "frame": None},
                       since=ended_at(ev, r), evidence=[first_line(line)],
                       next=f"ups logs {ev.view.run_id} (then NCCL_DEBUG=INFO on a relaunch)")
    odd = inside if outside else _odd_ones(inside)
    o = sorted(odd, key=lambda p: p.record.rank or 0)[0].record
    c = o.collective
    peers = [p for p in ev.processes("rank") if p not in odd]

    def doing(p: ProcessView) -> str:
        r = p.record
        if r.collective:
            return f"{r.label} was in {r.collective['op']} #{r.collective['seq']} at {r.collective.get('site')}"
        if in_backward(ev, p, "exception") or in_backward(ev, p):
            return f"{r.label} was in DDP's gradient all-reduce (backward)"
        return f"{r.label} was in no collective (phase {r.phase})"

    return Verdict("one_sided_collective",
                   f"one-sided collective: {o.label} timed out in {c['op']} #{c['seq']}, never entered by "
                   f"{label_list(peers) if peers else 'its peers'}",
                   who=who_of(o), where={"phase": o.phase, "site": c.get("site"), "function": c["op"], "frame": None},
                   since=c.get("since"), evidence=[first_line(line)] + [doing(p) for p in peers[:4]] + _prev(c),
                   next=f"fix the call at {c.get('site')}: every rank must make the same collectives in the same order "
                        "(an error path that skips a step tells the others with a flag all-reduced by every rank)")


def _collective_of(ev: Evidence, p: ProcessView) -> tuple[str, str | None] | None:
    """The explicit collective a rank was in when it ended or stopped (op, the program's own call
    site): its record's, else the one its last stack (fatal report, dump) is inside."""
    r = p.record
    if r.collective:
        return r.collective["op"], r.collective.get("site")
    for kind in ("fatal", "exception", None):
        section = ev.stack(r, kind)
        if section is None:
            continue
        op = next((f.function for f in section.stack if "distributed" in f.file and f.function in _COLLECTIVE_OPS), None)
        if op is not None:
            own = section.own_frame
            return op, own.site if own else None
    return None


_COLLECTIVE_OPS = frozenset(("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "all_to_all",
                             "all_to_all_single", "barrier", "broadcast", "broadcast_object_list", "gather", "gather_object",
                             "monitored_barrier", "recv", "reduce", "reduce_scatter", "reduce_scatter_tensor", "scatter",
                             "scatter_object_list", "send"))


def collective_mismatch(ev: Evidence, record: StatusRecord, text: str) -> Verdict | None:
    """The backend said the ranks entered different collectives. The rank it aborted is the one
    that noticed, not always the odd one: every rank's collective is read (record, fatal stack,
    the backend's own fingerprints). One rank in a collective its peers never entered is named
    (one-sided); different collectives on both sides are shown side by side (mismatched)."""
    texts = [text] + [p.record.error or "" for p in ev.processes("rank")]
    for p in ev.processes("rank"):
        if p.record.rank is not None and p.record.rank != record.rank:
            texts.append(ev.rank_log(p.record.rank)[-20_000:])
    line = next((ln.strip() for t in texts for ln in reversed(t.splitlines()) if MISMATCH.search(ln)), "")
    if not line:
        return None
    if "enforce fail" in line and "]" in line:  # gloo's: the words after its source location
        line = "gloo: " + line[line.index("]", line.index("enforce fail")) + 1 :].strip()
    m = MISMATCH.search(line)
    if len(line) > 200 and m:  # keep the backend's own words about the mismatch
        line = "…" + line[max(0, m.end() - 190) :]
    ranks = sorted(ev.processes("rank"), key=lambda p: p.record.rank or 0)
    colls = {p.record.rank: _collective_of(ev, p) for p in ranks}
    for t in texts:  # TORCH_DISTRIBUTED_DEBUG=DETAIL names each side's op
        for m in FINGERPRINT.finditer(t):
            op = re.search(r"OpType=(\w+)", m["fp"])
            if op and colls.get(int(m["rank"])) is None:
                colls[int(m["rank"])] = (op.group(1).lower(), None)
    inside = [p for p in ranks if colls.get(p.record.rank)]
    if not inside:
        return None
    run = ev.view.run_id
    fix = ("every rank must make the same collectives in the same order (an error path that skips a step tells the "
           "others with a flag all-reduced by every rank)")

    def doing(p: ProcessView) -> str:
        c = colls.get(p.record.rank)
        if c:
            return f"{p.record.label} was in {c[0]} at {c[1] or '?'}"
        if in_backward(ev, p, "fatal") or in_backward(ev, p):
            return f"{p.record.label} was in DDP's gradient all-reduce (backward)"
        return f"{p.record.label} was in no collective of its own (phase {p.record.phase}, step {p.record.step})"

    aborted = f"the backend aborted {record.label}" + (f" ({failure_signal})" if (failure_signal := _signal_of(ev, record)) else "")
    outside = [p for p in ranks if p not in inside]
    ops = {colls[p.record.rank] for p in inside}
    if outside or len(ops) == 1:
        odd = inside if outside else []
        if odd:
            o = odd[0].record
            op, site = colls[o.rank]
            return Verdict("one_sided_collective",
                           f"one-sided collective: {o.label} entered {op} at {site or '?'}, never entered by "
                           f"{label_list(outside)}; {aborted}: a collective mismatch",
                           who=who_of(o), where={"phase": f"collective:{op}", "site": site, "function": op, "frame": None},
                           since=ended_at(ev, o), evidence=[first_line(line)] + [doing(p) for p in ranks],
                           next=f"fix the call at {site or 'that collective'}: {fix}")
    sides = "; ".join(doing(p) for p in ranks)
    first = inside[0].record
    op, site = colls[first.rank]
    return Verdict("collective_mismatch",
                   f"mismatched collectives: {sides}; {aborted}",
                   who=None, where={"phase": f"collective:{op}", "site": site, "function": op, "frame": None},
                   since=ended_at(ev, record), evidence=[first_line(line)],
                   next=f"ups stacks {run} --group (then fix the calls: {fix})")


def _signal_of(ev: Evidence, record: StatusRecord) -> str | None:
    failure = ev.manifest.get("failure") or {}
    if failure.get("rank") == record.rank and failure.get("signal"):
        return failure["signal"]
    ex = ev.exits.get(record.name)
    return getattr(ex, "signal", None) if ex else None


def collectives(ev: Evidence) -> Verdict | None:
    ranks = [p for p in ev.processes("rank") if p.record.state == "running"]
    inside = [p for p in ranks if p.record.collective]
    if len(ranks) < 2 or not inside or not any(p.verdict.health in (Health.STALLED, Health.UNRESPONSIVE) for p in ranks):
        return None
    colls = {p.record.rank: p.record.collective for p in inside}
    keys = {(c["op"], c["seq"]) for c in colls.values()}
    run = ev.view.run_id
    in_ddp = [p for p in ranks if not p.record.collective and in_backward(ev, p)]
    if in_ddp and len(in_ddp) + len(inside) == len(ranks):
        # The peers sit in DDP's gradient all-reduce (C++, inside backward), the normal path of
        # every step; the ranks in a collective of their own are the ones out of step.
        o = sorted(inside, key=lambda p: p.record.rank or 0)[0].record
        c = o.collective
        return Verdict("one_sided_collective",
                       f"one-sided collective: {o.label} is in {c['op']} #{c['seq']}, never entered by "
                       f"{label_list(in_ddp)}: {'they wait' if len(in_ddp) > 1 else 'it waits'} in DDP's gradient "
                       "all-reduce (backward); every rank waits",
                       who=who_of(o), where={"phase": o.phase, "site": c.get("site"), "function": c["op"], "frame": None},
                       since=c.get("since"),
                       evidence=[f"{label_list(inside)}: {c['op']} #{c['seq']} at {c.get('site')}",
                                 f"{label_list(in_ddp)}: in loss.backward() (DDP all-reduces gradients there)"] + _prev(c),
                       next=f"ups stacks {run} --group (then fix the call at {c.get('site')}: every rank must make the same "
                            "collectives in the same order; an error path that skips a step must tell the others with a "
                            "flag all-reduced by every rank)")
    if len(keys) > 1 and _is_tie(inside):
        sides = "; ".join(f"{p.record.label} is in {p.record.collective['op']} #{p.record.collective['seq']} at "
                          f"{p.record.collective.get('site')}" for p in sorted(inside, key=lambda p: p.record.rank or 0))
        first = sorted(inside, key=lambda p: p.record.rank or 0)[0].record
        c = first.collective
        return Verdict("collective_mismatch", f"mismatched collectives: {sides}; every rank waits",
                       who=None, where={"phase": first.phase, "site": c.get("site"), "function": c["op"], "frame": None},
                       since=min(p.record.collective.get("since") or 0 for p in inside) or None,
                       evidence=[f"{p.record.label}: {p.verdict.reason}" for p in inside[:4]],
                       next=f"ups stacks {run} --group (then fix the calls: every rank must make the same collectives "
                            "in the same order)")
    if len(keys) > 1:
        odd = _odd_ones(inside)
        common = [p for p in inside if p not in odd]
        o = odd[0].record
        c = o.collective
        groups = "; ".join(f"{label_list([p for p in inside if (p.record.collective['op'], p.record.collective['seq']) == k])}: "
                           f"{k[0]} #{k[1]} at {next(p.record.collective['site'] for p in inside if (p.record.collective['op'], p.record.collective['seq']) == k)}"
                           for k in sorted(keys, key=str))
        peers = label_list(common) if common else "its peers"
        what = "never entered by" if all(p.record.collective["op"] != c["op"] for p in common) else "mismatched with"
        return Verdict("one_sided_collective",
                       f"one-sided collective: {o.label} is in {c['op']} #{c['seq']}, {what} {peers}; every rank waits",
                       who=who_of(o), where={"phase": o.phase, "site": c.get("site"), "function": c["op"], "frame": None},
                       since=c.get("since"), evidence=[f"in collectives now: {groups}"] + _prev(c),
                       next=f"ups stacks {run} --group (then fix the call at {c.get('site')}: every rank must make the same collectives in the same order)")
    outside = [p for p in ranks if not p.record.collective]
    if outside:
        waiting = sorted(inside, key=lambda p: p.record.rank or 0)
        c = waiting[0].record.collective
        stuck = sorted(outside, key=lambda p: (p.verdict.health not in PROBLEMS, p.record.rank or 0))[0]
        worker = waits_on_worker(ev, stuck)
        if worker is not None:
            return worker_verdict(ev, worker, waiting)
        pause = waited_for(ev, stuck, waiting, c["op"])
        if pause is not None:  # busy (a checkpoint, an evaluation, an upload), or being checked
            return pause
        r = stuck.record
        section = ev.stack(r)
        if section is None:
            # Its stack decides: DDP's gradient all-reduce (backward: the one-sided call is the
            # peers') or its own code (it is the one they wait for). Blame no one before it comes.
            return Verdict("settling", f"{waits(waiting)} in {c['op']} #{c['seq']} at {c.get('site')}; {r.label} is in no "
                           "explicit collective; settling… (its stack dump tells whether it waits in DDP's all-reduce or is "
                           "stuck in its own code)", since=c.get("since"),
                           evidence=[f"{r.label}: {stuck.verdict.reason}"], next=f"ups stacks {run} --group")
        where = where_of(ev, r, section)
        ev_lines = [f"{waits(waiting)} in {c['op']} #{c['seq']} at {c.get('site')}",
                    f"{r.label} is in no collective: {stuck.verdict.reason}"]
        if section is None:
            ev_lines.append("no stack dump of it yet")
        return Verdict("rank_stuck_peers_wait",
                       f"{r.label} is stuck in its own code while {waits(waiting)} for it in {c['op']}",
                       who=who_of(r), where=where, since=max(r.progress_at, r.phase_at), evidence=ev_lines,
                       next=f"ups stacks {run} --rank {r.rank}" if section is None else f"ups kill {run}  (after fixing {where.get('site') or 'the loop'})")
    return None


def _is_tie(inside: list[ProcessView]) -> bool:
    """Different collectives in groups of one size, and no group alone in having changed its op
    from the previous one: nothing tells which side is out of step."""
    by_key: dict[tuple, list[ProcessView]] = {}
    for p in inside:
        by_key.setdefault((p.record.collective["op"], p.record.collective["seq"]), []).append(p)
    if len({len(v) for v in by_key.values()}) > 1:
        return False
    changed = [p for p in inside if p.record.collective.get("prev_op") not in (None, p.record.collective["op"])]
    return not changed or len(changed) == len(inside)


def _odd_ones(inside: list[ProcessView]) -> list[ProcessView]:
    """The ranks whose collective differs: the minority; on a tie, the ranks whose op changed
    from their previous one while their peers' did not (an error path's extra call)."""
    by_key: dict[tuple, list[ProcessView]] = {}
    for p in inside:
        by_key.setdefault((p.record.collective["op"], p.record.collective["seq"]), []).append(p)
    sizes = sorted({len(v) for v in by_key.values()})
    smallest = [p for v in by_key.values() if len(v) == sizes[0] for p in v]
    if len(sizes) > 1:
        return smallest
    changed = [p for p in inside if p.record.collective.get("prev_op") not in (None, p.record.collective["op"])]
    return changed or sorted(inside, key=lambda p: -(p.record.collective["seq"]))[:1]


def _prev(c: dict) -> list[str]:
    if c.get("prev_op") and c["prev_op"] != c["op"]:
        return [f"its previous collective was {c['prev_op']} at {c.get('prev_site')}"]
    return []


def ddp_backward(ev: Evidence) -> Verdict | None:
    """DDP's gradient all-reduce runs in C++: peers waiting for a stuck rank sit in backward."""
    ranks = [p for p in ev.processes("rank") if p.record.state == "running" and p.verdict.health in (Health.STALLED, Health.UNRESPONSIVE)]
    if len(ranks) < 2:
        return None
    backward, elsewhere = [], []
    for p in ranks:
        (backward if in_backward(ev, p) else elsewhere).append(p)
    if not backward or len(elsewhere) != 1:
        return None
    worker = waits_on_worker(ev, elsewhere[0])
    if worker is not None:  # the rank is not stuck in its own code: it waits for its worker
        return worker_verdict(ev, worker, backward)
    pause = waited_for(ev, elsewhere[0], backward, "DDP's gradient all-reduce (backward)")
    if pause is not None:
        return pause
    r = elsewhere[0].record
    where = where_of(ev, r)
    return Verdict("rank_stuck_peers_wait",
                   f"{r.label} is stuck in its own code while {waits(backward)} for it in backward "
                   "(DDP's gradient all-reduce)", who=who_of(r), where=where, since=max(r.progress_at, r.phase_at),
                   evidence=[f"{r.label}: {elsewhere[0].verdict.reason}", f"{label_list(backward)}: in loss.backward()"],
                   next=f"ups stacks {ev.view.run_id} --group")
