"""Ended runs and processes that ended: how a run ended (succeeded, killed, lost, failed) and
what kind of failure the first failing process had, from its own words (the exception, the
signal and the faulthandler frame, the log): out of memory, a full disk, a rendezvous that
failed, a kill from outside, a crash; and a live run winding down after a rank ended.

:func:`classify_failure` asks the other families first where they know the failure better
(the GPU's fault, the DataLoader worker's exception, a collective that timed out or
mismatched).
"""

from __future__ import annotations

import os
import re

from ups.runs.view import ProcessView
from ups.status.health import Health
from ups.status.record import StatusRecord
from ups.why.evidence import Evidence
from ups.why.logread import Reading, read_log
from ups.why.rules.collectives import MISMATCH, collective_mismatch, collective_timeout
from ups.why.rules.common import ended_at, first_line, grep_lines, where_of
from ups.why.rules.hardware import gpu_fault
from ups.why.rules.workers import (
    DATALOADER_RESOURCES,
    dataloader_worker_failure,
    resources_verdict,
    starved_lines,
    worker_exception,
)
from ups.why.tracebacks import frames_in
from ups.why.verdict import Verdict, who_of

# A skipped step's note in the job's log (ups.jobs.train): CUDA's words, or the CPU allocator's.
OOM = re.compile(r"out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED|can't allocate memory|"
                 r"Cannot allocate memory", re.I)
# The lines that show a write failed (ups.why.logread names the class; these are its evidence).
DISK_FULL = re.compile(r"No space left on device|ENOSPC|\[Errno 28\]|file write failed|Disk quota exceeded|"
                       r"unexpected pos \d+ vs \d+")
# The process's own words (its error, its exception) read as ups.why.logread reads a log.
OUT_OF_MEMORY = ("cuda_oom", "host_oom")
WRITE_FAILED = ("disk_full", "disk_quota")
RENDEZVOUS = re.compile(
    r"address already in use|EADDRINUSE|Connection refused|ECONNREFUSED|Rendezvous\w*Error|rendezvous|"
    r"server socket has failed to listen|failed to connect|Name or service not known|No route to host|"
    r"timed out after .* (store|TCPStore)|Socket Timeout|DistStoreError|client socket has timed out", re.I)
SAVE_NOTE = re.compile(r"\(ups: while torch\.save wrote (?P<file>[^)]+)\)")
CANNOT_WRITE = re.compile(r"cannot write (?P<file>\S+?):")


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
    if state == "ended":
        return Verdict("ended", f"the job ended, and its log names no failure; whether it succeeded is not known ({summary})",
                       ok=True, evidence=["ups attached to this job from outside: its processes' exit codes are not "
                                          "visible (only the parent that reaps a process learns its code)"],
                       next=f"the job's own output or its scheduler (sacct) says how it exited; ups status {view.run_id}")
    if state == "killed":
        kill = next((e for e in reversed(ev.events) if e.get("event") == "kill"), {})
        who = kill.get("actor", "an operator")
        return Verdict("killed", f"the run was stopped by {who}" + (f" ({kill['reason']})" if kill.get("reason") else ""),
                       evidence=[summary] if summary else [], next=f"ups relaunch {view.run_id}")
    by_watchdog = _ended_on_hang(ev)
    if by_watchdog is not None:
        return by_watchdog
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


