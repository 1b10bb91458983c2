"""From evidence to a verdict: ordered rules, the first that speaks decides.

Ended runs are judged by how they ended (the launcher's own root-cause analysis, with exit
truth, names the process; the rules here say what kind of failure it was from its own words:
the exception, the signal and the faulthandler frame, the log). Live runs are judged by what
is stuck now: collectives first (a mismatch of ops or sequence numbers names the odd rank; a
rank outside any collective while its peers wait in one is the one they wait for), then
DataLoader workers, then any process that stopped making progress or answering.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any

from ups.runs.view import ProcessView
from ups.status.health import Health
from ups.status.record import StatusRecord
from ups.why import stacks
from ups.why.classify import classify as classify_text
from ups.why.evidence import Evidence, shm_figures
from ups.why.metric_rules import ended_training, live_training
from ups.why.verdict import Verdict, who_of

Rule = Callable[[Evidence], Verdict | None]

# CUDA's words, and the CPU allocator's when a host allocation is refused.
OOM = re.compile(r"out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED|can't allocate memory|"
                 r"Cannot allocate memory", re.I)
# torch.save's zip writer reports a short write (a full disk, a quota) as "unexpected pos".
DISK_FULL = re.compile(r"No space left on device|ENOSPC|\[Errno 28\]|file write failed|Disk quota exceeded|"
                       r"unexpected pos \d+ vs \d+")
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
# An exception raised in a DataLoader worker reaches the rank as "Caught X in DataLoader
# worker process N", followed by the worker's own traceback.
WORKER_CAUGHT = re.compile(r"Caught (?P<exc>\w+) in DataLoader worker process (?P<worker>\d+)")
# CUDA touched inside a worker: forked after the parent initialised CUDA (GPU), or on a box or
# build without it (the CPU analogue): the Dataset must hand back CPU tensors.
CUDA_IN_WORKER = re.compile(r"Cannot re-initialize CUDA in forked subprocess|Torch not compiled with CUDA enabled|"
                            r"Found no NVIDIA driver|CUDA driver initialization failed", re.I)
TRACEBACK_FILE = re.compile(r'File "(?P<path>[^"]+)", line (?P<line>\d+), in (?P<fn>\S+)')
RENDEZVOUS = re.compile(
    r"address already in use|EADDRINUSE|Connection refused|ECONNREFUSED|Rendezvous\w*Error|rendezvous|"
    r"server socket has failed to listen|failed to connect|Name or service not known|No route to host|"
    r"timed out after .* (store|TCPStore)|Socket Timeout|DistStoreError|client socket has timed out", re.I)
DATALOADER_RESOURCES = re.compile(
    r"Too many open files|EMFILE|received 0 items of ancdata|shared memory|/dev/shm|Bus error|"
    r"unable to (open|mmap|write to) .*shm|No space left on device.*shm", re.I)
DATALOADER_WORKER = re.compile(r"DataLoader worker \(pid\(?s?\)? ?([\d, ]+)\)")
SAVE_NOTE = re.compile(r"\(ups: while torch\.save wrote (?P<file>[^)]+)\)")
CANNOT_WRITE = re.compile(r"cannot write (?P<file>\S+?):")
IO_FRAMES = ("h5py", "netCDF4", "zarr", "io.py", "/fsspec/", "pyarrow")
PROBLEMS = (Health.STALLED, Health.UNRESPONSIVE, Health.DEAD, Health.FAILED)


def where_of(ev: Evidence, record: StatusRecord, section: stacks.Section | None = None) -> dict[str, Any]:
    """Phase and the frame that matters: the program's own innermost frame, and the innermost
    of all (the library call it is in) when that is elsewhere."""
    section = section if section is not None else ev.stack(record)
    own = section.own_frame if section else None
    top = section.top if section else None
    site = own.site if own else (record.error_site or None)
    return {"phase": record.phase, "site": site, "function": own.function if own else None,
            "frame": str(top) if top is not None and top is not own else None}


def _label_list(views: list[ProcessView]) -> str:
    return stacks.fold_labels([p.record.label for p in views])


def _wait(views: list[ProcessView]) -> str:
    """``rank 0 waits`` / ``ranks 0, 2 wait``."""
    return f"{_label_list(views)} {'wait' if len(views) > 1 else 'waits'}"


def _first_line(text: str | None, limit: int = 200) -> str:
    line = next((ln.strip() for ln in (text or "").splitlines() if ln.strip()), "")
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _grep(text: str, pattern: re.Pattern[str], limit: int = 3) -> list[str]:
    return [ln.strip()[:220] for ln in text.splitlines() if pattern.search(ln)][-limit:]


# ------------------------------------------------------------------------ ended runs
def ended(ev: Evidence) -> Verdict | None:
    view = ev.view
    if not view.is_final:
        return None
    m = ev.manifest
    state, summary = m.get("state"), m.get("summary") or ""
    if state == "succeeded":
        skipped = oom_skipped(ev)  # survived, but worth knowing: a step skipped for lack of memory
        return Verdict("succeeded", f"nothing wrong: the run succeeded ({summary})", ok=True,
                       evidence=[skipped.headline] if skipped else [], next=f"ups status {view.run_id}")
    if state == "killed":
        kill = next((e for e in reversed(ev.events) if e.get("event") == "kill"), {})
        who = kill.get("actor", "an operator")
        return Verdict("killed", f"the run was stopped by {who}" + (f" ({kill['reason']})" if kill.get("reason") else ""),
                       evidence=[summary] if summary else [], next=f"ups relaunch {view.run_id}")
    failure = m.get("failure") or {}
    record = _failing_record(ev, failure)
    verdict = classify_failure(ev, record, failure) if record is not None or failure else None
    if verdict is not None:
        if m.get("launcher_lost"):
            verdict.evidence.append("the launcher died before the run ended; the state was settled from the records")
        return verdict
    if state == "lost":
        return Verdict("lost", summary or "the launcher and every process vanished with no final record",
                       evidence=["no process wrote how it ended (a reboot, or everything SIGKILLed)"],
                       next=f"ups relaunch {view.run_id}")
    return Verdict("failed", summary or f"the run ended {state}", next=f"ups logs {view.run_id}")


def _failing_record(ev: Evidence, failure: dict) -> StatusRecord | None:
    ranks = {p.record.rank: p.record for p in ev.processes("rank")}
    if failure.get("rank") is not None and failure.get("name", "").find("worker") < 0 and failure["rank"] in ranks:
        return ranks[failure["rank"]]
    if failure.get("name"):
        p = ev.view.process(failure["name"])
        if p is not None:
            return p.record
    failed = sorted((p.record for p in ev.processes("rank", "worker", "agent") if p.record.state == "failed"),
                    key=lambda r: r.heartbeat_at)
    return failed[0] if failed else None


def classify_failure(ev: Evidence, record: StatusRecord | None, failure: dict) -> Verdict | None:
    """What kind of failure a failed process had, from its own words."""
    if record is None:
        return None
    error = record.error or failure.get("error") or ""
    signal_name = failure.get("signal")
    log = ev.rank_log(record.rank) if record.role == "rank" and record.rank is not None else ""
    text = "\n".join((error, _exception_text(ev, record), log[-20_000:] if log else ev.job_log[-20_000:]))
    who = who_of(record)

    hardware = gpu_fault(ev, record) if record.role == "rank" else None
    if hardware is not None:
        return hardware
    # A rank that died of its DataLoader: the worker is the one to name (its exception, else its death).
    in_worker = worker_exception(ev, record, "\n".join((error, _exception_text(ev, record))))
    if in_worker is not None:
        return in_worker
    worker_verdict = _dataloader_worker_failure(ev, record, error)
    if worker_verdict is not None:
        return worker_verdict
    starved = _starved(log or ev.job_log)
    if record.phase in ("data", "fetch") and starved and not DATALOADER_RESOURCES.search(error):
        # Workers out of descriptors or shared memory: the rank's own error is only the
        # symptom (an EOFError, a connection reset while receiving the batch); the log says why.
        return resources_verdict(ev, record, starved + "\n" + error, rank=record)
    if record.phase == "dist.init" or (record.role == "agent" and RENDEZVOUS.search(error or text)):
        rdzv = rendezvous_verdict(ev, record, text)
        if rdzv is not None:
            return rdzv
    if failure.get("collective_mismatch") or MISMATCH.search(text):
        mismatch = collective_mismatch(ev, record, text)
        if mismatch is not None:
            return mismatch
    timed_out = collective_timeout(ev, record, text)
    if timed_out is not None:
        return timed_out
    if OOM.search(error) or (signal_name is None and record.state == "failed" and OOM.search(_exception_text(ev, record))):
        line = error if OOM.search(error) else next(iter(_grep(text, OOM)[-1:]), "")
        return oom_verdict(ev, record, fatal=True, error=line)
    if DISK_FULL.search(error) or DISK_FULL.search(_exception_text(ev, record)):
        return disk_full_verdict(ev, record, error + "\n" + _exception_text(ev, record))
    if DATALOADER_RESOURCES.search(error):
        return resources_verdict(ev, record, error)
    if signal_name in ("SIGKILL", "SIGTERM") and not _signalled_by_ups(ev, record):
        return outside_signal_verdict(ev, record, signal_name, failure)
    logged = classify_text("\n".join((error, _exception_text(ev, record), log[-20_000:])))
    if logged is not None:
        return log_class_verdict(ev, record, logged, failure)
    if signal_name:
        fatal = ev.stack(record, "fatal")
        where = where_of(ev, record, fatal)
        ev_lines = [f"faulthandler: {fatal.title}" + (f", main thread in {fatal.top}" if fatal and fatal.top else "")] if fatal else []
        if not fatal:
            ev_lines.append("no faulthandler traceback in its stack file")
        return Verdict("crashed_by_signal", f"{record.label} was killed by {signal_name} in phase {record.phase}",
                       who=who, where=where, since=_ended_at(ev, record), evidence=ev_lines + _followers(failure),
                       next=f"ups stacks {ev.view.run_id} --rank {record.rank}")
    if record.state == "running" or failure.get("clean") is False:
        return Verdict("no_normal_exit",
                       f"{record.label} ended without a normal interpreter exit (os._exit or a signal) in phase "
                       f"{record.phase}, last recorded at step {record.step}" + _while_peers(ev, record),
                       who=who, where=where_of(ev, record), since=_ended_at(ev, record),
                       evidence=_followers(failure),
                       next=f"ups logs {ev.view.run_id} --rank {record.rank}")
    if error:
        section = ev.stack(record, "exception")
        where = where_of(ev, record, section)
        where["site"] = record.error_site or where.get("site")
        message = error.split(" (at ")[0]
        return Verdict("exception", f"{record.label} raised {message}", who=who, where=where,
                       since=_ended_at(ev, record), evidence=_followers(failure),
                       next=f"ups logs {ev.view.run_id}" + (f" --rank {record.rank}" if record.role == "rank" else ""))
    return None


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
                       who=who_of(record), where=where_of(ev, record), since=_ended_at(ev, record),
                       evidence=facts + ([f"its own error: {_first_line(record.error, 160)}"] if record.error else []),
                       next=f"drain this node (the GPU needs a reset or replacement), then `ups relaunch {ev.view.run_id}` "
                            "elsewhere; nvidia-smi -q -d ECC,ROW_REMAPPER shows the counters")
    return Verdict("cuda_fault", f"{record.label}'s kernel faulted on {gpu}: {facts[0]} (the program's CUDA code, not the "
                   "hardware)", who=who_of(record), where=where_of(ev, record), since=_ended_at(ev, record),
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


def _signalled_by_ups(ev: Evidence, record: StatusRecord) -> bool:
    """ups sent this process a signal (a kill of the run, a signal to it): events.jsonl says."""
    return any(e.get("event") == "kill" or (e.get("event") == "signal" and e.get("target") == record.name)
               for e in ev.events)


def oom_kills() -> int | None:
    """The kernel OOM killer's count for this cgroup (cgroup v2 memory.events), where readable."""
    try:
        with open("/proc/self/cgroup") as fh:
            rel = next((ln.split(":", 2)[2].strip() for ln in fh if ln.startswith("0::")), None)
    except OSError:
        rel = None
    for path in ([f"/sys/fs/cgroup{rel}/memory.events"] if rel else []) + ["/sys/fs/cgroup/memory.events"]:
        try:
            with open(path) as fh:
                m = re.search(r"^oom_kill (\d+)", fh.read(), re.M)
            if m:
                return int(m.group(1))
        except OSError:
            continue
    return None


