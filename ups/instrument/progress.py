"""Progress of programs that make no optimizer steps, with no code change: tqdm bars, the
tasks a ``multiprocessing.Pool`` or a ``concurrent.futures`` executor completes.

Read, not patched on the program's path where it can be: tqdm keeps every open bar in a
class-level set, and the heartbeat thread reads the outermost one (n, total, unit) once a
second; closing a bar is the one call wrapped (its last count is kept). A pool's completed
tasks are counted where the parent receives each result (the result classes' ``_set``), its
submitted ones where they are created; an executor's by ``submit`` and a done-callback.

These count only while nothing better does: an optimizer step (instrument/torch/optim.py) or the job's
own calls (``Reporter.advance``) take precedence, and the ``progress_from`` metric says which
counter the record's step is. A process with none of them (and no counter on its output, which
the launcher reads: ups.launch.lineprogress) has no progress signal.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from ups.instrument import patching, process

_lock = threading.Lock()
_pool = {"done": 0, "submitted": 0}
_bars: dict[str, Any] = {"closed": None}  # the last state of the outermost bar closed
_installed = {"sampler": False}


def _outermost_bar(tqdm_cls: Any) -> tuple[int, int | None, str, str] | None:
    """(n, total, unit, desc) of the outermost open bar (lowest position), if any."""
    bars = []
    for cls in {tqdm_cls, *tqdm_cls.__subclasses__()}:
        instances = cls.__dict__.get("_instances")
        if instances is None:
            continue
        for _ in range(3):  # a bar opened or closed while we look: look again
            try:
                bars.extend(list(instances))
                break
            except RuntimeError:
                continue
    bars = [b for b in bars if not getattr(b, "disable", False)]
    if not bars:
        return None
    bar = min(bars, key=lambda b: abs(getattr(b, "pos", 0) or 0))
    total = getattr(bar, "total", None)
    return int(getattr(bar, "n", 0) or 0), int(total) if total else None, str(getattr(bar, "unit", "it")), \
        str(getattr(bar, "desc", "") or "")


class _Progress:
    """The heartbeat thread's reader: moves the record's step when a counter moved."""

    def __init__(self) -> None:
        self.seen: tuple | None = None
        self.tqdm: Any = None

    def __call__(self) -> dict[str, Any]:
        rep = process.state.rep
        torch_state = sys.modules.get("ups.instrument.torch.state")  # imported with torch, when torch is
        if rep is None or rep.explicit_progress or (torch_state is not None and torch_state.optimizer_steps()):
            return {}
        reading = None
        if self.tqdm is not None:
            bar = _outermost_bar(self.tqdm) or _bars["closed"]
            if bar is not None:
                n, total, unit, desc = bar
                reading = ("tqdm", n, total, unit, desc)
        if reading is None and _pool["submitted"]:
            reading = ("pool", _pool["done"], _pool["submitted"], "tasks", "")
        if reading is None or reading[1:3] == (self.seen or (None, None, None))[1:3]:
            return {}
        source, n, total, unit, desc = reading
        previous = self.seen
        self.seen = reading
        if previous is None and n == 0:
            rep.set_total(total, unit)
            return {"progress_from": source}
        rep.auto_progress(step=n, unit=unit)
        rep.set_total(total, unit)
        if desc:
            rep.item(desc)
        return {"progress_from": source}


_reader = _Progress()


def _sample() -> None:
    rep = process.state.rep
    if rep is not None and not _installed["sampler"]:
        _installed["sampler"] = True
        rep.add_sampler(_reader)


def patch_tqdm(module: Any) -> None:
    """tqdm.std: its bars are read by the heartbeat thread; close() keeps the last count."""
    cls = module.tqdm
    _reader.tqdm = cls

    def make_close(original):
        def close(self, *args, **kwargs):
            try:
                if not getattr(self, "disable", False) and not (getattr(self, "pos", 0) or 0):
                    total = getattr(self, "total", None)
                    _bars["closed"] = (int(self.n), int(total) if total else None, str(self.unit), str(self.desc or ""))
            except Exception:  # noqa: BLE001 - never in the program's way
                pass
            return original(self, *args, **kwargs)
        return close

    patching.patch(cls, "close", make_close)
    _sample()


def _count(key: str, n: int) -> None:
    with _lock:
        _pool[key] += n


def patch_pool(module: Any) -> None:
    """multiprocessing.pool: tasks submitted and completed, in the parent."""
    def make_init(submitted):
        def make(original):
            def __init__(self, *args, **kwargs):
                original(self, *args, **kwargs)
                try:
                    _count("submitted", submitted(self, args, kwargs))
                except Exception:  # noqa: BLE001
                    pass
            return __init__
        return make

    def make_set(per_call):
        def make(original):
            def _set(self, *args, **kwargs):
                try:
                    _count("done", per_call(self))
                except Exception:  # noqa: BLE001
                    pass
                return original(self, *args, **kwargs)
            return _set
        return make

    def make_set_length(original):
        def _set_length(self, length):
            try:
                _count("submitted", int(length))
            except Exception:  # noqa: BLE001
                pass
            return original(self, length)
        return _set_length

    # apply_async: one task; map/starmap: `length` items in chunks of `chunksize`; imap: per item
    # (its length is known once the task handler has queued every task).
    patching.patch(module.ApplyResult, "__init__", make_init(lambda self, a, k: 0 if isinstance(self, module.MapResult) else 1))
    patching.patch(module.ApplyResult, "_set", make_set(lambda self: 1))
    patching.patch(module.MapResult, "__init__", make_init(lambda self, a, k: int(a[2] if len(a) > 2 else k["length"])))
    patching.patch(module.MapResult, "_set", make_set(lambda self: min(self._chunksize, max(0, self._number_left))))
    patching.patch(module.IMapIterator, "_set", make_set(lambda self: 1))
    patching.patch(module.IMapIterator, "_set_length", make_set_length)
    _sample()


def patch_executor(module: Any) -> None:
    """concurrent.futures.thread or .process: a task per submit, done when its future is."""
    def make_submit(original):
        def submit(self, *args, **kwargs):
            future = original(self, *args, **kwargs)
            try:
                _count("submitted", 1)
                future.add_done_callback(lambda _f: _count("done", 1))
            except Exception:  # noqa: BLE001
                pass
            return future
        return submit

    cls = getattr(module, "ThreadPoolExecutor", None) or getattr(module, "ProcessPoolExecutor", None)
    if cls is not None:
        patching.patch(cls, "submit", make_submit)
        _sample()
