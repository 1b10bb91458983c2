"""Start-up of the instrumentation in one process of a job (called by our sitecustomize).

Every Python process of a job launched by ``ups launch`` comes through here. It decides what
the process is, starts its status record where that is known now, and installs the hooks
that follow the process through its life:

* **role** — the job's top process takes ``UPS_TOP_ROLE`` (``agent`` for torchrun and
  accelerate, ``rank`` for a plain ``python`` job and for each task of ``srun``); a process
  whose environment names a rank of its own is a rank (torchrun's, DeepSpeed's and
  accelerate's workers, Lightning's re-executed scripts, srun's tasks: see
  :mod:`ups.instrument.identity`); any other child of an instrumented process is a
  ``helper``. Children learn their parent from ``UPS_PARENT`` (``role:pid:rank``), which
  each recorded process sets in its own environment. Children of ``multiprocessing`` (fork
  or spawn) are decided when they start running (``BaseProcess._bootstrap``): a DataLoader
  worker gets a ``worker`` record from its init function (see
  :mod:`ups.instrument.torch_hooks`), a process of ``torch.multiprocessing.spawn`` a rank
  record (its index, until its process group says its global rank), anything else a
  helper record. Infrastructure processes (multiprocessing's resource tracker and fork
  server) get none.
* **what a process turns out to be** — any process that initialises a process group is a
  rank with the group's global rank (its helper record becomes a rank record); the parent
  of ``mp.spawn`` is not a rank (its rank record becomes a helper, "mp.spawn parent").
* **exit truth** — a normal interpreter exit writes the final record (``done``, or
  ``failed`` with the exit code of ``sys.exit``); an uncaught exception is recorded (type,
  message, file:line; the full traceback into the stack file) and written as torchrun's
  error file (``TORCHELASTIC_ERROR_FILE``), so the root cause is named without ``@record``.
  A process that ends any other way (``os._exit``, a signal) leaves a record that still says
  running: that absence is the evidence the launcher reads. ``os._exit`` (HF's and
  accelerate's way out, multiprocessing's) writes the record first, as it stands (step,
  phase), and the caller's stack into the stack file, so the verdict says where it left.
  A rank of ``mp.spawn`` whose exception torch's wrapper catches (it exits with
  ``sys.exit(1)``) has it recorded before the wrapper sees it.
* **fork** — a forked child never writes its parent's record or stack file.
* **torch** — patched by post-import hooks only if the program imports it.

Nothing here may break the program: failures are one warning line on stderr.
"""

from __future__ import annotations

import atexit
import os
import sys

from ups.status.reporter import Reporter

ENV_TOP_ROLE = "UPS_TOP_ROLE"
ENV_PARENT = "UPS_PARENT"
ENV_TOTAL_STEPS = "UPS_TOTAL_STEPS"
ENV_INTERVAL = "UPS_HEARTBEAT_INTERVAL"
ENV_NODE_RANK = "UPS_NODE_RANK"
ENV_NODE = "UPS_NODE"  # set by the launcher of a multi-node run: this node's host name

_INFRASTRUCTURE = ("multiprocessing.resource_tracker", "multiprocessing.forkserver", "multiprocessing.semaphore_tracker")


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


def _env_int(name: str, default: int | None = None) -> int | None:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return default


def _parse_parent() -> tuple[str, int, int] | None:
    raw = os.environ.get(ENV_PARENT)
    if not raw:
        return None
    try:
        role, pid, rank = raw.split(":")
        return role, int(pid), int(rank)
    except ValueError:
        return None


def _argv_text() -> str:
    return " ".join(getattr(sys, "orig_argv", None) or sys.argv or [])


def _is_infrastructure(text: str) -> bool:
    return any(name in text for name in _INFRASTRUCTURE)


def _is_multiprocessing_child() -> bool:
    return "--multiprocessing-fork" in (sys.argv or []) or "spawn_main" in _argv_text()


