"""What this process is, as the instrumentation's hooks share it: its record, its parent,
how it exits, and the changes of role a process goes through (a helper that joins a process
group becomes that rank; the parent of ``mp.spawn`` stops being one).

:mod:`ups.instrument.boot` decides the role at start-up and installs the process hooks; the
torch, I/O and logging hooks (:mod:`ups.instrument.torch`, ``io_hooks``, ``loggers``)
read and change the state here. Nothing here may break the program: failures are one warning
line on stderr.
"""

from __future__ import annotations

import os
import sys

from ups.status.reporter import Reporter

ENV_TOP_ROLE = "UPS_TOP_ROLE"
ENV_PARENT = "UPS_PARENT"
ENV_TOTAL_STEPS = "UPS_TOTAL_STEPS"
ENV_INTERVAL = "UPS_HEARTBEAT_INTERVAL"
ENV_NODE_RANK = "UPS_NODE_RANK"
ENV_NODE = "UPS_NODE"  # set by the launcher of a multi-node run: this node's host name
ENV_SPAWN_NPROCS = "UPS_SPAWN_NPROCS"  # set by mp.spawn's parent for the processes it starts


class _State:
    """Process-wide facts the hooks share (one instance, reset in a forked child)."""

    rep: Reporter | None = None
    parent: tuple[str, int, int] | None = None  # role, pid, rank of the process that made us
    exit_code: int | None = None
    failure_recorded = False
    warned: set[str] = set()
    booted = False


state = _State()


def warn(message: str) -> None:
    """One line on stderr per distinct problem; the program goes on."""
    if message in state.warned:
        return
    state.warned.add(message)
    try:
        print(f"ups: {message}; the program runs on", file=sys.stderr, flush=True)
    except Exception:  # noqa: BLE001
        pass


def env_int(name: str, default: int | None = None) -> int | None:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return default


def argv_text() -> str:
    return " ".join(getattr(sys, "orig_argv", None) or sys.argv or [])


def _metrics_sampler() -> dict:
    """The training metrics, once there can be any: ups.instrument.metrics is imported with
    the torch hooks (or a logging library's)."""
    metrics = sys.modules.get("ups.instrument.metrics")
    return metrics.sampler() if metrics is not None else {}