def outside_signal_verdict(ev: Evidence, record: StatusRecord, signal_name: str, failure: dict) -> Verdict:
    """The first process to end was killed by SIGKILL or SIGTERM that neither ups nor its launcher
    sent (events.jsonl has no kill or signal for it): the kernel's OOM killer, a scheduler's
    preemption, an operator's kill."""
    run = ev.view.run_id
    where = where_of(ev, record)
    ended_at = _ended_at(ev, record)
    if signal_name == "SIGKILL":
        kills = oom_kills()
        if kills:
            return Verdict("oom_killed", f"{record.label} was killed by the kernel's OOM killer (SIGKILL) in phase {record.phase}",
                           who=who_of(record), where=where, since=ended_at,
                           evidence=[f"cgroup memory.events: oom_kill {kills}", "no kill or signal from ups in events.jsonl"]
                           + _followers(failure),
                           next="use less host memory per process (fewer DataLoader workers, smaller prefetch or batch), "
                                f"or a box with more RAM; then `ups relaunch {run}`")
        return Verdict("killed_from_outside", f"{record.label} was killed by SIGKILL from outside ups in phase {record.phase}",
                       who=who_of(record), where=where, since=ended_at,
                       evidence=["no kill or signal from ups in events.jsonl",
                                 "no OOM kill counted in this cgroup's memory.events" if kills == 0 else
                                 "memory.events not readable here"] + _followers(failure),
                       next="check `dmesg | grep -i -e oom -e killed` (the kernel's OOM killer) and who else can kill "
                            f"this user's processes; then `ups relaunch {run}`")
    return Verdict("stopped_from_outside", f"{record.label} was stopped from outside (SIGTERM, not sent by ups or its launcher) "
                   f"in phase {record.phase}, at step {record.step}",
                   who=who_of(record), where=where, since=ended_at,
                   evidence=["no kill or signal from ups in events.jsonl: a scheduler's preemption, a job time limit or "
                             "someone's kill"] + _followers(failure),
                   next=f"check the scheduler's log for a preemption or time limit; `ups relaunch {run}` resumes")


