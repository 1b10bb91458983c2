"""Collectives: ranks in different collectives (one-sided, mismatched), a rank outside any
collective while its peers wait in one (the one they wait for), DDP's gradient all-reduce in
backward, and ranks that died because the backend timed a collective out or saw a mismatch."""

from __future__ import annotations

import re

from ups.runs.view import ProcessView
from ups.status.health import Health
from ups.status.record import StatusRecord
from ups.status.vocabulary import COLLECTIVE_OPS
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


def op_text(c: dict) -> str:
    """A collective's op in words: ``all_gather_single (FSDP unshard of layers.3)``,
    ``send to rank 1 (pipelining fwd_send)``."""
    op = c["op"]
    peer = c.get("peer")
    if isinstance(peer, int):
        op = f"{op} {'to' if 'send' in op else 'from'} rank {peer}"
    context = c.get("context")
    return f"{op} ({context})" if context else op


def group_text(c: dict) -> str | None:
    """The group of a collective when it is not the whole world: ``mesh dim 'tp' [0, 1]``,
    ``group 1 [0, 1]``; None for the default group or a record that does not say."""
    desc, name, ranks = c.get("group_desc"), c.get("group"), c.get("ranks")
    members = f" [{', '.join(str(r) for r in ranks)}]" if ranks else ""
    if isinstance(desc, str) and desc.startswith("mesh_"):
        return f"mesh dim '{desc[5:]}'{members}"
    if name is None or desc == "default_pg":
        return None
    return f"group {name}{members}"


SEEN_FROM_OUTSIDE = "seen from outside by py-spy"
"""The context of a collective an attached run's observer read from a stack (ups.attach): its
op and call site are known, its sequence number is not."""


def coll_text(c: dict, *, site: bool = True) -> str:
    """``all_gather_single (FSDP unshard of root) #76 on mesh dim 'dp' [1, 3] at train.py:142``."""
    text = op_text(c) if c.get("context") == SEEN_FROM_OUTSIDE else f"{op_text(c)} #{c['seq']}"
    group = group_text(c)
    if group:
        text += f" on {group}"
    return text + (f" at {c.get('site')}" if site else "")


def _members(c: dict) -> set[int] | None:
    """The global ranks a collective waits for: its p2p peer, its group's ranks; None: every rank."""
    if isinstance(c.get("peer"), int):
        return {c["peer"]}
    ranks = c.get("ranks")
    return set(ranks) if ranks else None


def _same(a: dict, b: dict, rank_a: int | None, rank_b: int | None) -> bool:
    """Whether two ranks are in the same collective (p2p: the two ends of one send/recv)."""
    if a.get("group") != b.get("group"):
        return False
    if isinstance(a.get("peer"), int) or isinstance(b.get("peer"), int):
        return (a.get("peer") == rank_b and b.get("peer") == rank_a and a["seq"] == b["seq"]
                and ("send" in a["op"]) != ("send" in b["op"]))
    return (a["op"], a["seq"]) == (b["op"], b["seq"])


def _waits_for(p: ProcessView, q: ProcessView) -> bool:
    """Whether rank ``p``, in a collective, waits for rank ``q`` (a member of its group or its
    peer, not in the same collective)."""
    c = p.record.collective
    members = _members(c)
    if q is p or (members is not None and q.record.rank not in members):
        return False
    d = q.record.collective
    return not d or not _same(c, d, p.record.rank, q.record.rank)


