"""Verdicts on what the training did, not on its processes: each names the first rank and step.

* ``loss_nonfinite``: the loss became NaN or infinite (the capture in ups.instrument.metrics
  checks every loss it reads, so the step is the first one, not the first one sampled); named
  only once every live peer's record has read its losses up to that step (see :func:`_unsettled`);
* ``loss_diverged``: the loss jumped to more than :data:`DIVERGE_K` times its recent range
  above its recent maximum (and at least twice that maximum);
* ``step_rate_dropped``: the step rate fell below :data:`RATE_DROP` of what it was, on one
  rank while its peers keep theirs, or on every rank after the same step;
* ``gpu_memory_leak``: CUDA memory allocated grows step over step (never down for the last
  :data:`LEAK_POINTS` points or more, up in most of them, by more than :data:`LEAK_MIN_GROWTH`); the step at which it runs out is estimated from
  the device's total memory when the record has it.

They read the records' metrics and the bounded series (``metrics/<name>.json``, read once by
the evidence: :attr:`~ups.why.evidence.Evidence.series`). The table in :mod:`ups.why.rules`
asks :func:`ended_training` and :func:`live_training`.
"""

from __future__ import annotations

import statistics

from ups.format import fmt_bytes
from ups.runs.view import ProcessView
from ups.status.series import metric_values, points
from ups.why.evidence import Evidence
from ups.why.rules.common import label_list
from ups.why.verdict import Verdict, who_of

DIVERGE_K = 10.0
DIVERGE_WINDOW = 20
RATE_DROP = 0.4
RATE_BASELINE = 10
RATE_RECENT = 5
RATE_DROP_FOR_S = 15.0  # low for at least this long (the rate is a 10 s window: an eval dips it)
LEAK_POINTS = 12
LEAK_MIN_GROWTH = 0.05
LEAK_RISING = 0.6  # share of intervals of the climb in which memory rose (allocator plateaus allowed)
NONFINITE_SETTLE_S = 10.0  # the longest a NaN verdict waits for a peer that may have gone NaN first
MODES = ("loss_nonfinite", "loss_diverged", "step_rate_dropped", "gpu_memory_leak")


def _ranks(ev: Evidence) -> list[ProcessView]:
    return sorted(ev.processes("rank"), key=lambda p: p.record.rank or 0)


def _series(ev: Evidence, p: ProcessView) -> dict | None:
    return ev.series.get(p.record.name)


def _next(ev: Evidence, p: ProcessView) -> str:
    return f"ups plot {ev.view.run_id} --rank {p.record.rank or 0}"


def _unsettled(ev: Evidence, step: int, at: float, reported: set[str]) -> bool:
    """Whether a live peer rank may still report a non-finite loss at a step before ``step``.

    Each rank writes its record on its own heartbeat, so the first rank to *say* NaN is often
    not the first to *be* NaN: the rank whose NaN poisoned the all-reduce goes first, but its
    victims can write sooner. A peer has settled once its record's last read loss is at
    ``step`` or later (losses are read in order and a non-finite one is kept), once it has
    ended or stopped beating, or after :data:`NONFINITE_SETTLE_S` since the candidate was seen.
    """
    if isinstance(at, int | float) and at and ev.now - at > NONFINITE_SETTLE_S:
        return False
    for q in _ranks(ev):
        r = q.record
        if r.name in reported or r.is_final or q.heartbeat_age > NONFINITE_SETTLE_S:
            continue
        seen = r.metrics.get("loss_step")
        if not isinstance(seen, int) or seen < step:
            return True
    return False


