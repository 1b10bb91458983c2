"""What the torch hooks know of this process, shared by every family of them.

One :class:`Tracking` object, :data:`track`, holds the main thread's phase nesting and the
progress counters (and the collectives' groups and works in flight, the DataLoaders'
numbering): the hooks read it on every step, so each family imports the object itself (one
global lookup, as when they were one module) and a forked child resets it in place
(:func:`reset_after_fork`) rather than rebinding the name. The process's record is shared the
same way, through :mod:`ups.instrument.process`.
"""

from __future__ import annotations

import sys
import threading

from ups.instrument import metrics, process


class Tracking:
    """Main-thread phase nesting and progress counters of this process (slots: the hooks read
    them on every step)."""

    __slots__ = ("base", "batches", "cuda_dev", "depth", "forced_warned", "groups", "loaders", "main", "opt_counts", "rehearse",
                 "opt_steps", "pending", "seen", "world")

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.base = "start"
        self.depth = 0
        self.opt_steps = 0
        self.opt_counts: dict[int, int] = {}
        self.batches = 0
        self.cuda_dev: int | None = None
        self.main = threading.main_thread().ident
        self.loaders = 0
        self.forced_warned = False
        self.rehearse = False  # a program fault to rehearse (ups.instrument.torch.rehearse)
        self.groups: dict[int, object] = {}  # id(process group) -> what the record says of it (collectives.Group)
        self.world: object | None = None  # the default group's collectives.Group
        self.pending: dict[int, tuple] = {}  # id(work or tensor) -> (it, issued collective)
        self.seen: set = set()  # (op, site, context) of every collective issued so far


track = Tracking()
get_ident = threading.get_ident


def reset_after_fork() -> None:
    track.reset()
    track.main = get_ident()
    metrics.reset_after_fork()


def cuda_device() -> int | None:
    return track.cuda_dev


def optimizer_steps() -> int:
    """Optimizer steps this process made (its progress when it trains)."""
    return track.opt_steps


def rank_reporter():
    """The reporter of a rank's main thread, else None (workers, helpers, other threads)."""
    rep = process.state.rep
    if rep is None or rep.role != "rank" or get_ident() != track.main:
        return None
    return rep


def note_cuda_device() -> None:
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        track.cuda_dev = torch.cuda.current_device()