def _conflicts(inside: list[ProcessView]) -> list[ProcessView]:
    """Ranks in different collectives of one group, or waiting for each other in a cycle: the
    sides of a one-sided or mismatched collective. (A rank in another group's collective that
    waits for someone else is no side: on a 2-D mesh it waits in its own dimension.)"""
    found: list[ProcessView] = []
    for p in inside:
        for q in inside:
            if q is not p and q.record.collective and _waits_for(p, q) and (
                    p.record.collective.get("group") == q.record.collective.get("group") or _waits_for(q, p)):
                found += [x for x in (p, q) if x not in found]
    return sorted(found, key=lambda p: p.record.rank or 0)


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
        return op_text(r.collective), r.collective.get("site")
    for kind in ("fatal", "exception", None):
        section = ev.stack(r, kind)
        if section is None:
            continue
        op = next((f.function for f in section.stack if "distributed" in f.file and f.function in COLLECTIVE_OPS), None)
        if op is not None:
            own = section.own_frame
            return op, own.site if own else None
    return None


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
    # The records say which call sites a rank used before (``new``): the side that is not a
    # known, repeated call is the odd one (its record, or only its fatal stack, tells its call).
    known = [p for p in inside if (p.record.collective or {}).get("new") is False]
    fresh = [p for p in inside if p not in known]
    if not outside and len(ops) > 1 and known and len(fresh) == 1:
        o = fresh[0].record
        op, site = colls[o.rank]
        return Verdict("one_sided_collective",
                       f"one-sided collective: {o.label} entered {op} at {site or '?'}, a call it never made before, "
                       f"while {label_list(known)} {'were' if len(known) > 1 else 'was'} in "
                       f"{colls[known[0].record.rank][0]}; {aborted}: a collective mismatch",
                       who=who_of(o), where={"phase": f"collective:{op}", "site": site, "function": op, "frame": None},
                       since=ended_at(ev, o), evidence=[first_line(line)] + [doing(p) for p in ranks],
                       next=f"fix the call at {site or 'that collective'}: {fix}")
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
    sides = _conflicts(inside)
    if sides and _is_tie(sides):
        text = "; ".join(f"{p.record.label} is in {coll_text(p.record.collective)}" for p in sides)
        first = sides[0].record
        c = first.collective
        return Verdict("collective_mismatch", f"mismatched collectives: {text}; every rank waits",
                       who=None, where={"phase": first.phase, "site": c.get("site"), "function": c["op"], "frame": None},
                       since=min(p.record.collective.get("since") or 0 for p in sides) or None,
                       evidence=[f"{p.record.label}: {p.verdict.reason}" for p in sides[:4]],
                       next=f"ups stacks {run} --group (then fix the calls: every rank must make the same collectives "
                            "in the same order)")
    if sides:
        odd = _odd_ones(sides)
        common = [p for p in sides if p not in odd]
        o = odd[0].record
        c = o.collective
        keys = {}
        for p in sides:
            keys.setdefault(coll_text(p.record.collective), []).append(p)
        groups = "; ".join(f"{label_list(v)}: {k}" for k, v in sorted(keys.items(), key=lambda kv: kv[1][0].record.rank or 0))
        peers = label_list(common) if common else "its peers"
        what = "never entered by" if all(p.record.collective["op"] != c["op"] for p in common) else "mismatched with"
        new = ([f"{o.label}'s call at {c.get('site')} is one it never made before; its peers' are not"]
               if c.get("new") and not any(p.record.collective.get("new") for p in common) else [])
        return Verdict("one_sided_collective",
                       f"one-sided collective: {o.label} is in {coll_text(c, site=False)}, {what} {peers}; every rank waits",
                       who=who_of(o), where={"phase": o.phase, "site": c.get("site"), "function": c["op"], "frame": None},
                       since=c.get("since"), evidence=[f"in collectives now: {groups}"] + new + _prev(c),
                       next=f"ups stacks {run} --group (then fix the call at {c.get('site')}: every rank must make the same collectives in the same order)")
    outside = [p for p in ranks if not p.record.collective]
    awaited = [p for p in outside if any(_waits_for(w, p) for w in inside)]
    if awaited:
        stuck = sorted(awaited, key=lambda p: (p.verdict.health not in PROBLEMS, p.record.rank or 0))[0]
        waiting = sorted((p for p in inside if _waits_for(p, stuck)), key=lambda p: p.record.rank or 0)
        through = [p for p in sorted(inside, key=lambda p: p.record.rank or 0) if p not in waiting]
        c = waiting[0].record.collective
        worker = waits_on_worker(ev, stuck)
        if worker is not None:
            return worker_verdict(ev, worker, waiting)
        pause = waited_for(ev, stuck, waiting, op_text(c))
        if pause is not None:  # busy (a checkpoint, an evaluation, an upload), or being checked
            return pause
        r = stuck.record
        section = ev.stack(r)
        if section is None:
            # Its stack decides: DDP's gradient all-reduce (backward: the one-sided call is the
            # peers') or its own code (it is the one they wait for). Blame no one before it comes.
            return Verdict("settling", f"{waits(waiting)} in {coll_text(c)}; {r.label} is in no "
                           "explicit collective; settling… (its stack dump tells whether it waits in DDP's all-reduce or is "
                           "stuck in its own code)", since=c.get("since"),
                           evidence=[f"{r.label}: {stuck.verdict.reason}"], next=f"ups stacks {run} --group")
        where = where_of(ev, r, section)
        ev_lines = [f"{p.record.label} waits in {coll_text(p.record.collective)}" for p in waiting[:4]]
        if through:
            ev_lines.append("waiting through them: " + "; ".join(f"{p.record.label} in {coll_text(p.record.collective)}"
                                                                 for p in through[:4]))
        ev_lines.append(f"{r.label} is in no collective: {stuck.verdict.reason}")
        return Verdict("rank_stuck_peers_wait", f"{r.label} is stuck in its own code while {_waiting_in(waiting)}",
                       who=who_of(r), where=where, since=max(r.progress_at, r.phase_at), evidence=ev_lines,
                       next=f"ups kill {run}  (after fixing {where.get('site') or 'the loop'})")
    return None


def _waiting_in(waiting: list[ProcessView]) -> str:
    """``rank 0 waits for it in all_reduce (TP …) on mesh dim 'tp' [0, 1] and rank 3 in
    all_gather_single on mesh dim 'dp' [1, 3]``: the waiters by what they wait in."""
    by: dict[str, list[ProcessView]] = {}
    for p in waiting:
        c = p.record.collective
        group = group_text(c)
        by.setdefault(op_text(c) + (f" on {group}" if group else ""), []).append(p)
    parts = list(by.items())
    first = f"{waits(parts[0][1])} for it in {parts[0][0]}"
    return first + "".join(f" and {label_list(v)} in {k}" for k, v in parts[1:3])


def _is_tie(inside: list[ProcessView]) -> bool:
    """Different collectives in groups of one size, and no group alone in having changed its op
    from the previous one: nothing tells which side is out of step."""
    news = [p for p in inside if p.record.collective.get("new")]
    if news and len(news) < len(inside):
        return False  # a call site never used before is the odd one
    by_key: dict[tuple, list[ProcessView]] = {}
    for p in inside:
        by_key.setdefault((p.record.collective["op"], p.record.collective["seq"]), []).append(p)
    if len({len(v) for v in by_key.values()}) > 1:
        return False
    changed = [p for p in inside if p.record.collective.get("prev_op") not in (None, p.record.collective["op"])]
    return not changed or len(changed) == len(inside)


def _odd_ones(inside: list[ProcessView]) -> list[ProcessView]:
    """The ranks whose collective differs: the minority; on a tie, the ranks whose op changed
    from their previous one while their peers' did not (an error path's extra call). Before
    both: the ranks whose call site is one they never used before (the record's ``new``)."""
    news = [p for p in inside if p.record.collective.get("new")]
    if news and len(news) < len(inside):
        return news
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