def log_class_verdict(ev: Evidence, record: StatusRecord, m, failure: dict) -> Verdict:  # noqa: ANN001
    """A failure the process's own words name (ups.why.classify): what, where, the fix."""
    section = ev.stack(record, "exception")
    where = where_of(ev, record, section)
    where["site"] = record.error_site or where.get("site") or m.site
    return Verdict(m.cls.name, f"{record.label} failed: {m.cls.what}", who=who_of(record), where=where,
                   since=_ended_at(ev, record), evidence=[_first_line(m.line)] + _followers(failure), next=m.cls.fix)


def worker_exception(ev: Evidence, rank: StatusRecord, text: str) -> Verdict | None:
    """A rank that died of an exception its DataLoader worker raised: the worker, its own
    error and line (from the "Original Traceback" the rank re-raised), the batch in flight."""
    m = WORKER_CAUGHT.search(text)
    if m is None:
        return None
    original = text[text.find("Original Traceback"):] if "Original Traceback" in text else ""
    section = stacks.parse_traceback(original) if original else None
    worker_no = int(m["worker"])
    workers = sorted((p.record for p in ev.processes("worker") if p.record.rank == rank.rank and p.record.worker == worker_no),
                     key=lambda r: r.started_at)
    worker = workers[-1] if workers else None
    said = section.title if section and section.title else m["exc"]
    own = section.own_frame if section else None
    where = {"phase": "fetch", "site": own.site if own else None, "function": own.function if own else None,
             "frame": str(section.top) if section and section.top is not None and section.top is not own else None}
    if DATALOADER_RESOURCES.search(said):  # out of descriptors or shared memory: the figures and the fix
        return resources_verdict(ev, worker or rank, said, rank=rank)
    label = worker.label if worker else f"{rank.label} / worker {worker_no}"
    # The index whose __getitem__ raised (the worker prefetches on after it raised).
    in_flight = (worker.metrics.get("raised_item") or worker.item) if worker is not None else None
    fetching = f" while fetching {in_flight}" if in_flight else ""
    run = ev.view.run_id
    if CUDA_IN_WORKER.search(original or text):
        return Verdict("cuda_in_worker", f"{label} used CUDA inside the Dataset{fetching}: {said}; {rank.label} failed with it",
                       who=who_of(worker or rank), where=where, since=_ended_at(ev, rank),
                       evidence=[f"{rank.label}: {_first_line(text)}"],
                       next=f"return CPU tensors from the Dataset and move batches to the GPU in the training loop (fix "
                            f"{where['site'] or 'its __getitem__'}); a worker that must use CUDA needs "
                            f"multiprocessing_context='spawn'; or `ups relaunch {run} --num-workers 0`")
    return Verdict("worker_exception", f"{label} raised {said}{fetching}; {rank.label} failed with it",
                   who=who_of(worker or rank), where=where, since=_ended_at(ev, rank),
                   evidence=[f"{rank.label}: {_first_line(text)}"],
                   next=f"fix {where['site'] or 'the Dataset'} (the sample in that batch), then `ups relaunch {run}`")


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
    line = next((ln for t in texts for ln in _grep(t, COLLECTIVE_TIMEOUT, 1)), "")
    outside = [p for p in ev.processes("rank") if not p.record.collective]
    if len(keys) == 1 and not outside:
        r = inside[0].record
        c = r.collective
        return Verdict("collective_timeout",
                       f"every rank timed out together in {c['op']} #{c['seq']} at {c.get('site')}: no rank was missing, "
                       "so the transport failed (network, NCCL) or a rank outside this view left",
                       who=who_of(r), where={"phase": r.phase, "site": c.get("site"), "function": c["op"], "frame": None},
                       since=_ended_at(ev, r), evidence=[_first_line(line)],
                       next=f"ups logs {ev.view.run_id} (then NCCL_DEBUG=INFO on a relaunch)")
    odd = inside if outside else _odd_ones(inside)
    o = sorted(odd, key=lambda p: p.record.rank or 0)[0].record
    c = o.collective
    peers = [p for p in ev.processes("rank") if p not in odd]

    def doing(p: ProcessView) -> str:
        r = p.record
        if r.collective:
            return f"{r.label} was in {r.collective['op']} #{r.collective['seq']} at {r.collective.get('site')}"
        if _in_backward(ev, p, "exception") or _in_backward(ev, p):
            return f"{r.label} was in DDP's gradient all-reduce (backward)"
        return f"{r.label} was in no collective (phase {r.phase})"

    return Verdict("one_sided_collective",
                   f"one-sided collective: {o.label} timed out in {c['op']} #{c['seq']}, never entered by "
                   f"{_label_list(peers) if peers else 'its peers'}",
                   who=who_of(o), where={"phase": o.phase, "site": c.get("site"), "function": c["op"], "frame": None},
                   since=c.get("since"), evidence=[_first_line(line)] + [doing(p) for p in peers[:4]] + _prev(c),
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
        if _in_backward(ev, p, "fatal") or _in_backward(ev, p):
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
                           f"{_label_list(outside)}; {aborted}: a collective mismatch",
                           who=who_of(o), where={"phase": f"collective:{op}", "site": site, "function": op, "frame": None},
                           since=_ended_at(ev, o), evidence=[_first_line(line)] + [doing(p) for p in ranks],
                           next=f"fix the call at {site or 'that collective'}: {fix}")
    sides = "; ".join(doing(p) for p in ranks)
    first = inside[0].record
    op, site = colls[first.rank]
    return Verdict("collective_mismatch",
                   f"mismatched collectives: {sides}; {aborted}",
                   who=None, where={"phase": f"collective:{op}", "site": site, "function": op, "frame": None},
                   since=_ended_at(ev, record), evidence=[_first_line(line)],
                   next=f"ups stacks {run} --group (then fix the calls: {fix})")