def boot() -> None:
    """Called once per process by sitecustomize."""
    if state.booted:
        return
    state.booted = True
    text = _argv_text()
    if _is_infrastructure(text):
        return  # the resource tracker and fork server: no record, no hooks
    state.parent = _parse_parent()
    _install_process_hooks()
    from ups.instrument import identity, imports

    # The torch and h5py hooks' modules are imported when the program imports those (most
    # of a job's processes never do: they do not pay for them at start-up).
    imports.when_imported("torch", _patch_torch)
    imports.when_imported("h5py", _patch_h5py)
    imports.when_imported("multiprocessing.process", _patch_multiprocessing)
    from ups.instrument import loggers

    loggers.install()  # wandb / TensorBoard / Lightning / HF Trainer logs, if the program imports them
    if _is_multiprocessing_child():
        return  # a worker or helper: decided in BaseProcess._bootstrap, once we know which
    parent = state.parent
    top_role = os.environ.get(ENV_TOP_ROLE, "rank")
    if top_role == "rank" and parent is None and identity.is_launcher_program(getattr(sys, "orig_argv", None) or sys.argv):
        top_role = "agent"  # `ups launch srun torchrun ...`: each task is a node's agent
    found = identity.own_rank(parent, top_role=top_role)
    identity.mark_for_children(identity.env_rank())
    if parent is None:
        role = top_role
    elif found is not None:
        role = "rank"
    else:
        role = "helper"
    if role == "rank" and found is not None:
        start_reporter(role, rank=found.rank, local_rank=found.local_rank, world_size=found.world_size)
    else:
        start_reporter(role, command=text if role in ("agent", "helper") else None)


def _patch_torch(torch) -> None:  # noqa: ANN001
    from ups.instrument import torch_hooks

    torch_hooks.patch_torch(torch)


def _patch_h5py(h5py) -> None:  # noqa: ANN001
    from ups.instrument import io_hooks

    io_hooks.patch_h5py(h5py)


def _metrics_sampler() -> dict:
    """The training metrics, once there can be any: ups.instrument.metrics is imported with
    the torch hooks (or a logging library's)."""
    metrics = sys.modules.get("ups.instrument.metrics")
    return metrics.sampler() if metrics is not None else {}


def start_reporter(role: str, *, worker: int | None = None, loader: int | None = None, rank: int | None = None,
                   command: str | None = None, local_rank: int | None = None, world_size: int | None = None,
                   name: str | None = None) -> Reporter | None:
    """Start this process's record (the one and only of this process)."""
    run_dir = os.environ.get("UPS_RUN_DIR")
    if not run_dir:
        return None
    interval = float(os.environ.get(ENV_INTERVAL) or 1.0)
    parent_rank = state.parent[2] if state.parent else 0
    kwargs: dict = {"interval": interval, "command": command[:300] if command else None, "name": name}
    if role == "rank":
        rank = _env_int("RANK", 0) if rank is None else rank
        kwargs.update(rank=rank, local_rank=_env_int("LOCAL_RANK", rank) if local_rank is None else local_rank,
                      world_size=_env_int("WORLD_SIZE", 1) if world_size is None else world_size,
                      **_rank_extras())
    elif role == "worker":
        kwargs.update(rank=parent_rank if rank is None else rank, worker=worker, loader=loader, unit="samples",
                      phase="idle")
    elif role == "helper":
        kwargs.update(rank=parent_rank, phase="helper", unit="items")
    elif role == "agent":
        kwargs.update(phase="agent", node=_env_int(ENV_NODE_RANK), unit="items")
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
    if role == "rank":
        rep.add_sampler(_metrics_sampler)  # loss, lr, grad norm ... read by the heartbeat thread
    state.rep = rep
    rep.start()
    _tell_children(rep)
    return rep


