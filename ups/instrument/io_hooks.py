"""Which file a process is opening, written down before the open starts.

``h5py.File()`` on a hung network mount (or a FIFO) blocks in a C call that holds the GIL:
from then on the heartbeat thread cannot write anything, so whatever the record should say
about the file must be on disk before the call. The hook notes the file name in the record's
``file`` metric and flushes the record, only when the name changed: a program that reopens
the same file per sample pays one dict lookup per open, and a hang on a reopen still finds
the right name in the record.
"""

from __future__ import annotations

import os

from ups.instrument import patching, process

_last: dict[int, str] = {}
# How long a note may wait for the heartbeat thread's write in progress (a few hundred us on a
# sane disk): the open that follows may hold the GIL for good.
FLUSH_WAIT_S = 0.25  # id(reporter) -> the file last written into its record


def note_file(name, *, flush: bool = True) -> None:
    rep = process.state.rep
    if rep is None or not isinstance(name, (str, bytes, os.PathLike)):
        return  # no record, or a file-like object (nothing to name)
    path = os.fsdecode(name)
    if _last.get(id(rep)) == path:
        return
    rep.metrics(file=path)
    if flush:
        _last[id(rep)] = path
        rep.flush(wait=FLUSH_WAIT_S)
    else:
        _last.pop(id(rep), None)


def forget_file(rep) -> None:
    """A new sample starts: the file the previous one opened is no longer the one in flight."""
    _last.pop(id(rep), None)
    rep.metrics(file=None)


def patch_open() -> None:
    """In a DataLoader worker: note the file a sample's ``open()`` is opening. No flush: a
    blocking open (a FIFO, a hung mount) releases the GIL, so the heartbeat thread writes the
    name within a second, and the hot path does no I/O."""
    import builtins

    original = builtins.open
    if getattr(original, "__ups_hook__", False):
        return

    def open(file, *args, **kwargs):
        rep = process.state.rep
        if rep is not None and rep.current_phase == "fetch":
            try:
                note_file(file, flush=False)
            except Exception:  # noqa: BLE001 - never in the way of the user's open
                pass
        return original(file, *args, **kwargs)

    open.__ups_hook__ = True
    open.__wrapped__ = original
    builtins.open = open


def patch_h5py(h5py) -> None:
    def make(original):
        def __init__(self, name, *args, **kwargs):
            try:
                note_file(name)
            except Exception:  # noqa: BLE001 - never in the way of the user's open
                pass
            return original(self, name, *args, **kwargs)

        return __init__

    patching.patch(h5py.File, "__init__", make)