def _signal_of(ev: Evidence, record: StatusRecord) -> str | None:
    failure = ev.manifest.get("failure") or {}
    if failure.get("rank") == record.rank and failure.get("signal"):
        return failure["signal"]
    ex = ev.exits.get(record.name)
    return getattr(ex, "signal", None) if ex else None


def _exception_text(ev: Evidence, record: StatusRecord) -> str:
    section = ev.stack(record, "exception")
    return section.text if section else ""


def _ended_at(ev: Evidence, record: StatusRecord) -> float | None:
    ex = ev.exits.get(record.name)
    return ex.at if ex else (record.heartbeat_at if record.is_final else None)


def _followers(failure: dict) -> list[str]:
    out = []
    for f in failure.get("followed_by") or []:
        how = f"killed by {f['signal']}" if f.get("signal") else (f.get("error") or f.get("state"))
        out.append(f"then rank {f['rank']} ended: {how}")
    if failure.get("torchrun_root") is not None and failure.get("rank") is not None and failure["torchrun_root"] != failure["rank"]:
        out.append(f"torchrun's report blames rank {failure['torchrun_root']}, which failed after it")
    return out[:4]


def _while_peers(ev: Evidence, record: StatusRecord) -> str:
    mine = ev.exits.get(record.name)
    if mine is None:
        return ""
    later = [e.rank for e in ev.exits.values() if e.role == "rank" and e.name != record.name and e.at > mine.at]
    return f", while rank {', '.join(map(str, sorted(later)))} still ran" if later else ""


def _dataloader_worker_failure(ev: Evidence, rank: StatusRecord, error: str) -> Verdict | None:
    if "DataLoader worker" not in error and not DATALOADER_RESOURCES.search(error):
        return None
    workers = [p for p in ev.processes("worker") if p.record.rank == rank.rank]
    bad = [p for p in workers if p.verdict.health in (Health.DEAD, Health.FAILED)]
    m = DATALOADER_WORKER.search(error)
    pids = {int(x) for x in re.findall(r"\d+", m.group(1))} if m else set()
    named = [p for p in workers if p.record.pid in pids] or bad
    worker = named[0].record if named else None
    if DATALOADER_RESOURCES.search(error):
        return resources_verdict(ev, worker or rank, error, rank=rank)
    if worker is None:
        return None
    fatal = ev.stack(worker, "fatal")
    signal = re.search(r"killed by signal: ([\w ]+)", error)
    what = f"killed by {signal.group(1).strip()}" if signal else "exited unexpectedly"
    return Verdict("crashed_by_signal" if signal else "failed",
                   f"{worker.label} {what} while fetching {worker.item or 'a batch'}; {rank.label} failed with it",
                   who=who_of(worker), where=where_of(ev, worker, fatal), since=_ended_at(ev, worker),
                   evidence=[_first_line(error)] + ([f"faulthandler: {fatal.title}"] if fatal else []),
                   next=f"ups relaunch {ev.view.run_id} --num-workers 0")


