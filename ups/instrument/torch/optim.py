"""The optimizer step and the model's mode: a rank's progress and its base phase.

torch's global optimizer step hook counts steps (several optimizers, as in a GAN, step once
each per iteration: the step is the largest count); the first step makes the base phase
``train``. ``model.eval()`` once training has begun makes it ``eval``, ``model.train()`` or
the next optimizer step ``train`` again.
"""

from __future__ import annotations

from ups.instrument import metrics, patching, process
from ups.instrument.torch import rehearse
from ups.instrument.torch.phases import set_base
from ups.instrument.torch.state import get_ident, note_cuda_device, rank_reporter, track


def patch_optim(torch) -> None:
    from torch.optim.optimizer import (
        _global_optimizer_post_hooks,
        register_optimizer_step_post_hook,
    )

    if not any(getattr(h, "__ups_hook__", False) for h in _global_optimizer_post_hooks.values()):
        register_optimizer_step_post_hook(_on_optimizer_step)
    track.rehearse = rehearse.wanted()


def _on_optimizer_step(optimizer, args, kwargs) -> None:
    rep = process.state.rep  # on every optimizer step: rank_reporter inlined
    t = track
    if rep is None or rep.role != "rank" or get_ident() != t.main:
        return
    key = id(optimizer)
    count = t.opt_counts.get(key, 0) + 1
    t.opt_counts[key] = count
    if count == 1:
        metrics.capture.note_optimizer(optimizer)  # its lr is read by the heartbeat thread
    if count > t.opt_steps:  # several optimizers (a GAN) step once each per iteration
        if t.opt_steps == 0 and t.cuda_dev is None:
            note_cuda_device()
        t.opt_steps = count
        rep.auto_step(count)
    else:
        rep.auto_progress()
    if t.base != "train":
        set_base(rep, "train")
    if t.rehearse:
        rehearse.on_step(rep.rank)


_on_optimizer_step.__ups_hook__ = True  # type: ignore[attr-defined]


def patch_module_modes(torch) -> None:
    def make(original):
        def train(self, mode=True):
            result = original(self, mode)
            if track.opt_steps:
                rep = rank_reporter()
                if rep is not None:
                    set_base(rep, "train" if mode else "eval")
            return result

        return train

    patching.patch(torch.nn.Module, "train", make)