def _rank_extras() -> dict:
    return {"unit": "batches", "total": _env_int(ENV_TOTAL_STEPS), "gpu_sampler": _cuda_sampler}


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
    local = _env_int("LOCAL_RANK")
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
                command=f"{what}: {_argv_text()}", phase="helper", unit="items")
    rep.item(what)  # what `ups status` shows beside it
    _tell_children(rep)


# ------------------------------------------------------------------------ process hooks
def _install_process_hooks() -> None:
    atexit.register(_at_exit)
    previous_hook = sys.excepthook

    def excepthook(tp, value, tb):  # noqa: ANN001 - the excepthook signature
        try:
            record_failure(value)
        except Exception:  # noqa: BLE001
            pass
        previous_hook(tp, value, tb)

    sys.excepthook = excepthook
    real_exit = sys.exit

    def exit(code=None):  # noqa: A001, ANN001 - same signature as sys.exit
        state.exit_code = code if isinstance(code, int) or code is None else 1
        real_exit(code)

    sys.exit = exit
    real_os_exit = os._exit

    def _exit(code):  # noqa: ANN001 - same signature as os._exit
        try:
            _record_os_exit(code)
        except Exception:  # noqa: BLE001
            pass
        real_os_exit(code)

    _exit.__ups_wrapped__ = real_os_exit  # type: ignore[attr-defined]
    os._exit = _exit
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_after_fork_in_child)


def _after_fork_in_child() -> None:
    """A forked child is not its parent: it must not write the parent's record or stacks."""
    rep = state.rep
    if rep is not None:
        state.parent = (rep.role, rep.pid, rep.rank or 0)
        os.environ[ENV_PARENT] = f"{rep.role}:{rep.pid}:{rep.rank or 0}"
    state.rep = None
    state.exit_code = None
    state.failure_recorded = False
    Reporter._current = None  # noqa: SLF001
    import faulthandler

    faulthandler.disable()
    torch_hooks = sys.modules.get("ups.instrument.torch_hooks")
    if torch_hooks is not None:
        torch_hooks.reset_after_fork()  # and the metrics' capture
    elif "ups.instrument.metrics" in sys.modules:  # a logging library's values, without torch
        sys.modules["ups.instrument.metrics"].reset_after_fork()


def _record_os_exit(code) -> None:  # noqa: ANN001
    """``os._exit`` skips atexit: write the record as it stands (step, phase: what the program
    reached, not what the last heartbeat saw) and where the call came from, then let it go.
    The record keeps saying running: that is the evidence of an exit that was not normal."""
    rep = state.rep
    if rep is None or rep.pid != os.getpid() or rep.state != "running":
        return  # multiprocessing's own os._exit after a child's target returned: already final
    if rep.role in ("rank", "helper"):
        import threading
        import time

        # faulthandler's format (what `ups stacks` and `ups why` read), from the caller of
        # os._exit: our own two frames are no part of where the program left.
        lines = [f"\n=== stack dump of {rep.name} pid {rep.pid} requested by os._exit({code}) at "
                 f"{time.strftime('%Y-%m-%d %H:%M:%S')} ===",
                 f"Current thread 0x{threading.get_ident():016x} (most recent call first):"]
        frame = sys._getframe(2)
        while frame is not None:
            lines.append(f'  File "{frame.f_code.co_filename}", line {frame.f_lineno} in {frame.f_code.co_name}')
            frame = frame.f_back
        rep.append_stack_text("\n".join(lines))
    rep.metrics(os_exit=code)
    rep.flush(wait=0.5)


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
    try:
        with open(path, "w") as fh:
            json.dump(data, fh)
    except OSError:
        pass


def _at_exit() -> None:
    """A normal interpreter exit: the final record. (os._exit and signals never get here.)"""
    rep = state.rep
    if rep is None or rep.pid != os.getpid():
        return
    try:
        if rep.state == "running":
            last = getattr(sys, "last_value", None)  # set for an uncaught exception, even if
            if last is not None:                     # the program replaced sys.excepthook
                record_failure(last)
            code = state.exit_code
            if rep.state == "running":
                if code:
                    rep.fail(f"exited with code {code}", exit_code=code)
                else:
                    rep.done(exit_code=0)
        rep.close()
    except Exception:  # noqa: BLE001
        pass


