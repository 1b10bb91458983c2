"""Training metrics of a rank, learnt with no code change and read off the training thread.

What is captured (by the hooks in :mod:`ups.instrument.torch.metrics` and :mod:`ups.instrument.loggers`):

* **loss**: the scalar that ``backward()`` is called on (``torch.autograd.backward``, which
  ``Tensor.backward`` calls), unscaled when it came out of ``GradScaler.scale``; tagged with
  the optimizer steps done before it (the 0-based index of the step in progress, as a
  training loop counts it);
* **grad norm**: what ``clip_grad_norm_`` returned;
* **lr**: ``param_groups[0]["lr"]`` of the optimizers that stepped (read at heartbeat time);
* **samples/s, tokens/s**: the batch size of each DataLoader batch (its first tensor's first
  dimension) and, for integer token batches (``input_ids``), their element count;
* **logged values**: what the program gives ``wandb.log``, ``SummaryWriter.add_scalar``,
  Lightning's ``self.log`` or the HF Trainer's ``log``.

The training thread only keeps references: ``loss.detach()`` (no ``.item()``: on a GPU that
would wait for the step to finish). The Reporter's heartbeat thread reads the values about
once a second (:meth:`Capture.sample`). A CPU tensor is read directly. A CUDA tensor is never
read from its device memory by that thread: at capture time the training thread enqueues a
non-blocking copy into a small pinned host buffer plus an event on the current stream (a
few microseconds, no sync), and the heartbeat thread reads the host buffer only once the
event has completed (``event.query()`` never waits); a value whose step has not finished yet
is read on a later tick.

Every loss read is handed on, with its step, to the process's series
(:data:`~ups.status.schema.LOSS_TRACE` in what :meth:`Capture.sample` returns): the curve of a
fast run, one point per step, at the cost of a float and a step number kept per step between
two heartbeats (a CPU loss is kept as the float it was checked as, not as a tensor).
"""

from __future__ import annotations

import math
import sys
import threading
import time
import weakref
from collections import deque

from ups.status.schema import LOSS_TRACE

PENDING_KEPT = 64  # CUDA losses in flight to the host (a ring of pinned buffers; a slot reused is skipped)
STEPS_KEPT = 2048  # losses captured since the last heartbeat: every step of a loop up to ~2,000 steps/s
LOGGED_KEYS = 24  # logged scalars kept per process (the most recently logged win)
RATE_WINDOW_S = 10.0


class _Slot:
    """A CUDA scalar's value on its way to the host: pinned buffer + completion event."""

    __slots__ = ("buf", "event", "gen")

    def __init__(self, buf, event) -> None:
        self.buf = buf
        self.event = event
        self.gen = 0


class _CudaCopies:
    """A ring of pinned one-element buffers per dtype: no host allocation per step."""

    def __init__(self) -> None:
        self.rings: dict[object, list[_Slot]] = {}
        self.next: dict[object, int] = {}

    def enqueue(self, tensor):
        import torch

        ring = self.rings.get(tensor.dtype)
        if ring is None:
            ring = self.rings[tensor.dtype] = [
                _Slot(torch.empty((), dtype=tensor.dtype, pin_memory=True), torch.cuda.Event()) for _ in range(PENDING_KEPT)
            ]
            self.next[tensor.dtype] = 0
        i = self.next[tensor.dtype]
        self.next[tensor.dtype] = (i + 1) % len(ring)
        slot = ring[i]
        slot.gen += 1
        slot.buf.copy_(tensor.reshape(()), non_blocking=True)
        slot.event.record(torch.cuda.current_stream(tensor.device))
        return slot, slot.gen


def _lazy(tensor, cuda: _CudaCopies):
    """What the training thread keeps of a scalar tensor: the detached tensor (CPU) or a
    pinned copy in flight (CUDA)."""
    t = tensor.detach()
    if t.is_cuda:
        return cuda.enqueue(t)
    return t


_NOT_READY = object()


