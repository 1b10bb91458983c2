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
  :mod:`ups.instrument.torch.data`), a process of ``torch.multiprocessing.spawn`` a rank
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

from ups.instrument.process import (
    ENV_PARENT,
    ENV_SPAWN_NPROCS,
    ENV_TOP_ROLE,
    argv_text,
    env_int,
    record_failure,
    start_reporter,
    state,
    warn,
)
from ups.status.reporter import Reporter

_INFRASTRUCTURE = ("multiprocessing.resource_tracker", "multiprocessing.forkserver", "multiprocessing.semaphore_tracker")


def _parse_parent() -> tuple[str, int, int] | None:
    raw = os.environ.get(ENV_PARENT)
    if not raw:
        return None
    try:
        role, pid, rank = raw.split(":")
        return role, int(pid), int(rank)
    except ValueError:
        return None


def _is_infrastructure(text: str) -> bool:
    return any(name in text for name in _INFRASTRUCTURE)


def _is_multiprocessing_child() -> bool:
    return "--multiprocessing-fork" in (sys.argv or []) or "spawn_main" in argv_text()


def boot() -> None:
    """Called once per process by sitecustomize."""
    if state.booted:
        return
    state.booted = True
    text = argv_text()
    if _is_infrastructure(text):
        return  # the resource tracker and fork server: no record, no hooks
    state.parent = _parse_parent()
    _install_hooks()
    from ups.instrument import identity

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


def boot_attached(role: str, *, name: str, rank: int | None = None, local_rank: int | None = None,
                  world_size: int | None = None) -> Reporter | None:
    """Start-up in a process that is already running: ``ups attach --inject`` runs this inside
    it through PEP 768's ``sys.remote_exec`` (see ups/attach/inproc.py). The same hooks as
    :func:`boot` (a module imported already, torch above all, is patched now), and the record
    under the identity the attached run found (``name``: the name its observer wrote until now)."""
    if state.booted:
        return state.rep
    state.booted = True
    _install_hooks()
    if role == "rank":
        return start_reporter("rank", rank=rank, local_rank=local_rank, world_size=world_size, name=name)
    return start_reporter(role, name=name, command=argv_text())


def _install_hooks() -> None:
    _install_process_hooks()
    from ups.instrument import imports

    # The torch and h5py hooks' modules are imported when the program imports those (most
    # of a job's processes never do: they do not pay for them at start-up).
    imports.when_imported("torch", _patch_torch)
    imports.when_imported("h5py", _patch_h5py)
    imports.when_imported("multiprocessing.process", _patch_multiprocessing)
    # Progress of programs that make no optimizer steps: tqdm bars, pool and executor tasks.
    from ups.instrument import progress

    imports.when_imported("tqdm.std", progress.patch_tqdm)
    imports.when_imported("multiprocessing.pool", progress.patch_pool)
    imports.when_imported("concurrent.futures.thread", progress.patch_executor)
    imports.when_imported("concurrent.futures.process", progress.patch_executor)
    from ups.instrument import loggers

    loggers.install()  # wandb / TensorBoard / Lightning / HF Trainer logs, if the program imports them


def _patch_torch(torch) -> None:
    from ups.instrument import savers
    from ups.instrument.torch import patch_torch

    patch_torch(torch)
    try:
        savers.patch_torch(torch)  # checkpoints by what they are (torch.save, DCP, Lightning, HF ...)
    except Exception as exc:  # noqa: BLE001 - one failed patch must not stop the others
        warn(f"could not follow checkpoints ({type(exc).__name__}: {exc})")


def _patch_h5py(h5py) -> None:
    from ups.instrument import io_hooks

    io_hooks.patch_h5py(h5py)


# ------------------------------------------------------------------------ process hooks
def _install_process_hooks() -> None:
    atexit.register(_at_exit)
    previous_hook = sys.excepthook

    def excepthook(tp, value, tb):  # the excepthook signature
        try:
            record_failure(value)
        except Exception:  # noqa: BLE001
            pass
        previous_hook(tp, value, tb)

    sys.excepthook = excepthook
    real_exit = sys.exit

    def exit(code=None):  # same signature as sys.exit
        state.exit_code = code if isinstance(code, int) or code is None else 1
        real_exit(code)

    sys.exit = exit
    real_os_exit = os._exit

    def _exit(code):  # same signature as os._exit
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
    Reporter.forget_current()
    import faulthandler

    faulthandler.disable()
    torch_state = sys.modules.get("ups.instrument.torch.state")  # imported with torch's hooks
    if torch_state is not None:
        torch_state.reset_after_fork()  # and the metrics' capture
    elif "ups.instrument.metrics" in sys.modules:  # a logging library's values, without torch
        sys.modules["ups.instrument.metrics"].reset_after_fork()


def _record_os_exit(code) -> None:
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
def _patch_multiprocessing(module) -> None:
    cls = module.BaseProcess
    if getattr(cls._bootstrap, "__ups_wrapped__", None):
        return
    original = cls._bootstrap

    def _bootstrap(self, *args, **kwargs):
        # Runs in the child (fork, spawn, forkserver) before the target.
        if state.rep is None and os.environ.get("UPS_RUN_DIR"):
            target = getattr(self, "_target", None)
            if _is_spawned_rank(target):
                try:
                    _start_spawned_rank(self)
                except Exception as exc:  # noqa: BLE001
                    warn(f"no status record for this spawned rank ({exc})")
            elif getattr(target, "__name__", "") != "_worker_loop":  # DataLoader workers: see instrument/torch/data.py
                try:
                    start_reporter("helper", name=_pool_worker_name(self, target),
                                   command=f"multiprocessing {getattr(self, 'name', '')}: "
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


# What a multiprocessing child runs when it is a worker of a pool (its tasks are the parent's
# progress): multiprocessing.Pool's, concurrent.futures' ProcessPoolExecutor's.
_POOL_TARGETS = {("multiprocessing.pool", "worker"), ("concurrent.futures.process", "_process_worker")}


def _pool_worker_name(process, target) -> str | None:
    """``rank-0-pool-3`` for the third worker of a pool of rank 0's (shown "rank 0 / pool
    worker 3"); None for any other child (a nameless helper)."""
    if (getattr(target, "__module__", ""), getattr(target, "__name__", "")) not in _POOL_TARGETS:
        return None
    index = str(getattr(process, "name", "")).rsplit("-", 1)[-1]
    rank = state.parent[2] if state.parent else 0
    return f"rank-{rank}-pool-{index if index.isdigit() else os.getpid()}"


def _is_spawned_rank(target) -> bool:
    return getattr(target, "__name__", "") == "_wrap" and getattr(target, "__module__", "") == "torch.multiprocessing.spawn"


def _start_spawned_rank(process) -> None:
    """A process of ``torch.multiprocessing.spawn``: ``_wrap(fn, i, args, error_file)``. It is
    rank ``i`` until its process group says otherwise (several nodes: i is the local rank). Its
    exception is recorded before torch's wrapper catches it and exits with ``sys.exit(1)``."""
    fn, index, *rest = process._args
    world = env_int(ENV_SPAWN_NPROCS)
    start_reporter("rank", rank=int(index), local_rank=int(index), world_size=world)

    def run(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            record_failure(exc)
            raise

    process._args = (run, index, *rest)
