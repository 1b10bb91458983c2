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

from ups.instrument import boot
from ups.instrument.torch_hooks import _patch

_last: dict[int, str] = {}  # id(reporter) -> the file last written into its record


def note_file(name) -> None:  # noqa: ANN001
    rep = boot.state.rep
    if rep is None or not isinstance(name, (str, bytes, os.PathLike)):
        return  # no record, or a file-like object (nothing to name)
    path = os.fsdecode(name)
    if _last.get(id(rep)) == path:
        return
    _last[id(rep)] = path
    rep.metrics(file=path)
    rep.flush()


def patch_h5py(h5py) -> None:  # noqa: ANN001
    def make(original):
        def __init__(self, name, *args, **kwargs):  # noqa: ANN001, N807
            try:
                note_file(name)
            except Exception:  # noqa: BLE001, S110 - never in the way of the user's open
                pass
            return original(self, name, *args, **kwargs)

        return __init__

    _patch(h5py.File, "__init__", make)