def _read(kept):
    """The value of what :func:`_lazy` kept, without ever waiting on a device; _NOT_READY if
    the device has not got there yet, None if it cannot be read."""
    try:
        if isinstance(kept, tuple):
            slot, gen = kept
            if not slot.event.query():
                return _NOT_READY
            value = float(slot.buf)
            return value if slot.gen == gen else None  # overwritten meanwhile by a later step
        if isinstance(kept, int | float):
            return float(kept)
        if getattr(kept, "is_cuda", False):
            return None  # reading device memory from this thread would wait for the device
        return float(kept)
    except Exception:  # noqa: BLE001 - a tensor we cannot read is no reason to fail
        return None


_INFINITE = (math.inf, -math.inf)
FLAG_BASE = float(1 << 24)  # float32 holds every integer below it exactly
FLAG_READ_EVERY_S = 0.25


class DeviceFlag:
    """The first step whose loss was not finite, kept on the device: no host sync per step.

    Per loss, three small kernels on the loss's stream, the step passed as a kernel argument
    (no host-to-device copy): ``scratch = loss * 0`` (0 when finite, NaN for NaN and ±inf),
    ``scratch = nan_to_num(scratch, nan=FLAG_BASE - step, posinf=0, neginf=0)``, then
    ``mark = max(mark, scratch)``. ``mark`` only grows, and the first non-finite step gives the
    largest value, so it can be read late without losing it. At most every
    :data:`FLAG_READ_EVERY_S` the training thread enqueues a non-blocking copy of ``mark`` into
    pinned host memory and an event (two slots, alternating); the heartbeat thread reads a slot
    only once its event has completed (``query()`` never waits). Steps below 2**24 are exact.
    Skipped while a CUDA graph is being captured. Written for CUDA and guarded: any failure
    turns it off for the process (the sampled losses still say what they see)."""

    def __init__(self, device) -> None:
        import torch

        self.torch = torch
        self.cuda = device.type == "cuda"
        self.mark = torch.zeros((), dtype=torch.float32, device=device)
        self.scratch = torch.zeros((), dtype=torch.float32, device=device)
        pin = self.cuda
        self.slots = [torch.zeros((), dtype=torch.float32, pin_memory=pin) for _ in range(2)]
        self.events = [torch.cuda.Event() if self.cuda else None for _ in range(2)]
        self.recorded = [False, False]
        self.next = 0
        self.copied_at = 0.0

    def note(self, loss, step: int) -> None:
        torch = self.torch
        if self.cuda and torch.cuda.is_current_stream_capturing():
            return
        scratch = self.scratch
        torch.mul(loss.detach().reshape(()), 0.0, out=scratch)
        torch.nan_to_num(scratch, nan=FLAG_BASE - step, posinf=0.0, neginf=0.0, out=scratch)
        torch.maximum(self.mark, scratch, out=self.mark)
        now = time.monotonic()
        if now - self.copied_at >= FLAG_READ_EVERY_S:
            self.copied_at = now
            self.copy()

    def copy(self) -> None:
        """Enqueue a copy of the mark to the host (the training thread, and the final flush)."""
        i = self.next
        self.next = 1 - i
        self.recorded[i] = False
        self.slots[i].copy_(self.mark, non_blocking=self.cuda)
        if self.cuda:
            self.events[i].record()
        self.recorded[i] = True

    def first_step(self) -> int | None:
        """The first non-finite step, from a copy the device has finished; None if none yet."""
        best = 0.0
        for i in (0, 1):
            if not self.recorded[i]:
                continue
            event = self.events[i]
            if event is not None and not event.query():
                continue
            best = max(best, float(self.slots[i]))
        return int(FLAG_BASE - best) if best > 0 else None


def _finite_or_word(value: float):
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return float(f"{value:.6g}")


