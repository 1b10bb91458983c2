"""What the instrumentation learns from torch, patched in when the program imports torch.

Phases (the record's ``phase``), from well-known calls, in the main thread:

=====================  =====================================================================
``dist.init``          inside ``torch.distributed.init_process_group``
``ddp.wrap``           inside ``DistributedDataParallel(...)`` / FSDP construction
``data``               waiting on a DataLoader iterator (``next(it)``)
``train`` / ``eval``   after the first batch or optimizer step; ``eval`` after
                       ``model.eval()`` once training has begun, ``train`` again after
                       ``model.train()`` or the next optimizer step
``checkpoint``         inside ``torch.save`` to a file
``load``               inside ``torch.load`` from a file
``collective:<op>``    inside a blocking ``torch.distributed`` collective, or waiting for an
                       async one (``Work.wait``, a functional collective's ``wait_tensor``);
                       the record's ``collective`` says op, sequence number in its group,
                       group (name, description, global ranks), call site, framework
                       context ("FSDP unshard of layers.3") and whether the call site is new
=====================  =====================================================================

Progress: optimizer steps (torch's global optimizer step hook) once any optimizer stepped,
batches before that (and for programs without an optimizer); the epoch from
``DistributedSampler.set_epoch``; the batch within the current pass in ``item``.

DataLoader workers (fork and spawn): each gets its own record (heartbeat, samples fetched,
the dataset index in flight) from a wrapper around the loader's ``worker_init_fn`` that
starts before the user's own. ``UPS_FORCE_NUM_WORKERS=0`` (``ups relaunch --num-workers
0``) makes every DataLoader load in the main process.

A job's own explicit phases (``encode``, ``write`` ...) are kept: a wrapped call restores
the phase it found, unless that was one of the automatic ones.

Cost: the hot-path wrappers (``next(it)``, ``backward``, the optimizer hook, a collective)
do no I/O, format nothing and read one monotonic clock: a few microseconds each in a real
loop, where the caches are cold (26 us a step in all in scripts/bench_instrument.py's loop
on a 2-core box); the heartbeat thread writes the record once a second. A
worker writes its record when it starts a batch (the index in flight must be on disk before
a read that may block holding the GIL), and ``torch.save`` at most four times a second.

The hooks, one module per family, all installed by :func:`patch_torch` (the one entry point,
run by :mod:`ups.instrument.boot` when the program imports torch):

- :mod:`~ups.instrument.torch.phases` — a wrapped call's phase, entered and left (every
  family uses it);
- :mod:`~ups.instrument.torch.collectives` — ``torch.distributed``: the process group's
  start (``dist.init``, the rank it says), ``mp.spawn``'s ranks, the DDP/FSDP wrap, every
  collective (blocking, async and functional) with its group, call site and framework
  context;
- :mod:`~ups.instrument.torch.data` — the DataLoader: batches, the epoch, the workers'
  records and ends, ``UPS_FORCE_NUM_WORKERS``;
- :mod:`~ups.instrument.torch.optim` — the optimizer step (progress) and
  ``model.train()``/``model.eval()``;
- :mod:`~ups.instrument.torch.metrics` — loss, grad norm and the AMP scale, for
  :mod:`ups.instrument.metrics`.

They share what they know of the process through :mod:`~ups.instrument.torch.state` (and
the record through :mod:`ups.instrument.process`), never by importing each other in a loop.
A new framework's hooks go in the family they belong to.
"""

from __future__ import annotations

import sys

from ups.instrument import patching, process
from ups.instrument.torch.collectives import (
    patch_distributed,
    patch_fsdp,
    patch_functional,
    patch_spawn,
)
from ups.instrument.torch.data import patch_data
from ups.instrument.torch.metrics import patch_metrics
from ups.instrument.torch.optim import patch_module_modes, patch_optim


# --------------------------------------------------------------------- entry point
def patch_torch(torch) -> None:
    """Called right after ``import torch`` finished (post-import hook)."""
    steps = (patch_distributed, patch_spawn, patch_data, patch_optim, patch_module_modes, patch_metrics)
    for step in steps:
        try:
            step(torch)
        except Exception as exc:  # noqa: BLE001 - one failed patch must not stop the others
            process.warn(f"could not instrument {step.__name__.removeprefix('patch_')} ({type(exc).__name__}: {exc})")
    from ups.instrument import imports

    imports.when_imported("torch.distributed.fsdp", patch_fsdp)
    imports.when_imported("torch.distributed._functional_collectives", patch_functional)
    imports.when_imported("torch.distributed.elastic.multiprocessing.errors.error_handler", _patch_error_handler)


def _patch_error_handler(module) -> None:
    """torch's ``@record`` calls ``faulthandler.enable()`` (to stderr) when the decorated
    function starts, which takes fatal-signal tracebacks away from the stack file that
    ``ups stacks`` reads. Put ours back after it (the rank's stderr is in its log anyway)."""

    def make(original):
        def initialize(self):
            original(self)
            rep = process.state.rep
            if rep is not None:
                rep.rearm_fatal_handler()

        return initialize

    patching.patch(module.ErrorHandler, "initialize", make)


def set_enabled(enabled: bool) -> None:
    """Put torch's own functions back (False) or ours again (True): for measuring the cost of
    the instrumentation in one process (scripts/bench_instrument.py), not for programs."""
    for owner, name, original, wrapper in patching.PATCHED:
        setattr(owner, name, wrapper if enabled else original)
    torch = sys.modules.get("torch")
    if torch is not None:
        from torch.optim.optimizer import _global_optimizer_post_hooks

        ours = [k for k, h in _global_optimizer_post_hooks.items() if getattr(h, "__ups_hook__", False)]
        if enabled and not ours:
            patch_optim(torch)
        for key in ours if not enabled else ():
            del _global_optimizer_post_hooks[key]