def loss_nonfinite(ev: Evidence) -> Verdict | None:
    """The first rank, by step then time, whose loss was NaN or infinite."""
    found = []
    for p in _ranks(ev):
        info = p.record.metrics.get("loss_nonfinite")
        if not isinstance(info, dict):
            data = _series(ev, p)
            info = data.get("first_nonfinite") if data else None
        if isinstance(info, dict) and isinstance(info.get("step"), int):
            found.append((info["step"], info.get("at") or 0.0, p, info))
    if not found:
        return None
    found.sort(key=lambda f: (f[0], f[1]))
    step, at, p, info = found[0]
    if _unsettled(ev, step, at, {q.record.name for _, _, q, _ in found}):
        return None  # a peer may have gone non-finite earlier and not said so yet: never name the wrong one
    r = p.record
    tied = [q for s, _, q, _ in found if s == step]
    others = [f"{q.record.label} from step {s}" for s, _, q, _ in found[len(tied):len(tied) + 3]]
    value = info.get("value", "nan")
    if len(tied) > 1:
        # Several ranks at the same step: each made its own (the all-reduce that would carry one
        # rank's NaN to the others comes after that step's loss), so no rank is named before another.
        names = label_list(tied)
        return Verdict("loss_nonfinite", f"the loss became {value} on {names} at the same step {step}", who=None,
                       where={"phase": r.phase, "site": None, "function": None, "frame": None},
                       since=at if isinstance(at, int | float) and at else None,
                       evidence=[f"{names}: loss {value} at step {step}, the same step (the first non-finite loss of any rank)"]
                                + ([f"then {', '.join(others)}"] if others else []),
                       next=f"{_next(ev, p)}; look at the data and lr of step {step}: on every rank at once it is the "
                            "model or the lr, not one rank's batch")
    return Verdict("loss_nonfinite", f"the loss became {value} on {r.label} at step {step}", who=who_of(r),
                   where={"phase": r.phase, "site": None, "function": None, "frame": None},
                   since=at if isinstance(at, int | float) and at else None,
                   evidence=[f"{r.label}: loss {value} at step {step} (the first non-finite loss of any rank)"]
                            + ([f"then {', '.join(others)}"] if others else [])
                            + ["a NaN loss poisons the weights of every rank at the next gradient all-reduce"],
                   next=f"{_next(ev, p)}; look at the data and lr of step {step} (ups logs {ev.view.run_id} --rank {r.rank})")


def loss_diverged(ev: Evidence) -> Verdict | None:
    hits = []
    for p in _ranks(ev):
        data = _series(ev, p)
        if not data:
            continue
        values = [(s, v) for s, v in metric_values(data, "loss") if v == v and abs(v) != float("inf")]
        for i in range(DIVERGE_WINDOW, len(values)):
            window = [v for _, v in values[i - DIVERGE_WINDOW : i]]
            hi, lo = max(window), min(window)
            spread = max(hi - lo, abs(hi) * 1e-3, 1e-12)
            step, v = values[i]
            if v > hi + DIVERGE_K * spread and v > 2 * abs(hi):
                hits.append((step, p, v, lo, hi))
                break
    if not hits:
        return None
    step, p, v, lo, hi = min(hits, key=lambda h: h[0])
    r = p.record
    return Verdict("loss_diverged", f"the loss diverged on {r.label} at step {step}: {v:.4g} after {lo:.4g}-{hi:.4g}",
                   who=who_of(r), evidence=[f"a jump of more than {DIVERGE_K:g}x its recent range "
                                            f"(last {DIVERGE_WINDOW} points {lo:.4g}-{hi:.4g})"]
                                           + [f"also {q.record.label} at step {s}" for s, q, *_ in hits if q is not p][:3],
                   next=f"{_next(ev, p)}; lower the lr or clip gradients from step {step}")


def _rate_drop(data: dict) -> tuple[int, float, float] | None:
    """(step where it dropped, rate before, rate now) of one series, or None."""
    pts = [p for p in points(data) if p.get("rate") is not None and isinstance(p.get("step"), int)]
    if len(pts) < RATE_BASELINE + RATE_RECENT:
        return None
    recent = [p["rate"] for p in pts[-RATE_RECENT:]]
    base = statistics.median(p["rate"] for p in pts[:-RATE_RECENT][-4 * RATE_BASELINE:])
    now = statistics.median(recent)
    if base <= 0 or now >= RATE_DROP * base:
        return None
    # The step from which every point stays low.
    i = len(pts) - 1
    while i > 0 and pts[i - 1]["rate"] < RATE_DROP * base:
        i -= 1
    if (pts[-1].get("t") or 0) - (pts[i].get("t") or 0) < RATE_DROP_FOR_S:
        return None  # an eval or a checkpoint lowers the rate over its window for a while
    return pts[i]["step"], base, now


