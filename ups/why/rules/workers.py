"""DataLoader workers: a worker stuck in a sample (in a read, in its own code), a worker's
exception or death that failed its rank, workers out of file descriptors or shared memory,
and the worker a rank waits on."""

from __future__ import annotations

import os
import re

from ups.runs.view import ProcessView
from ups.status.health import Health
from ups.status.record import StatusRecord
from ups.why import stacks
from ups.why.evidence import Evidence
from ups.why.loaderwords import EXITED, named_workers, worker_deaths
from ups.why.rules.common import (
    ended_at,
    first_line,
    function_of,
    grep_lines,
    label_list,
    shown_function,
    waits,
    where_of,
)
from ups.why.verdict import Verdict, who_of

# An exception raised in a DataLoader worker reaches the rank as "Caught X in DataLoader
# worker process N", followed by the worker's own traceback.
WORKER_CAUGHT = re.compile(r"Caught (?P<exc>\w+) in DataLoader worker process (?P<worker>\d+)")
# CUDA touched inside a worker: forked after the parent initialised CUDA (GPU), or on a box or
# build without it (the CPU analogue): the Dataset must hand back CPU tensors.
CUDA_IN_WORKER = re.compile(r"Cannot re-initialize CUDA in forked subprocess|Torch not compiled with CUDA enabled|"
                            r"Found no NVIDIA driver|CUDA driver initialization failed", re.I)
DATALOADER_RESOURCES = re.compile(
    r"Too many open files|EMFILE|received 0 items of ancdata|shared memory|/dev/shm|Bus error|"
    r"unable to (open|mmap|write to) .*shm|No space left on device.*shm", re.I)
IO_FRAMES = ("h5py", "netCDF4", "zarr", "io.py", "/fsspec/", "pyarrow")


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
    where = {"phase": "fetch", "site": own.site if own else None, **function_of(own),
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
                       who=who_of(worker or rank), where=where, since=ended_at(ev, rank),
                       evidence=[f"{rank.label}: {first_line(text)}"],
                       next=f"return CPU tensors from the Dataset and move batches to the GPU in the training loop (fix "
                            f"{where['site'] or 'its __getitem__'}); a worker that must use CUDA needs "
                            f"multiprocessing_context='spawn'; or `ups relaunch {run} --num-workers 0`")
    return Verdict("worker_exception", f"{label} raised {said}{fetching}; {rank.label} failed with it",
                   who=who_of(worker or rank), where=where, since=ended_at(ev, rank),
                   evidence=[f"{rank.label}: {first_line(text)}"],
                   next=f"fix {where['site'] or 'the Dataset'} (the sample in that batch), then `ups relaunch {run}`")


def dataloader_worker_failure(ev: Evidence, rank: StatusRecord, error: str) -> Verdict | None:
    if "DataLoader worker" not in error and not DATALOADER_RESOURCES.search(error):
        return None
    workers = [p for p in ev.processes("worker") if p.record.rank == rank.rank]
    bad = [p for p in workers if p.verdict.health in (Health.DEAD, Health.FAILED)]
    pids = named_workers(error)
    named = [p for p in workers if p.record.pid in pids] or bad
    worker = named[0].record if named else None
    if DATALOADER_RESOURCES.search(error):
        return resources_verdict(ev, worker or rank, error, rank=rank)
    if worker is None:
        return None
    fatal = ev.stack(worker, "fatal")
    how = next((how for _, how in worker_deaths(error)), EXITED)
    signal = how != EXITED
    what = how.replace("killed by signal: ", "killed by ") if signal else EXITED
    return Verdict("crashed_by_signal" if signal else "failed",
                   f"{worker.label} {what} while fetching {worker.item or 'a batch'}; {rank.label} failed with it",
                   who=who_of(worker), where=where_of(ev, worker, fatal), since=ended_at(ev, worker),
                   evidence=[first_line(error)] + ([f"faulthandler: {fatal.title}"] if fatal else []),
                   next=f"ups relaunch {ev.view.run_id} --num-workers 0")


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
        shm = ev.host.shm
        if shm:
            figures.append(f"/dev/shm is {shm[0] / 2**30:.1f} GiB, {shm[1] / 2**30:.1f} GiB free now")
        fix = f"a larger /dev/shm (docker --shm-size=8g), fewer workers or a smaller batch, or `ups relaunch {ev.view.run_id} --num-workers 0`"
        what = "ran out of shared memory"
    who = record if record.role == "worker" else (rank or record)
    return Verdict("dataloader_resources", f"DataLoader workers of {(rank or record).label} {what}",
                   who=who_of(who), where=where_of(ev, who), since=ended_at(ev, who),
                   evidence=[first_line(error)] + figures, next=fix)


