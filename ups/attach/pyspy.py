"""Stacks read from outside for ``ups attach``: one py-spy dump of a process (through
:mod:`ups.runs.pyspy`, the one place py-spy is run and read: its memory read while it runs, no
pause, no signal), written in the stack-file format ``ups why`` reads (:mod:`ups.why.stacks`:
faulthandler's, under a ``=== stack dump of ...`` header).

py-spy is the ``ups[attach]`` extra. Without it, or where ptrace is refused, :func:`dump` says
why in one line (with the fix) and the observer goes on with what ``/proc`` gives.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from ups.runs.pyspy import (
    DUMP_TIMEOUT_S,
    MISSING,
    PTRACE_FIX,
    DumpRefused,
    as_faulthandler,
    dump_json,
    executable,
    loop_counters,
    sample_in_flight,
    trainer_position,
)
from ups.status import vocabulary
from ups.why import stacks

__all__ = ["DUMP_TIMEOUT_S", "MISSING", "PTRACE_FIX", "Dump", "DumpRefused", "dump", "executable", "format_dump",
           "gone", "sample_in_flight"]

COLLECTIVE_OPS = vocabulary.COLLECTIVE_OPS | vocabulary.COLLECTIVE_WAITS
"""A frame in one of these (its own name) is the process inside a collective or waiting for one."""


@dataclass(frozen=True)
class Dump:
    """One dump of a process: its text as a stack file holds it, and the parsed section."""

    text: str
    section: stacks.Section | None
    at: float
    item: str | None = None  # a DataLoader worker's sample in flight: "index 51 (batch [212, 51, 73, 99])"
    counters: tuple = ()  # a rank's loop counters (ups.runs.pyspy.loop_counters): moved when they differ
    position: dict | None = None  # a Lightning rank's {"epoch", "batch_idx"[, "max_epochs"]} (ups.runs.pyspy.trainer_position)

    @property
    def frames(self) -> tuple:
        """The main thread's frames: what "the same stack twice" compares."""
        return tuple((f.file, f.line, f.function) for f in self.section.stack) if self.section else ()

    def collective(self) -> tuple[str, str | None] | None:
        """(op, the program's own call site) when the main thread is inside a torch.distributed
        collective (its Python frames name it); None otherwise."""
        if self.section is None:
            return None
        for f in self.section.stack:
            if "distributed" in f.file and f.function in COLLECTIVE_OPS:
                own = self.section.own_frame
                return f.function, own.site if own else None
        return None


def dump(pid: int, label: str, *, actor: str = "attach", exe: str | None = None,
         timeout: float = DUMP_TIMEOUT_S, with_locals: bool = False) -> Dump:
    """All threads' Python stacks of ``pid``, as a stack-file section; DumpRefused otherwise.
    ``with_locals``: read the frames' local variables too (a DataLoader worker's index)."""
    threads = dump_json(pid, timeout=timeout, with_locals=with_locals, exe=exe)
    text = format_dump(threads, label, pid, actor)
    return Dump(text, stacks.latest(text), time.time(), sample_in_flight(threads, pid),
                loop_counters(threads, pid) if with_locals else (), trainer_position(threads, pid) if with_locals else None)


def format_dump(threads: list[dict], label: str, pid: int, actor: str) -> str:
    """py-spy's JSON as faulthandler writes a dump (innermost frame first)."""
    return as_faulthandler(threads if isinstance(threads, list) else [], label, pid, actor)


def gone(pid: int) -> bool:
    return not os.path.exists(f"/proc/{pid}")