def start_reporter(role: str, *, worker: int | None = None, loader: int | None = None, rank: int | None = None,
                   command: str | None = None, local_rank: int | None = None, world_size: int | None = None,
                   name: str | None = None, metrics: dict | None = None) -> Reporter | None:
    """Start this process's record (the one and only of this process); ``metrics`` are in
    its first write."""
    run_dir = os.environ.get("UPS_RUN_DIR")
    if not run_dir:
        return None
    interval = float(os.environ.get(ENV_INTERVAL) or 1.0)
    parent_rank = state.parent[2] if state.parent else 0
    kwargs: dict = {"interval": interval, "command": command[:300] if command else None, "name": name}
    if role == "rank":
        rank = env_int("RANK", 0) if rank is None else rank
        kwargs.update(rank=rank, local_rank=env_int("LOCAL_RANK", rank) if local_rank is None else local_rank,
                      world_size=env_int("WORLD_SIZE", 1) if world_size is None else world_size,
                      **_rank_extras())
    elif role == "worker":
        kwargs.update(rank=parent_rank if rank is None else rank, worker=worker, loader=loader, unit="samples",
                      phase="idle")
    elif role == "helper":
        kwargs.update(rank=parent_rank, phase="helper", unit="items")
    elif role == "agent":
        kwargs.update(phase="agent", node=env_int(ENV_NODE_RANK), unit="items")
        if os.environ.get(ENV_NODE):
            from ups.status.schema import process_name

            kwargs["name"] = process_name("agent", host=os.environ[ENV_NODE])
    rep = Reporter(run_dir, role=role, **kwargs)
    rep.register_current()
    if role in ("rank", "worker"):
        # The open-file limit DataLoader workers run into (one descriptor per tensor passed
        # between processes): kept in the record, so a verdict can quote it after the process is gone.
        import resource

        rep.metrics(nofile_limit=resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    if metrics:
        rep.metrics(**metrics)
    if role == "rank":
        rep.add_sampler(_metrics_sampler)  # loss, lr, grad norm ... read by the heartbeat thread
    state.rep = rep
    rep.start()
    _tell_children(rep)
    return rep


def _rank_extras() -> dict:
    return {"unit": "batches", "total": env_int(ENV_TOTAL_STEPS), "gpu_sampler": _cuda_sampler}


def _tell_children(rep: Reporter) -> None:
    os.environ[ENV_PARENT] = f"{rep.role}:{os.getpid()}:{rep.rank or 0}"


def become_rank(rank: int, world_size: int | None) -> None:
    """This process initialised a process group as ``rank`` of ``world_size``: its record is
    that rank's, whatever it was started as (a helper, a provisional rank of another number)."""
    rep = state.rep
    if rep is None or rep.pid != os.getpid() or rep.role not in ("rank", "helper"):
        return
    if rep.role == "rank" and rep.rank == rank:
        if world_size is not None:
            rep.set_world(world_size)
        return
    if _claimed_by_another(rank):
        # e.g. a launcher script under `ups launch python` (itself rank 0 by default) that starts
        # its ranks with the rank on their command line: never overwrite a live process's record.
        rep.metrics(process_group_rank=rank)
        return
    was = rep.name
    local = env_int("LOCAL_RANK")
    if rep.role == "helper":
        rep.set_gpu_sampler(_cuda_sampler)
        extras = _rank_extras()
        if extras["total"] is not None:
            rep.set_total(extras["total"])
    helper = rep.role == "helper"  # a helper's phase and unit were a helper's; the group is joined now
    rep.relabel("rank", rank=rank, world_size=world_size, local_rank=local if local is not None else rank,
                command="", phase="start" if helper else None, unit="batches" if helper else None)
    rep.metrics(was=was)
    _tell_children(rep)


def _claimed_by_another(rank: int) -> bool:
    """Another live process of this run writes the record of ``rank`` already."""
    run_dir = os.environ.get("UPS_RUN_DIR")
    if not run_dir:
        return False
    from ups.status.safeio import BadFile, read_json  # the runs folder is outside input

    try:
        pid = read_json(os.path.join(run_dir, "status", f"rank-{rank}.json")).get("pid")
    except (BadFile, OSError, AttributeError):
        return False
    if not isinstance(pid, int) or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def become_spawner(what: str) -> None:
    """This process starts ranks (``mp.spawn``) without being one: its rank record becomes a
    helper's, so the ranks it starts are the only ranks (and rank 0 is not counted twice)."""
    rep = state.rep
    if rep is None or rep.pid != os.getpid() or rep.role != "rank":
        return
    torch = sys.modules.get("torch")
    dist = getattr(torch, "distributed", None)
    if dist is not None and dist.is_available() and dist.is_initialized():
        return  # a rank that starts helpers of its own stays a rank
    from ups.status.schema import process_name

    rep.relabel("helper", rank=rep.rank, name=process_name("helper", rep.rank, pid=rep.pid),
                command=f"{what}: {argv_text()}", phase="helper", unit="items")
    rep.item(what)  # what `ups status` shows beside it
    _tell_children(rep)


def record_failure(exc: BaseException) -> None:
    """An uncaught exception: record it, keep the full traceback, tell torchrun."""
    rep = state.rep
    if rep is None or state.failure_recorded or isinstance(exc, SystemExit):
        return
    state.failure_recorded = True
    import traceback

    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    rep.append_stack_text(f"\n=== uncaught exception in {rep.name} (pid {os.getpid()}) ===\n{text}")
    rep.fail(exc, exit_code=1)
    _write_torchelastic_error_file(exc, text)


def _write_torchelastic_error_file(exc: BaseException, text: str) -> None:
    """torchrun reads this file to name the root cause; without ``@record`` it says <N/A>.
    Same format as torch.distributed.elastic's ErrorHandler; never overwrites a file that
    the program's own ``@record`` wrote."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path or os.path.exists(path):
        return
    import json
    import time

    data = {"message": {"message": f"{type(exc).__name__}: {exc}",
                        "extraInfo": {"py_callstack": text, "timestamp": str(int(time.time()))}}}
    try:  # a new file, never one found there nor through a link (it is in the run's logs/)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh)
    except OSError:
        pass


# ------------------------------------------------------------------------------- GPU
def _cuda_sampler():
    """CUDA memory of this rank's device, read by the heartbeat thread; never initialises
    CUDA (that would break fork-based DataLoader workers)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    torch_state = sys.modules.get("ups.instrument.torch.state")  # imported with torch, when torch is
    device = torch_state.cuda_device() if torch_state is not None else None
    if device is None or not torch.cuda.is_initialized():
        return None
    from ups.status.record import GpuMemory

    stats = torch.cuda.memory_stats(device)
    rep = state.rep
    if rep is not None and not rep.has_metric("gpu_total"):  # for the leak verdict's "runs out at step N"
        rep.metrics(gpu_total=torch.cuda.get_device_properties(device).total_memory)
    return GpuMemory(device, stats.get("allocated_bytes.all.current", 0), stats.get("reserved_bytes.all.current", 0),
                     stats.get("allocated_bytes.all.peak", 0))