def _ended_on_hang(ev: Evidence) -> Verdict | None:
    """A run that ups's own watchdog ended (--on-hang kill, or restarts spent) failed of the hang
    it proved, not of the SIGTERM it sent: the verdict that ended it, said as such."""
    m = ev.manifest
    if m.get("state") != "failed":
        return None
    hang = next((e for e in reversed(ev.events) if e.get("event") == "hang"), None)
    if hang is None or not str(hang.get("action") or "").startswith("kill"):
        return None
    attempts = [a for a in m.get("attempts") or [] if isinstance(a, dict) and isinstance(a.get("verdict"), dict)]
    said = attempts[-1]["verdict"] if attempts else {}
    how = "ended by ups on a proven hang" if hang["action"] == "kill" else f"ended by ups on a proven hang ({hang['action']})"
    proof = (hang.get("proof") or {}).get("text") if isinstance(hang.get("proof"), dict) else None
    who = said.get("who") if isinstance(said.get("who"), dict) else None
    where = said.get("where") if isinstance(said.get("where"), dict) else None
    headline = f"{how}: {hang.get('headline') or said.get('headline')}"
    reason = hang.get("reason")
    if isinstance(reason, str) and reason.startswith("not restarted"):  # the restart policy's refusal, said first
        headline = f"{reason} ({hang.get('headline') or said.get('headline')})"
    return Verdict(str(hang.get("mode") or said.get("mode") or "hung"), headline,
                   who=who, where=where, since=said.get("since") if isinstance(said.get("since"), (int, float)) else None,
                   evidence=[str(e) for e in said.get("evidence") or [] if isinstance(e, str)][:4]
                   + ([f"proof: {proof}"] if proof else []),
                   next=(f"fix {where['site']}, then ups relaunch {ev.view.run_id}" if where and where.get("site")
                         else f"ups stacks {ev.view.run_id} --group"))


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
    worker_verdict = dataloader_worker_failure(ev, record, error)
    if worker_verdict is not None:
        return worker_verdict
    starved = starved_lines(log or ev.job_log)
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
    said = read_log(error)
    raised = read_log(_exception_text(ev, record))
    if said.name in OUT_OF_MEMORY or (signal_name is None and record.state == "failed" and raised.name in OUT_OF_MEMORY):
        return oom_verdict(ev, record, fatal=True, error=error if said.name in OUT_OF_MEMORY else raised.line)
    if said.name in WRITE_FAILED or raised.name in WRITE_FAILED:
        return disk_full_verdict(ev, record, error + "\n" + _exception_text(ev, record))
    if DATALOADER_RESOURCES.search(error):
        return resources_verdict(ev, record, error)
    if signal_name in ("SIGKILL", "SIGTERM") and not _signalled_by_ups(ev, record):
        return outside_signal_verdict(ev, record, signal_name, failure)
    logged = read_log("\n".join((error, _exception_text(ev, record), log[-20_000:])))
    if logged.cls is not None:
        return log_class_verdict(ev, record, logged, failure)
    if signal_name:
        fatal = ev.stack(record, "fatal")
        where = where_of(ev, record, fatal)
        ev_lines = [f"faulthandler: {fatal.title}" + (f", main thread in {fatal.top}" if fatal and fatal.top else "")] if fatal else []
        if not fatal:
            ev_lines.append("no faulthandler traceback in its stack file")
        return Verdict("crashed_by_signal", f"{record.label} was killed by {signal_name} in phase {record.phase}",
                       who=who, where=where, since=ended_at(ev, record), evidence=ev_lines + _followers(failure),
                       next=f"ups stacks {ev.view.run_id} --rank {record.rank}")
    if record.state == "running" or failure.get("clean") is False:
        return Verdict("no_normal_exit",
                       f"{record.label} ended without a normal interpreter exit (os._exit or a signal) in phase "
                       f"{record.phase}, last recorded at step {record.step}" + _while_peers(ev, record),
                       who=who, where=where_of(ev, record), since=ended_at(ev, record),
                       evidence=_followers(failure),
                       next=f"ups logs {ev.view.run_id} --rank {record.rank}")
    if error:
        section = ev.stack(record, "exception")
        where = where_of(ev, record, section)
        where["site"] = record.error_site or where.get("site")
        message = error.split(" (at ")[0]
        return Verdict("exception", f"{record.label} raised {message}", who=who, where=where,
                       since=ended_at(ev, record), evidence=_followers(failure),
                       next=f"ups logs {ev.view.run_id}" + (f" --rank {record.rank}" if record.role == "rank" else ""))
    return None


def _signalled_by_ups(ev: Evidence, record: StatusRecord) -> bool:
    """ups sent this process a signal (a kill of the run, a signal to it): events.jsonl says."""
    return any(e.get("event") == "kill" or (e.get("event") == "signal" and e.get("target") == record.name)
               for e in ev.events)


def outside_signal_verdict(ev: Evidence, record: StatusRecord, signal_name: str, failure: dict) -> Verdict:
    """The first process to end was killed by SIGKILL or SIGTERM that neither ups nor its launcher
    sent (events.jsonl has no kill or signal for it): the kernel's OOM killer, a scheduler's
    preemption, an operator's kill."""
    run = ev.view.run_id
    where = where_of(ev, record)
    end = ended_at(ev, record)
    if signal_name == "SIGKILL":
        kills = ev.host.oom_kills
        if kills:
            return Verdict("oom_killed", f"{record.label} was killed by the kernel's OOM killer (SIGKILL) in phase {record.phase}",
                           who=who_of(record), where=where, since=end,
                           evidence=[f"cgroup memory.events: oom_kill {kills}", "no kill or signal from ups in events.jsonl"]
                           + _followers(failure),
                           next="use less host memory per process (fewer DataLoader workers, smaller prefetch or batch), "
                                f"or a box with more RAM; then `ups relaunch {run}`")
        return Verdict("killed_from_outside", f"{record.label} was killed by SIGKILL from outside ups in phase {record.phase}",
                       who=who_of(record), where=where, since=end,
                       evidence=["no kill or signal from ups in events.jsonl",
                                 "no OOM kill counted in this cgroup's memory.events" if kills == 0 else
                                 "memory.events not readable here"] + _followers(failure),
                       next="check `dmesg | grep -i -e oom -e killed` (the kernel's OOM killer) and who else can kill "
                            f"this user's processes; then `ups relaunch {run}`")
    return Verdict("stopped_from_outside", f"{record.label} was stopped from outside (SIGTERM, not sent by ups or its launcher) "
                   f"in phase {record.phase}, at step {record.step}",
                   who=who_of(record), where=where, since=end,
                   evidence=["no kill or signal from ups in events.jsonl: a scheduler's preemption, a job time limit or "
                             "someone's kill"] + _followers(failure),
                   next=f"check the scheduler's log for a preemption or time limit; `ups relaunch {run}` resumes")