class Capture:
    """The metrics of this process, written by the training thread, read by the heartbeat thread."""

    def __init__(self) -> None:
        self.cuda = _CudaCopies()
        self.losses: deque[tuple[int, int, object]] = deque(maxlen=STEPS_KEPT)  # (seq, step, kept)
        self.seq = 0
        self.read_seq = 0
        self.grad_norm: tuple[int, object] | None = None
        self.optimizers: list[weakref.ref] = []
        self.samples = 0
        self.tokens = 0
        self.logged: dict[str, object] = {}
        self.scaled: tuple[object, object] | None = None  # (scaled loss, loss) of the last GradScaler.scale
        self.nonfinite: dict | None = None
        self.flag: DeviceFlag | None | bool = None  # CUDA losses: the device-side first non-finite step (False: off)
        self.last_loss: float | None = None
        self._rates: deque[tuple[float, int, int]] = deque()
        self._lock = threading.Lock()  # the heartbeat thread and a final flush at exit

    # -- the training thread: references only -----------------------------------------------
    def note_loss(self, tensor, step: int) -> None:
        scaled = self.scaled
        if scaled is not None and scaled[0] is tensor:
            tensor = scaled[1]  # AMP: the loss, not loss × scale
        if tensor.dim() and tensor.numel() != 1:
            return  # backward() on a non-scalar (with a gradient): not a loss
        seq = self.seq = self.seq + 1
        kept = tensor.detach()  # _lazy, inlined: this runs on every backward
        if kept.is_cuda:
            self.losses.append((seq, step, self.cuda.enqueue(kept)))
            if self.nonfinite is None and self.flag is not False:
                self._flag(kept, step)
            return
        if self.nonfinite is None and kept.is_cpu:
            # Every loss checked where it is made: on the CPU the value exists already, so this
            # is a read, not a wait (well under a microsecond), and the first non-finite loss
            # is kept whatever the step rate. The float is what is kept for the series.
            value = kept.item()
            self.losses.append((seq, step, value))
            if value != value or value in _INFINITE:
                self.nonfinite = {"step": step, "value": _finite_or_word(value), "at": time.time()}
            return
        self.losses.append((seq, step, kept))

    def _flag(self, loss, step: int) -> None:
        """A CUDA loss, checked on the device with no sync (see :class:`DeviceFlag`)."""
        try:
            if self.flag is None:
                self.flag = DeviceFlag(loss.device)
            self.flag.note(loss, step)
        except Exception:  # noqa: BLE001 - the flag is an extra: off for this process, never in the way
            self.flag = False

    def note_grad_norm(self, tensor, step: int) -> None:
        if hasattr(tensor, "detach") and tensor.numel() == 1:
            self.grad_norm = (step, _lazy(tensor, self.cuda))

    def note_optimizer(self, optimizer) -> None:
        if len(self.optimizers) < 4 and not any(r() is optimizer for r in self.optimizers):
            self.optimizers.append(weakref.ref(optimizer))

    def note_batch(self, batch, weight: int = 1) -> None:
        """A batch's size, counted ``weight`` times: the DataLoader hook reads one batch in
        :data:`~ups.instrument.torch.data.BATCH_SIZE_EVERY` and stands it for the others."""
        n, tokens = batch_size(batch)
        self.samples += n * weight
        self.tokens += tokens * weight

    def note_logged(self, values: dict, prefix: str = "") -> None:
        for key, value in values.items():
            if isinstance(value, bool) or not isinstance(key, str):
                continue
            if isinstance(value, int | float):
                kept = value
            elif hasattr(value, "detach") and getattr(value, "numel", lambda: 0)() == 1:
                kept = _lazy(value, self.cuda)
            else:
                continue
            name = (prefix + key)[:60]
            self.logged.pop(name, None)
            self.logged[name] = kept
            while len(self.logged) > LOGGED_KEYS:
                self.logged.pop(next(iter(self.logged)))

    # -- the heartbeat thread ------------------------------------------------------------------
    def sample(self) -> dict:
        """The metrics to merge into the record now. Never waits on the training thread or a GPU."""
        with self._lock:
            return self._sample()

    def _sample(self) -> dict:
        out: dict = {}
        flag = self.flag
        if self.nonfinite is None and isinstance(flag, DeviceFlag):
            step = flag.first_step()
            if step is not None:
                self.nonfinite = {"step": step, "value": "nan/inf", "at": time.time()}
            elif time.monotonic() - flag.copied_at > 1.0:
                flag.copied_at = time.monotonic()  # the loop stopped (or hangs): copy the last mark from here
                flag.copy()
        loss_step = None
        trace: list[tuple[int, float]] = []
        for seq, step, kept in list(self.losses):
            if seq <= self.read_seq:
                continue
            value = _read(kept)
            if value is _NOT_READY:
                break  # the device is not there yet: this one and later ones next tick
            self.read_seq = seq
            if value is None:
                continue
            self.last_loss, loss_step = value, step
            trace.append((step, value))
            if self.nonfinite is None and not math.isfinite(value):
                self.nonfinite = {"step": step, "value": _finite_or_word(value), "at": time.time()}
        if loss_step is not None:
            out["loss"] = _finite_or_word(self.last_loss)
            out["loss_step"] = loss_step
            out[LOSS_TRACE] = trace
        if self.nonfinite is not None:
            out["loss_nonfinite"] = self.nonfinite
        if self.grad_norm is not None:
            value = _read(self.grad_norm[1])
            if isinstance(value, float):
                out["grad_norm"] = _finite_or_word(value)
        for ref in self.optimizers:
            opt = ref()
            if opt is not None:
                try:
                    lr = opt.param_groups[0].get("lr")
                    lr = _read(lr) if hasattr(lr, "detach") else lr
                    if isinstance(lr, int | float):
                        out["lr"] = float(f"{lr:.6g}")
                        break
                except (IndexError, AttributeError, TypeError):
                    continue
        self._sample_rates(out)
        if self.logged:
            logged = {}
            for key, kept in list(self.logged.items()):
                value = _read(kept)
                if isinstance(value, float):
                    logged[key] = _finite_or_word(value)
            if logged:
                out["logged"] = logged
        return out

    def _sample_rates(self, out: dict) -> None:
        if not self.samples:
            return
        now = time.monotonic()
        rates = self._rates
        rates.append((now, self.samples, self.tokens))
        while len(rates) > 2 and now - rates[0][0] > RATE_WINDOW_S:
            rates.popleft()
        t0, s0, k0 = rates[0]
        if now - t0 >= 0.5:
            out["samples_per_s"] = round((self.samples - s0) / (now - t0), 3)
            if self.tokens:
                out["tokens_per_s"] = round((self.tokens - k0) / (now - t0), 1)