# ------------------------------------------------------------------- failure kinds
def oom_verdict(ev: Evidence, record: StatusRecord, *, fatal: bool, error: str) -> Verdict:
    skipped = record.metrics.get("skipped_steps")
    how = "fatal: the process ended" if fatal else f"the step was skipped on every rank ({skipped} so far); training goes on"
    gpu = record.gpu
    ev_lines = [_first_line(error)] if error else []
    if gpu is not None and gpu.peak:
        ev_lines.append(f"peak CUDA memory {gpu.peak / 2**30:.1f} GiB on device {gpu.device}")
    return Verdict("out_of_memory", f"{record.label} ran out of memory at step {record.step} ({how})", ok=False,
                   who=who_of(record), where=where_of(ev, record), since=_ended_at(ev, record), evidence=ev_lines,
                   next=("lower the batch size, or `ups relaunch " + ev.view.run_id + "` with more memory per rank") if fatal
                   else f"ups logs {ev.view.run_id} --rank {record.rank}")


def disk_full_verdict(ev: Evidence, record: StatusRecord, text: str) -> Verdict:
    m = SAVE_NOTE.search(text) or CANNOT_WRITE.search(text)
    target = m.group("file") if m else None
    if target is None:
        paths = re.findall(r"(/[\w./-]+\.(?:pt|pth|ckpt|safetensors|h5|tmp))", text)
        target = paths[-1] if paths else None
    what = f"writing {target}" if target else "writing"
    kind = "checkpoint" if record.phase == "checkpoint" or (target and target.endswith((".pt", ".pth", ".ckpt"))) else "file"
    free = None
    if target:
        try:
            st = os.statvfs(os.path.dirname(target) or ".")
            free = st.f_bavail * st.f_frsize
        except OSError:
            free = None
    ev_lines = [_first_line(t) for t in _grep(text, DISK_FULL, 2)]
    if free is not None:
        ev_lines.append(f"{free / 2**30:.1f} GiB free there now")
    return Verdict("disk_full", f"disk full: {record.label} failed {what} ({kind}) in phase {record.phase}",
                   who=who_of(record), where=where_of(ev, record), since=_ended_at(ev, record), evidence=ev_lines,
                   next=f"free space on {os.path.dirname(target) if target else 'the output disk'} (df -h), then `ups relaunch {ev.view.run_id}`")


def rendezvous_verdict(ev: Evidence, record: StatusRecord, text: str) -> Verdict | None:
    lines = [ln for ln in _grep(text, RENDEZVOUS, 8) if not TRACEBACK_FILE.search(ln)][-4:]
    if not lines:
        return None
    endpoint = _endpoint(ev, text)
    holder = _port_holder(endpoint[1]) if endpoint and endpoint[1] else None
    reason = "the port is in use" if re.search(r"address already in use|EADDRINUSE", text, re.I) else (
        "nothing listens there" if re.search(r"Connection refused|ECONNREFUSED", text, re.I) else
        "no answer in time" if re.search(r"timed? ?out|Timeout", text, re.I) else "it failed")
    at = f"{endpoint[0]}:{endpoint[1]}" if endpoint else "the rendezvous endpoint"
    ev_lines = lines[-2:]
    if holder:
        ev_lines.append(f"port {endpoint[1]} is held by pid {holder[0]} ({holder[1]})")
    # A rank fails inside init_process_group; torchrun's agent fails before any rank starts,
    # in its own rendezvous: its site is torchrun's frame that raised, not the `torchrun` script.
    agent = record.role == "agent"
    frames = list(TRACEBACK_FILE.finditer(text)) if agent else []
    frame = f"{os.path.basename(frames[-1]['path'])}:{frames[-1]['line']} in {frames[-1]['fn']}" if frames else None
    stage = "dist.init" if record.phase == "dist.init" else "rendezvous"
    who = "torchrun's agent" if agent else record.label
    return Verdict("rendezvous_failed", f"{who} could not rendezvous at {at}" + (" in dist.init" if stage == "dist.init" else "") + f": {reason}",
                   who=who_of(record), where={"phase": stage, "site": None if agent else record.error_site,
                                              "function": None, "frame": frame},
                   since=_ended_at(ev, record), evidence=ev_lines,
                   next="use --standalone (one node), or a free port / the right --rdzv-endpoint HOST:PORT on every node")


def _endpoint(ev: Evidence, text: str) -> tuple[str, int | None] | None:
    command = " ".join(ev.manifest.get("command") or [])
    for pattern in (r"--rdzv[-_]endpoint[= ](\S+?):(\d+)", r"--master[-_]addr[= ](\S+).*?--master[-_]port[= ](\d+)",
                    r"(?:host|addr(?:ess)?)\W+([\w.\-]+)\W+port\W+(\d+)", r"\[([\w.\-:]+)\]:(\d+)", r"([\w.\-]+):(\d{2,5})\b"):
        for source in (command, text):
            m = re.search(pattern, source)
            if m:
                return m.group(1), int(m.group(2))
    return None


def _port_holder(port: int) -> tuple[int, str] | None:
    """Who listens on a TCP port of this host (the holder of a busy rendezvous port)."""
    try:
        import psutil

        for conn in psutil.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
                proc = psutil.Process(conn.pid)
                return conn.pid, " ".join(proc.cmdline())[:80]
    except Exception:  # noqa: BLE001 - a lookup that is not allowed tells nothing
        return None
    return None