def log_class_verdict(ev: Evidence, record: StatusRecord, reading: Reading, failure: dict) -> Verdict:
    """A failure the process's own words name (ups.why.logread): what, where, the fix."""
    assert reading.cls is not None
    section = ev.stack(record, "exception")
    where = where_of(ev, record, section)
    where["site"] = record.error_site or where.get("site") or reading.site
    return Verdict(reading.cls.name, f"{record.label} failed: {reading.cls.what}", who=who_of(record), where=where,
                   since=ended_at(ev, record), evidence=[first_line(reading.line)] + _followers(failure),
                   next=reading.cls.fix)


def _exception_text(ev: Evidence, record: StatusRecord) -> str:
    section = ev.stack(record, "exception")
    return section.text if section else ""


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


def oom_verdict(ev: Evidence, record: StatusRecord, *, fatal: bool, error: str) -> Verdict:
    skipped = record.metrics.get("skipped_steps")
    how = "fatal: the process ended" if fatal else f"the step was skipped on every rank ({skipped} so far); training goes on"
    gpu = record.gpu
    ev_lines = [first_line(error)] if error else []
    if gpu is not None and gpu.peak:
        ev_lines.append(f"peak CUDA memory {gpu.peak / 2**30:.1f} GiB on device {gpu.device}")
    return Verdict("out_of_memory", f"{record.label} ran out of memory at step {record.step} ({how})", ok=False,
                   who=who_of(record), where=where_of(ev, record), since=ended_at(ev, record), evidence=ev_lines,
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
    free = ev.host.free_bytes(os.path.dirname(target) or ".") if target else None
    ev_lines = [first_line(t) for t in grep_lines(text, DISK_FULL, 2)]
    if free is not None:
        ev_lines.append(f"{free / 2**30:.1f} GiB free there now")
    return Verdict("disk_full", f"disk full: {record.label} failed {what} ({kind}) in phase {record.phase}",
                   who=who_of(record), where=where_of(ev, record), since=ended_at(ev, record), evidence=ev_lines,
                   next=f"free space on {os.path.dirname(target) if target else 'the output disk'} (df -h), then `ups relaunch {ev.view.run_id}`")


def rendezvous_verdict(ev: Evidence, record: StatusRecord, text: str) -> Verdict | None:
    lines = [ln for ln in grep_lines(text, RENDEZVOUS, 8) if not frames_in(ln)][-4:]
    if not lines:
        return None
    endpoint = _endpoint(ev, text)
    holder = ev.host.port_holder(endpoint[1]) if endpoint and endpoint[1] else None
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
    frames = frames_in(text) if agent else []
    frame = f"{os.path.basename(frames[-1][0])}:{frames[-1][1]} in {frames[-1][2]}" if frames else None
    stage = "dist.init" if record.phase == "dist.init" else "rendezvous"
    who = "torchrun's agent" if agent else record.label
    return Verdict("rendezvous_failed", f"{who} could not rendezvous at {at}" + (" in dist.init" if stage == "dist.init" else "") + f": {reason}",
                   who=who_of(record), where={"phase": stage, "site": None if agent else record.error_site,
                                              "function": None, "frame": frame},
                   since=ended_at(ev, record), evidence=ev_lines,
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
            return f"{r.label} failed ({first_line(r.error, 120) or 'no error text'})"
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


def oom_skipped(ev: Evidence) -> Verdict | None:
    for p in ev.processes("rank"):
        if p.record.metrics.get("skipped_steps"):
            lines = grep_lines(ev.job_log, OOM, 2)
            rank_line = next((ln for ln in reversed(lines) if "rank" in ln), lines[-1] if lines else "")
            m = re.search(r"rank (\d+)", rank_line)
            who = next((q.record for q in ev.processes("rank") if m and q.record.rank == int(m.group(1))), p.record)
            step = re.search(r"step (\d+)", rank_line)
            v = oom_verdict(ev, who, fatal=False, error=rank_line)
            if step:
                v.headline = v.headline.replace(f"at step {who.step}", f"at step {step.group(1)}")
            return v
    return None