_TOKEN_DTYPES: frozenset = frozenset()


def batch_size(batch) -> tuple[int, int]:
    """(samples, tokens) of a DataLoader batch: the first dimension of its first tensor, and
    the element count of integer token ids (``input_ids``, or a first tensor of integers).
    On every batch: a few attribute reads, no tensor call."""
    global _TOKEN_DTYPES
    first = batch
    if isinstance(batch, list | tuple):
        first = batch[0] if batch else None
        if not hasattr(first, "shape"):
            first = next((v for v in batch if hasattr(v, "shape")), None)
    elif isinstance(batch, dict):
        first = batch.get("input_ids")
        if first is None:
            first = next((v for v in batch.values() if hasattr(v, "shape")), None)
    shape = getattr(first, "shape", None)
    if not shape:
        return 0, 0
    if len(shape) == 2:
        if not _TOKEN_DTYPES:
            import torch

            _TOKEN_DTYPES = frozenset((torch.int64, torch.int32, torch.int16, torch.uint8))
        if first.dtype in _TOKEN_DTYPES:
            return int(shape[0]), int(shape[0]) * int(shape[1])
    return int(shape[0]), 0


capture = Capture()


def reset_after_fork() -> None:
    global capture
    capture = Capture()


def sampler() -> dict:
    """The Reporter's sampler (the current capture: a forked child has its own)."""
    return capture.sample() if "torch" in sys.modules else {}