# ------------------------------------------------------------------ multiprocessing
def _patch_multiprocessing(module) -> None:  # noqa: ANN001
    cls = module.BaseProcess
    if getattr(cls._bootstrap, "__ups_wrapped__", None):
        return
    original = cls._bootstrap

    def _bootstrap(self, *args, **kwargs):  # noqa: ANN001
        # Runs in the child (fork, spawn, forkserver) before the target.
        if state.rep is None and os.environ.get("UPS_RUN_DIR"):
            target = getattr(self, "_target", None)
            if _is_spawned_rank(target):
                try:
                    _start_spawned_rank(self)
                except Exception as exc:  # noqa: BLE001
                    warn(f"no status record for this spawned rank ({exc})")
            elif getattr(target, "__name__", "") != "_worker_loop":  # DataLoader workers: see torch_hooks
                try:
                    start_reporter("helper", command=f"multiprocessing {getattr(self, 'name', '')}: "
                                                     f"{getattr(target, '__qualname__', target)}")
                except Exception as exc:  # noqa: BLE001
                    warn(f"no status record for this helper process ({exc})")
        code = original(self, *args, **kwargs)
        rep = state.rep  # the helper's, or the worker's that its init function started
        if rep is not None and rep.pid == os.getpid():
            try:
                if rep.state == "running":
                    if code:
                        rep.fail(f"exited with code {code}", exit_code=code)
                    else:
                        rep.done(exit_code=0)
                rep.close()
            except Exception:  # noqa: BLE001
                pass
        return code

    _bootstrap.__ups_wrapped__ = original  # type: ignore[attr-defined]
    cls._bootstrap = _bootstrap


def _is_spawned_rank(target) -> bool:  # noqa: ANN001
    return getattr(target, "__name__", "") == "_wrap" and getattr(target, "__module__", "") == "torch.multiprocessing.spawn"


ENV_SPAWN_NPROCS = "UPS_SPAWN_NPROCS"  # set by mp.spawn's parent for the processes it starts


def _start_spawned_rank(process) -> None:  # noqa: ANN001
    """A process of ``torch.multiprocessing.spawn``: ``_wrap(fn, i, args, error_file)``. It is
    rank ``i`` until its process group says otherwise (several nodes: i is the local rank). Its
    exception is recorded before torch's wrapper catches it and exits with ``sys.exit(1)``."""
    fn, index, *rest = process._args
    world = _env_int(ENV_SPAWN_NPROCS)
    start_reporter("rank", rank=int(index), local_rank=int(index), world_size=world)

    def run(*args, **kwargs):  # noqa: ANN002, ANN003
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            record_failure(exc)
            raise

    process._args = (run, index, *rest)


# ------------------------------------------------------------------------------- GPU
def _cuda_sampler():
    """CUDA memory of this rank's device, read by the heartbeat thread; never initialises
    CUDA (that would break fork-based DataLoader workers)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    from ups.instrument import torch_hooks

    device = torch_hooks.cuda_device()
    if device is None or not torch.cuda.is_initialized():
        return None
    from ups.status.record import GpuMemory

    stats = torch.cuda.memory_stats(device)
    rep = state.rep
    if rep is not None and "gpu_total" not in rep._metrics:  # noqa: SLF001 - for the leak verdict's "runs out at step N"
        rep.metrics(gpu_total=torch.cuda.get_device_properties(device).total_memory)
    return GpuMemory(device, stats.get("allocated_bytes.all.current", 0), stats.get("reserved_bytes.all.current", 0),
                     stats.get("allocated_bytes.all.peak", 0))