def resources_verdict(ev: Evidence, record: StatusRecord, error: str, rank: StatusRecord | None = None) -> Verdict:
    fds = re.search(r"Too many open files|EMFILE|ancdata", error, re.I)
    facts = ev.proc(rank or record)
    limit = record.metrics.get("nofile_limit") or (facts.nofile if facts else None)
    figures = []
    if fds:
        figures.append(f"ulimit -n (open files) is {limit}" if limit else "the open-file limit (ulimit -n) was reached")
        fix = ("raise it (`ulimit -n 65536` before launching), or torch.multiprocessing.set_sharing_strategy('file_system'), "
               f"or `ups relaunch {ev.view.run_id} --num-workers 0`")
        what = "ran out of file descriptors"
    else:
        shm = shm_figures()
        if shm:
            figures.append(f"/dev/shm is {shm[0] / 2**30:.1f} GiB, {shm[1] / 2**30:.1f} GiB free now")
        fix = f"a larger /dev/shm (docker --shm-size=8g), fewer workers or a smaller batch, or `ups relaunch {ev.view.run_id} --num-workers 0`"
        what = "ran out of shared memory"
    who = record if record.role == "worker" else (rank or record)
    return Verdict("dataloader_resources", f"DataLoader workers of {(rank or record).label} {what}",
                   who=who_of(who), where=where_of(ev, who), since=_ended_at(ev, who),
                   evidence=[_first_line(error)] + figures, next=fix)


# ---------------------------------------------------------------------- nodes
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


# ---------------------------------------------------------------------- live runs
def unsupervised(ev: Evidence) -> Verdict | None:
    if ev.view.supervision != "unsupervised":
        return None
    launcher = ev.manifest.get("launcher") or {}
    alive = [p for p in ev.view.processes if p.record.role != "launcher" and p.verdict.health not in (Health.DEAD, Health.DONE, Health.FAILED)]
    return Verdict("unsupervised", f"the run's launcher (pid {launcher.get('pid')}) is gone; {len(alive)} of its processes run on unsupervised",
                   who=who_of(next((p.record for p in ev.view.processes if p.record.role == "launcher"), None)),
                   evidence=["nobody will record how the run ends until a launcher takes it over"],
                   next=f"ups adopt {ev.view.run_id}")


SETTLE_S = 20.0  # how long a live run that lost a rank may take to wind down before the rules guess
FATAL_SIGNALS = {"Segmentation fault": "SIGSEGV", "Aborted": "SIGABRT", "Bus error": "SIGBUS",
                 "Floating-point exception": "SIGFPE", "Illegal instruction": "SIGILL"}


def settling(ev: Evidence) -> Verdict | None:
    """A rank (or torchrun's agent) ended while the run is still live: the launcher is about to
    record how every process ended, and the verdict rests on facts not in yet (the rank's final
    record, the exit of the one that ended first, its worker's error). Until then say what is
    known and blame no one: a culprit named now could be contradicted a second later (the agent's
    ChildFailedError lands before the rank's record; a peer torchrun killed is found gone first)."""
    view = ev.view
    if view.is_final or view.supervision == "unsupervised":
        return None
    ended_ = [p for p in ev.processes("rank", "agent")
              if p.verdict.health is Health.DEAD or p.record.state == "failed"]
    if not ended_:
        return None
    exits = ev.exits

    def end_of(p: ProcessView) -> float:
        ex = exits.get(p.record.name)
        return ex.at if ex is not None else p.record.heartbeat_at

    first_end = min(end_of(p) for p in ended_)
    if ev.now - first_end > SETTLE_S:
        return None  # the run is not winding down: the rules below judge what is there
    ordered = sorted(ended_, key=end_of)
    exact = all(p.record.name in exits and exits[p.record.name].exact for p in ended_)

    def how(p: ProcessView) -> str:
        r = p.record
        if r.state == "failed":
            return f"{r.label} failed ({_first_line(r.error, 120) or 'no error text'})"
        fatal = ev.stack(r, "fatal")
        signal = FATAL_SIGNALS.get(fatal.title) if fatal else None
        return f"{r.label} died ({signal})" if signal else f"{r.label} ended without a normal exit"

    if exact and len(ordered) > 1:
        what = f"{how(ordered[0])} first; then " + ", ".join(how(p) for p in ordered[1:4])
    else:
        what = "; ".join(how(p) for p in ordered[:4])
    return Verdict("settling", f"{what}; settling… (the launcher is recording how every process ended)",
                   since=first_end, evidence=[f"{p.record.label}: {p.verdict.reason}" for p in ordered[:4]],
                   next=f"ups why {view.run_id} again in a few seconds")


def live_failure(ev: Evidence) -> Verdict | None:
    """A process already failed while the run is still winding down."""
    failed = sorted((p.record for p in ev.processes("rank", "agent") if p.record.state == "failed"), key=lambda r: r.heartbeat_at)
    if not failed:
        return None
    return classify_failure(ev, failed[0], {"rank": failed[0].rank, "error": failed[0].error})


