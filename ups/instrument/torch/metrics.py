"""Training metrics from torch's own calls, for :mod:`ups.instrument.metrics`: the loss (what
``backward()`` is called on), the grad norm (``clip_grad_norm_``'s return) and the loss under
AMP (``GradScaler.scale``'s input). The hooks keep references only; the heartbeat thread reads
the values.
"""

from __future__ import annotations

import time

from ups.instrument import metrics, patching, process
from ups.instrument.torch.state import get_ident, rank_reporter, track

_monotonic = time.monotonic


def _steps_done(rep) -> int:
    """Optimizer steps done before now: the 0-based index of the step in progress (the job's
    own count when it reports one, e.g. after resuming)."""
    return rep.step if rep.explicit_progress else track.opt_steps


def patch_metrics(torch) -> None:
    """Loss (what backward() is called on), grad norm (clip_grad_norm_'s return) and the
    loss under AMP (GradScaler.scale's input): references only, see ups.instrument.metrics."""
    Tensor = torch.Tensor

    def make_backward(original):
        def backward(tensors, *args, **kwargs):
            # On every backward: rank_reporter and _steps_done inlined.
            rep = process.state.rep
            t = track
            if rep is not None and rep.role == "rank" and get_ident() == t.main:
                loss = tensors if isinstance(tensors, Tensor) else (
                    tensors[0] if isinstance(tensors, list | tuple) and len(tensors) == 1 else None)
                if loss is not None:
                    try:
                        metrics.capture.note_loss(loss, rep.step if rep.explicit_progress else t.opt_steps)
                    except Exception:  # noqa: BLE001 - never in the program's way
                        pass
                # Where the step's time goes (ups.status.steptime): backward less the
                # collectives waited inside it (FSDP's reduce-scatter, counted there).
                t0, c0 = _monotonic(), rep.t_coll
                result = original(tensors, *args, **kwargs)
                rep.t_bwd += _monotonic() - t0 - (rep.t_coll - c0)
                return result
            return original(tensors, *args, **kwargs)

        return backward

    patching.patch(torch.autograd, "backward", make_backward)

    def make_clip(original):
        def clip_grad_norm_(*args, **kwargs):
            norm = original(*args, **kwargs)
            rep = rank_reporter()
            if rep is not None:
                try:
                    metrics.capture.note_grad_norm(norm, _steps_done(rep))
                except Exception:  # noqa: BLE001
                    pass
            return norm

        return clip_grad_norm_

    utils = torch.nn.utils
    original_clip = getattr(utils, "clip_grad_norm_", None)
    patching.patch(utils.clip_grad, "clip_grad_norm_", make_clip)
    if original_clip is not None and original_clip is not utils.clip_grad.clip_grad_norm_:
        wrapper = utils.clip_grad.clip_grad_norm_
        utils.clip_grad_norm_ = wrapper  # torch.nn.utils re-exports it
        patching.PATCHED.append((utils, "clip_grad_norm_", original_clip, wrapper))

    scaler = getattr(getattr(torch, "amp", None), "GradScaler", None)
    if scaler is not None:
        def make_scale(original):
            def scale(self, outputs):
                result = original(self, outputs)
                if isinstance(outputs, Tensor) and get_ident() == track.main:
                    metrics.capture.scaled = (result, outputs)
                return result

            return scale

        patching.patch(scaler, "scale", make_scale)