def starved_lines(log: str) -> str:
    """The log's last lines saying DataLoader workers ran out of descriptors or shared memory,
    newest first ("" when none)."""
    return "\n".join(reversed(grep_lines(log[-200_000:], DATALOADER_RESOURCES, 2)))


def starved_loader(ev: Evidence) -> Verdict | None:
    """Workers out of file descriptors or shared memory rarely crash the loop: the worker's
    resource sharer dies with EMFILE and the main process waits forever for the batch. The
    log says why while the rank stalls in its DataLoader."""
    stuck = [p for p in ev.processes("rank", "worker") if p.record.state == "running"
             and p.verdict.health in (Health.STALLED, Health.UNRESPONSIVE)]
    if not stuck:
        return None
    lines = starved_lines(ev.job_log)
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


def starting_worker(ev: Evidence, rank: ProcessView) -> tuple[ProcessView, str, str] | None:
    """A DataLoader worker of this rank that is starting (its ``worker_init_fn`` running, no
    sample fetched yet) while the rank waits in ``next(it)`` (an epoch's re-warm): the worker,
    what the launcher sees it do (``busy``, or ``checking`` before its first window) and the
    figures. A worker seen idle is not returned: the rank may be stuck on it."""
    r = rank.record
    if r.role != "rank" or r.phase != "data" or r.state != "running":
        return None
    for p in ev.processes("worker"):
        w = p.record
        if (w.rank == r.rank and w.state == "running" and w.phase == "idle" and w.step == 0
                and p.verdict.health not in (Health.DEAD, Health.DONE, Health.FAILED, Health.UNRESPONSIVE)):
            state, doing = ev.doing(p)
            if state in ("busy", "checking"):
                return p, state, doing
    return None


READ_CALLS = ("read", "pread64", "readv", "open", "openat")
SLEEP_CALLS = ("clock_nanosleep", "nanosleep", "futex", "poll", "ppoll", "select", "pselect6", "epoll_wait",
               "epoll_pwait", "epoll_pwait2", "wait4")


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
    # "Where" is what the worker does now (its stack, its kernel wait), never the last file it
    # touched: a worker asleep in its own code after closing a file is not reading that file.
    asleep = facts is not None and facts.syscall in SLEEP_CALLS and facts.state != "D"
    blocked_io = io_frame is not None or (facts is not None and (facts.syscall in READ_CALLS or facts.state == "D")) \
        or (r.phase in ("data.open", "read") and not asleep)  # our precompute's own phases
    file = (facts.fd_path if facts else None) or (r.metrics.get("file") if blocked_io else None)
    if r.item and "#" in r.item and not file:
        file = r.item.split("#")[0]  # our precompute names the shard in its item
    ev_lines = [f"{r.label}: {p.verdict.reason}"]
    if facts is not None and facts.describe():
        ev_lines.append(f"kernel: {facts.describe()}")
    if section is None:
        ev_lines.append("no stack dump of it yet")
    if peers:
        ev_lines.append(f"{label_list(peers)}: waiting for rank {r.rank} (in backward or a collective)")
    where = where_of(ev, r, section)
    if io_frame is not None:
        where["frame"] = str(io_frame)
    run = ev.view.run_id
    worker_opt = f"--rank {r.rank or 0} --worker {r.worker}"
    item = r.item or "a batch"
    rank_label = f"rank {r.rank or 0}"
    waiting = f"; {rank_label} waits for the batch" + (f", {waits(peers)} for {rank_label}" if peers else "")
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
    in_fn = f" in {shown_function(where)}" if where.get("function") else ""
    return Verdict("worker_stuck", f"{r.label} is stuck{in_fn} while fetching {item} ({p.verdict.health.value}){waiting}",
                   who=who_of(r), where=where, since=since, evidence=ev_lines,
                   next=f"ups stacks {run} {worker_opt}" if section is None else
                   f"fix {where.get('site') or 'the Dataset'} (what it waits for at {item}), then `ups relaunch {run}`"
                   f" (or `ups kill {run} {worker_opt}`)")