def collectives(ev: Evidence) -> Verdict | None:
    ranks = [p for p in ev.processes("rank") if p.record.state == "running"]
    inside = [p for p in ranks if p.record.collective]
    if len(ranks) < 2 or not inside or not any(p.verdict.health in (Health.STALLED, Health.UNRESPONSIVE) for p in ranks):
        return None
    colls = {p.record.rank: p.record.collective for p in inside}
    keys = {(c["op"], c["seq"]) for c in colls.values()}
    run = ev.view.run_id
    in_ddp = [p for p in ranks if not p.record.collective and _in_backward(ev, p)]
    if in_ddp and len(in_ddp) + len(inside) == len(ranks):
        # The peers sit in DDP's gradient all-reduce (C++, inside backward), the normal path of
        # every step; the ranks in a collective of their own are the ones out of step.
        o = sorted(inside, key=lambda p: p.record.rank or 0)[0].record
        c = o.collective
        return Verdict("one_sided_collective",
                       f"one-sided collective: {o.label} is in {c['op']} #{c['seq']}, never entered by "
                       f"{_label_list(in_ddp)}: {'they wait' if len(in_ddp) > 1 else 'it waits'} in DDP's gradient "
                       "all-reduce (backward); every rank waits",
                       who=who_of(o), where={"phase": o.phase, "site": c.get("site"), "function": c["op"], "frame": None},
                       since=c.get("since"),
                       evidence=[f"{_label_list(inside)}: {c['op']} #{c['seq']} at {c.get('site')}",
                                 f"{_label_list(in_ddp)}: in loss.backward() (DDP all-reduces gradients there)"] + _prev(c),
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
        groups = "; ".join(f"{_label_list([p for p in inside if (p.record.collective['op'], p.record.collective['seq']) == k])}: "
                           f"{k[0]} #{k[1]} at {next(p.record.collective['site'] for p in inside if (p.record.collective['op'], p.record.collective['seq']) == k)}"
                           for k in sorted(keys, key=str))
        peers = _label_list(common) if common else "its peers"
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
        r = stuck.record
        section = ev.stack(r)
        if section is None:
            # Its stack decides: DDP's gradient all-reduce (backward: the one-sided call is the
            # peers') or its own code (it is the one they wait for). Blame no one before it comes.
            return Verdict("settling", f"{_wait(waiting)} in {c['op']} #{c['seq']} at {c.get('site')}; {r.label} is in no "
                           "explicit collective; settling… (its stack dump tells whether it waits in DDP's all-reduce or is "
                           "stuck in its own code)", since=c.get("since"),
                           evidence=[f"{r.label}: {stuck.verdict.reason}"], next=f"ups stacks {run} --group")
        where = where_of(ev, r, section)
        ev_lines = [f"{_wait(waiting)} in {c['op']} #{c['seq']} at {c.get('site')}",
                    f"{r.label} is in no collective: {stuck.verdict.reason}"]
        if section is None:
            ev_lines.append("no stack dump of it yet")
        return Verdict("rank_stuck_peers_wait",
                       f"{r.label} is stuck in its own code while {_wait(waiting)} for it in {c['op']}",
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


def _in_backward(ev: Evidence, p: ProcessView, kind: str | None = None) -> bool:
    section = ev.stack(p.record, kind)
    frames = section.stack if section else ()
    return any("autograd" in f.file or f.function in ("_engine_run_backward", "backward") for f in frames)


def ddp_backward(ev: Evidence) -> Verdict | None:
    """DDP's gradient all-reduce runs in C++: peers waiting for a stuck rank sit in backward."""
    ranks = [p for p in ev.processes("rank") if p.record.state == "running" and p.verdict.health in (Health.STALLED, Health.UNRESPONSIVE)]
    if len(ranks) < 2:
        return None
    in_backward, elsewhere = [], []
    for p in ranks:
        (in_backward if _in_backward(ev, p) else elsewhere).append(p)
    if not in_backward or len(elsewhere) != 1:
        return None
    worker = waits_on_worker(ev, elsewhere[0])
    if worker is not None:  # the rank is not stuck in its own code: it waits for its worker
        return worker_verdict(ev, worker, in_backward)
    r = elsewhere[0].record
    where = where_of(ev, r)
    return Verdict("rank_stuck_peers_wait",
                   f"{r.label} is stuck in its own code while {_wait(in_backward)} for it in backward "
                   "(DDP's gradient all-reduce)", who=who_of(r), where=where, since=max(r.progress_at, r.phase_at),
                   evidence=[f"{r.label}: {elsewhere[0].verdict.reason}", f"{_label_list(in_backward)}: in loss.backward()"],
                   next=f"ups stacks {ev.view.run_id} --group")


def _starved(log: str) -> str:
    """The log's last lines saying DataLoader workers ran out of descriptors or shared memory,
    newest first ("" when none)."""
    return "\n".join(reversed(_grep(log[-200_000:], DATALOADER_RESOURCES, 2)))


def starved_loader(ev: Evidence) -> Verdict | None:
    """Workers out of file descriptors or shared memory rarely crash the loop: the worker's
    resource sharer dies with EMFILE and the main process waits forever for the batch. The
    log says why while the rank stalls in its DataLoader."""
    stuck = [p for p in ev.processes("rank", "worker") if p.record.state == "running"
             and p.verdict.health in (Health.STALLED, Health.UNRESPONSIVE)]
    if not stuck:
        return None
    lines = _starved(ev.job_log)
    if not lines:
        return None
    rank_no = stuck[0].record.rank or 0
    rank = next((p.record for p in ev.processes("rank") if (p.record.rank or 0) == rank_no), stuck[0].record)
    return resources_verdict(ev, rank, lines, rank=rank)


def waits_on_worker(ev: Evidence, rank: ProcessView) -> ProcessView | None:
    """The DataLoader worker a rank waits on: the rank is in ``next(it)`` (phase data) and one
    of its workers is inside a fetch that began before the rank last advanced, so no batch
    came since. The worker's own stall limit may not have passed yet: it is still the one."""
    r = rank.record
    if r.role != "rank" or r.phase != "data" or r.state != "running":
        return None
    fetching = [p for p in ev.processes("worker") if p.record.rank == r.rank and p.record.state == "running"
                and p.record.phase == "fetch" and p.verdict.health not in (Health.DEAD, Health.DONE, Health.FAILED)
                and p.record.phase_at <= max(r.progress_at, r.phase_at)]
    if not fetching:
        return None
    return sorted(fetching, key=lambda p: (-p.verdict.health.severity, p.record.phase_at))[0]


def stuck_workers(ev: Evidence) -> Verdict | None:
    workers = [p for p in ev.processes("worker") if p.record.state == "running"
               and p.verdict.health in (Health.STALLED, Health.UNRESPONSIVE)]
    if not workers:
        return None
    p = sorted(workers, key=lambda p: p.verdict.health.severity, reverse=True)[0]
    return worker_verdict(ev, p)


def worker_verdict(ev: Evidence, p: ProcessView, peers: list[ProcessView] = ()) -> Verdict:
    """A DataLoader worker stuck in a sample: which, the index in flight, the file it opened,
    the frame; ``peers``: the other ranks that wait for its rank (in backward or a collective)."""
    r = p.record
    section = ev.stack(r)
    frames = section.stack if section else ()
    facts = ev.proc(r)
    io_frame = next((f for f in frames if any(k in f.file for k in IO_FRAMES)), None)
    blocked_io = (facts is not None and facts.syscall in ("read", "pread64", "readv", "open", "openat")) \
        or r.phase in ("data.open", "read") or bool(r.metrics.get("file"))  # our precompute's own phases
    file = r.metrics.get("file") or (facts.fd_path if facts else None)
    if r.item and "#" in r.item and not file:
        file = r.item.split("#")[0]  # our precompute names the shard in its item
    ev_lines = [f"{r.label}: {p.verdict.reason}"]
    if facts is not None and facts.describe():
        ev_lines.append(f"kernel: {facts.describe()}")
    if section is None:
        ev_lines.append("no stack dump of it yet")
    if peers:
        ev_lines.append(f"{_label_list(peers)}: waiting for rank {r.rank} (in backward or a collective)")
    where = where_of(ev, r, section)
    if io_frame is not None:
        where["frame"] = str(io_frame)
    run = ev.view.run_id
    worker_opt = f"--rank {r.rank or 0} --worker {r.worker}"
    item = r.item or "a batch"
    rank_label = f"rank {r.rank or 0}"
    waiting = f"; {rank_label} waits for the batch" + (f", {_wait(peers)} for {rank_label}" if peers else "")
    since = max(r.progress_at, r.phase_at)
    if io_frame is not None or blocked_io:
        lib = "h5py" if io_frame is not None and "h5py" in io_frame.file else "I/O"
        opening = (r.phase == "data.open" or (facts is not None and facts.syscall in ("open", "openat"))
                   or any(f.function in ("make_fid", "__init__", "open") for f in frames[:3]))
        what = f"{'opening' if opening else 'reading'} " + (os.path.basename(file) if file else "a file")
        return Verdict("worker_stuck_in_read", f"{r.label} is stuck {what} ({lib}) while fetching {item}{waiting}",
                       who=who_of(r), where=where, since=since, evidence=ev_lines + ([f"file: {file}"] if file else []),
                       next=f"check the storage of {file or 'the data'} (a hung mount?), then `ups kill {run} {worker_opt}`"
                            f" or `ups relaunch {run} --num-workers 0`")
    in_fn = f" in {where['function']}" if where.get("function") else ""
    return Verdict("worker_stuck", f"{r.label} is stuck{in_fn} while fetching {item} ({p.verdict.health.value}){waiting}",
                   who=who_of(r), where=where, since=since, evidence=ev_lines,
                   next=f"ups stacks {run} {worker_opt}" if section is None else
                   f"fix {where.get('site') or 'the Dataset'} (what it waits for at {item}), then `ups relaunch {run}`"
                   f" (or `ups kill {run} {worker_opt}`)")


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
    r = p.record
    section = ev.stack(r)
    peers = [q for q in ev.processes("rank") if q is not p and q.record.state == "running"
             and q.verdict.health not in (Health.STALLED, Health.UNRESPONSIVE)]
    many = len(ev.processes("rank")) > 1
    if r.role == "rank" and many and (section is None or (peers and (_in_backward(ev, p) or r.collective))):
        # A rank of a multi-rank run that stopped while its peers have not (yet): waiting for a
        # peer (DDP's all-reduce in backward, a collective) or stuck itself; its stack and its
        # peers' next seconds decide. Blame no one before that.
        what = "waits in DDP's gradient all-reduce (backward)" if section is not None and _in_backward(ev, p) else (
            f"waits in {r.collective['op']}" if r.collective else "has no stack dump yet")
        others = f" ({_label_list(peers)} not in trouble yet)" if peers else ""
        return Verdict("settling", f"{r.label} is {p.verdict.health.value} in phase {r.phase} and {what}; settling…{others}",
                       since=max(r.progress_at, r.phase_at),
                       evidence=[p.verdict.reason], next=f"ups stacks {ev.view.run_id} --group")
    facts = ev.proc(r)
    ev_lines = [p.verdict.reason] + ([f"kernel: {facts.describe()}"] if facts and facts.describe() else [])
    others = [q for q in troubled if q is not p]
    if others:
        ev_lines.append(f"also {', '.join(q.record.label for q in others[:4])}")
    opt = f" --rank {r.rank}" if r.role == "rank" else (f" --rank {r.rank or 0} --worker {r.worker}" if r.role == "worker" else "")
    return Verdict(p.verdict.health.value, f"{r.label} is {p.verdict.health.value} in phase {r.phase}",
                   who=who_of(r), where=where_of(ev, r, section), since=max(r.progress_at, r.phase_at), evidence=ev_lines,
                   next=f"ups stacks {ev.view.run_id}{opt}")


def oom_skipped(ev: Evidence) -> Verdict | None:
    for p in ev.processes("rank"):
        if p.record.metrics.get("skipped_steps"):
            lines = _grep(ev.job_log, OOM, 2)
            rank_line = next((ln for ln in reversed(lines) if "rank" in ln), lines[-1] if lines else "")
            m = re.search(r"rank (\d+)", rank_line)
            who = next((q.record for q in ev.processes("rank") if m and q.record.rank == int(m.group(1))), p.record)
            step = re.search(r"step (\d+)", rank_line)
            v = oom_verdict(ev, who, fatal=False, error=rank_line)
            if step:
                v.headline = v.headline.replace(f"at step {who.step}", f"at step {step.group(1)}")
            return v
    return None


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


# ended_training / live_training: verdicts on the training's own metrics (NaN, divergence,
# step rate, GPU memory), kept in ups.why.metric_rules.
RULES: tuple[Rule, ...] = (lost_node, ended_training, ended, full_disk, unsupervised, settling, live_failure, collectives,
                          ddp_backward, starved_loader, stuck_workers, dead, hung, gpu_straggler, live_training,
                          oom_skipped)