def step_rate_dropped(ev: Evidence) -> Verdict | None:
    ranks = [p for p in _ranks(ev) if p.record.state == "running"]
    drops = {}
    for p in ranks:
        data = _series(ev, p)
        d = _rate_drop(data) if data else None
        if d is not None:
            drops[p.record.name] = (p, d)
    if not drops:
        return None
    if len(drops) == len(ranks) and len(ranks) > 1:
        step = min(d[0] for _, d in drops.values())
        p, (_, base, now) = next(iter(drops.values()))
        return Verdict("step_rate_dropped", f"the step rate of every rank dropped after step {step}: "
                                            f"{base:.3g} -> {now:.3g} steps/s",
                       who=who_of(p.record), evidence=[f"{q.record.label}: {b:.3g} -> {n:.3g} steps/s from step {s}"
                                                       for q, (s, b, n) in list(drops.values())[:4]],
                       next=f"ups plot {ev.view.run_id} --metric rate; what changed at step {step} (data, eval, another job on the GPU?)")
    p, (step, base, now) = min(drops.values(), key=lambda x: x[1][0])
    r = p.record
    peers = [q for q in ranks if q.record.name not in drops]
    return Verdict("step_rate_dropped", f"{r.label} slowed down from step {step}: {base:.3g} -> {now:.3g} steps/s"
                   + (" while its peers keep their rate" if peers else ""),
                   who=who_of(r), evidence=[f"{r.label}: median {base:.3g} steps/s before step {step}, {now:.3g} since"],
                   next=f"ups plot {ev.view.run_id} --metric rate; check {r.host}'s GPU of {r.label} (ups gpu), its data")


def gpu_memory_leak(ev: Evidence) -> Verdict | None:
    hits = []
    for p in _ranks(ev):
        data = _series(ev, p)
        if not data or p.record.state != "running":
            continue
        pts = [q for q in points(data) if q.get("mem") is not None and isinstance(q.get("step"), int)]
        # The climb at the end: back while memory never went down, less a flat start.
        i = len(pts) - 1
        while i > 0 and pts[i - 1]["mem"] <= pts[i]["mem"]:
            i -= 1
        while i < len(pts) - 1 and pts[i + 1]["mem"] == pts[i]["mem"]:
            i += 1
        climb = pts[i:]
        if len(climb) < LEAK_POINTS:
            continue
        rises = sum(1 for a, b in zip(climb, climb[1:], strict=False) if b["mem"] > a["mem"])
        first, last = climb[0], climb[-1]
        steps = last["step"] - first["step"]
        if rises < LEAK_RISING * (len(climb) - 1) or steps <= 0 or (last["mem"] - first["mem"]) < LEAK_MIN_GROWTH * max(first["mem"], 1.0):
            continue
        per_step = (last["mem"] - first["mem"]) / steps
        hits.append((pts[i]["step"], p, per_step, last))
    if not hits:
        return None
    step, p, per_step, last = min(hits, key=lambda h: h[0])
    r = p.record
    total = r.metrics.get("gpu_total")
    out_at = ""
    if isinstance(total, int | float) and total > last["mem"] and per_step > 0:
        out_at = f"; at this pace it runs out of memory at about step {int(last['step'] + (total - last['mem']) / per_step)}"
    return Verdict("gpu_memory_leak", f"GPU memory of {r.label} climbs step over step since step {step} "
                                      f"(+{fmt_bytes(per_step)} per step, {fmt_bytes(last['mem'])} now){out_at}",
                   who=who_of(r), evidence=[f"{r.label}: allocated memory rose in most intervals since step {step}"]
                   + [f"also {q.record.label} from step {s}" for s, q, *_ in hits if q is not p][:3],
                   next=f"ups plot {ev.view.run_id} --metric mem; look for tensors kept across steps (a loss summed "
                        "without .item() or .detach(), a growing list)")


LIVE_RULES = (loss_nonfinite, loss_diverged, gpu_memory_leak, step_rate_dropped)


def training_verdict(ev: Evidence, *, live: bool = True) -> Verdict | None:
    """The first metric verdict of a run (for an ended run only NaN and divergence matter)."""
    rules = LIVE_RULES if live else (loss_nonfinite, loss_diverged)
    for rule in rules:
        verdict = rule(ev)
        if verdict is not None:
            return verdict
    return None


def live_training(ev: Evidence) -> Verdict | None:
    """A running run whose processes are well but whose training is not."""
    if ev.view.is_final:
        return None
    return training_verdict(ev)


def ended_training(ev: Evidence) -> Verdict | None:
    """A run that ended 'succeeded' with a NaN or diverged loss did not really succeed."""
    if not ev.view.is_final or ev.manifest.get("state") != "succeeded":
        return None
    verdict = training_verdict(ev, live=False)
    if verdict is not None:
        verdict.evidence.append(f"the run itself ended succeeded ({ev.manifest.get('summary') or 'exit 0'})")
    return verdict
