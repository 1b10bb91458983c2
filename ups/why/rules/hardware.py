"""The machine under the run: a GPU that reported a fault (Xid, ECC, a pending row remap), a
straggler whose GPU is throttled, a node of a multi-node run that was lost, the runs folder's
disk full, a run whose launcher is gone."""

from __future__ import annotations

from ups.status.health import Health
from ups.status.record import StatusRecord
from ups.why.evidence import Evidence
from ups.why.rules.common import ended_at, first_line, where_of
from ups.why.verdict import Verdict, who_of

# NVIDIA's Xid codes: which ones are the hardware's (drain the node) and which the program's own
# CUDA fault seen by the driver.
XID_MEANING = {13: ("graphics engine exception", False), 31: ("GPU memory page fault", False),
               43: ("GPU stopped processing", False), 48: ("double-bit ECC error", True),
               63: ("ECC page retirement or row remap recorded", True), 64: ("ECC page retirement or row remap failed", True),
               74: ("NVLink error", True), 79: ("GPU has fallen off the bus", True), 92: ("high single-bit ECC rate", True),
               94: ("contained ECC error", True), 95: ("uncontained ECC error", True)}


def gpu_fault(ev: Evidence, record: StatusRecord) -> Verdict | None:
    """The GPU a failed rank ran on reported a hardware fault (NVML: Xid events, uncorrected ECC,
    a row remap pending a reset): that is the cause, whatever CUDA error the rank raised."""
    d = ev.gpu_of(record)
    if d is None:
        return None
    hardware = [x for x in d.xid_errors if XID_MEANING.get(x, ("", True))[1]]
    program = [x for x in d.xid_errors if x in XID_MEANING and not XID_MEANING[x][1]]
    facts = [f"Xid {x}: {XID_MEANING.get(x, ('see NVIDIA Xid table', True))[0]}" for x in d.xid_errors]
    if d.ecc_uncorrected:
        facts.append(f"{d.ecc_uncorrected} uncorrected ECC error(s)")
    if d.remapped_rows_pending:
        facts.append("a memory row remap is pending (needs a GPU reset)")
    if not facts:
        return None
    gpu = f"GPU {d.index}" + (f" ({d.name})" if d.name else "")
    if hardware or d.ecc_uncorrected or d.remapped_rows_pending:
        return Verdict("gpu_hardware", f"{record.label} failed on {gpu}, which reported a hardware fault: {facts[0]}",
                       who=who_of(record), where=where_of(ev, record), since=ended_at(ev, record),
                       evidence=facts + ([f"its own error: {first_line(record.error, 160)}"] if record.error else []),
                       next=f"drain this node (the GPU needs a reset or replacement), then `ups relaunch {ev.view.run_id}` "
                            "elsewhere; nvidia-smi -q -d ECC,ROW_REMAPPER shows the counters")
    return Verdict("cuda_fault", f"{record.label}'s kernel faulted on {gpu}: {facts[0]} (the program's CUDA code, not the "
                   "hardware)", who=who_of(record), where=where_of(ev, record), since=ended_at(ev, record),
                   evidence=facts, next="rerun with CUDA_LAUNCH_BLOCKING=1 to find the kernel; Xid "
                   f"{program[0]} is an illegal access or a bad index in the program's own CUDA code")


def gpu_straggler(ev: Evidence) -> Verdict | None:
    """A rank slower than its peers whose GPU is throttled (thermal, power): the clock, not the code."""
    for p in ev.processes("rank"):
        if p.verdict.health is not Health.SLOW:
            continue
        d = ev.gpu_of(p.record)
        if d is not None and d.throttle:
            r = p.record
            return Verdict("gpu_throttled", f"{r.label} is a straggler: GPU {d.index} is throttled ({', '.join(d.throttle)})",
                           who=who_of(r), where=where_of(ev, r), since=r.progress_at,
                           evidence=[p.verdict.reason] + ([f"GPU {d.index} at {d.temperature_c} C"] if d.temperature_c else [])
                           + ([f"{d.power_w:.0f} W"] if d.power_w else []),
                           next="check cooling and power on this node (nvidia-smi -q -d PERFORMANCE); every rank waits for "
                                "the slowest one")
    return None


def lost_node(ev: Evidence) -> Verdict | None:
    """A multi-node run that lost a node: every process there went silent at once (or its
    SSH stream ended), or nobody was left there to say how it ended. The ranks of the other
    nodes fail in their next collective: the node is the cause, not their errors."""
    lost = [n for n in ev.view.nodes if not n.reachable or n.state == "lost"]
    if not lost:
        return None
    n = lost[0]
    silent = sorted((p.record for p in ev.view.processes if p.record.host == n.host and not p.record.is_final),
                    key=lambda r: (r.role != "rank", r.heartbeat_at))
    what = "is unreachable" if not n.reachable else "was lost (its launcher and processes vanished)"
    heard = f"{n.processes} process(es) there, launcher pid {n.launcher_pid}" if n.processes or n.launcher_pid else \
        "never heard from (no record of it reached this node)"
    others = [f"node {m.host}: {m.state or '?'} ({m.health})" for m in ev.view.nodes if m is not n]
    last = max(silent, key=lambda r: r.heartbeat_at) if silent else None
    evidence = [n.reason] + ([f"last heartbeat there: {last.label}"] if last else []) + others
    return Verdict("node_unreachable", f"node {n.host} {what}: {heard}",
                   who=who_of(silent[0]) if silent else None, since=last.heartbeat_at if last else None,
                   evidence=evidence, next=f"ssh {n.host} (is it up?); ups status {ev.view.run_id} --remote {n.host}")


def full_disk(ev: Evidence) -> Verdict | None:
    """A live run on a full disk: its records went stale because nothing can be written, not
    because its processes hang (the view says so: unreachable, "disk full")."""
    silent = [p for p in ev.view.processes if not p.record.is_final and p.verdict.reason.startswith("disk full")]
    if not silent:
        return None
    first = min(silent, key=lambda p: p.record.heartbeat_at)
    return Verdict("disk_full", f"the runs folder's disk is full: {len(silent)} process(es) of the run cannot write their records",
                   who=who_of(first.record), since=first.record.heartbeat_at, evidence=[first.verdict.reason],
                   next=f"free space under {ev.view.run.path.parent}; the job goes on, its output is dropped and "
                        "counted, and its launcher writes the run's end when there is room")


def unsupervised(ev: Evidence) -> Verdict | None:
    if ev.view.supervision != "unsupervised":
        return None
    launcher = ev.manifest.get("launcher") or {}
    alive = [p for p in ev.view.processes if p.record.role != "launcher" and p.verdict.health not in (Health.DEAD, Health.DONE, Health.FAILED)]
    return Verdict("unsupervised", f"the run's launcher (pid {launcher.get('pid')}) is gone; {len(alive)} of its processes run on unsupervised",
                   who=who_of(next((p.record for p in ev.view.processes if p.record.role == "launcher"), None)),
                   evidence=["nobody will record how the run ends until a launcher takes it over"],
                   next=f"ups adopt {ev.view.run_id}")
