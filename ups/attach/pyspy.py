"""Stacks read from outside: ``py-spy dump --pid --nonblocking`` (its memory read while it runs:
no pause, no signal), written in the stack-file format ``ups why`` reads
(:mod:`ups.why.stacks`: faulthandler's, under a ``=== stack dump of ...`` header).

py-spy is the ``ups[attach]`` extra. Without it, or where ptrace is refused, :func:`dump` says
why in one line (with the fix) and the observer goes on with what ``/proc`` gives.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass

from ups.runs.signals import pyspy_as_faulthandler
from ups.why import stacks

DUMP_TIMEOUT_S = 10.0
DUMP_FLAGS = ("--nonblocking",)
"""The process is not even paused for the read (py-spy reads its memory while it runs): a
stack read from a process that is running may mix two moments, which can only make two dumps
differ (seen as progress), never make a moving process look stuck; a stuck one reads the same."""
MISSING = "py-spy is not installed: no stacks (pip install 'ups[attach]'); watching CPU, I/O and the log only"
PTRACE_FIX = ("ptrace refused: run ups as the job's user, allow it with `sysctl kernel.yama.ptrace_scope=0` "
              "(Yama), or give the container CAP_SYS_PTRACE; watching CPU, I/O and the log only")
COLLECTIVE_OPS = frozenset(("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "all_to_all",
                            "all_to_all_single", "barrier", "broadcast", "broadcast_object_list", "gather",
                            "gather_object", "monitored_barrier", "recv", "reduce", "reduce_scatter",
                            "reduce_scatter_tensor", "scatter", "scatter_object_list", "send", "wait"))


@dataclass(frozen=True)
class Dump:
    """One dump of a process: its text as a stack file holds it, and the parsed section."""

    text: str
    section: stacks.Section | None
    at: float
    item: str | None = None  # a DataLoader worker's sample in flight: "index 51 (batch [212, 51, 73, 99])"

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


class DumpRefused(Exception):
    """No dump: py-spy missing, ptrace refused, or the process went away. ``lasting`` says that
    retrying will not help (said once, then no more dumps are tried)."""

    def __init__(self, message: str, lasting: bool) -> None:
        super().__init__(message)
        self.lasting = lasting


def executable() -> str | None:
    return shutil.which("py-spy")


def dump(pid: int, label: str, *, actor: str = "attach", exe: str | None = None,
         timeout: float = DUMP_TIMEOUT_S, with_locals: bool = False) -> Dump:
    """All threads' Python stacks of ``pid``, as a stack-file section; DumpRefused otherwise.
    ``with_locals``: read the frames' local variables too (a DataLoader worker's index)."""
    exe = exe or executable()
    if exe is None:
        raise DumpRefused(MISSING, True)
    try:
        res = subprocess.run([exe, "dump", "--pid", str(pid), "--json", *DUMP_FLAGS,
                              *(["--locals"] if with_locals else [])], capture_output=True, text=True,
                             timeout=timeout)
    except subprocess.TimeoutExpired:
        raise DumpRefused(f"py-spy dump of pid {pid} took over {timeout:g} s", False) from None
    except OSError as exc:
        raise DumpRefused(f"py-spy could not run: {exc}", True) from None
    err = (res.stderr or "").strip()
    if res.returncode != 0:
        low = err.lower()
        if "permission denied" in low or "operation not permitted" in low or "ptrace" in low:
            raise DumpRefused(f"pid {pid}: {PTRACE_FIX}", True)
        raise DumpRefused(f"py-spy dump of pid {pid} failed: {err.splitlines()[-1] if err else res.returncode}", False)
    try:
        threads = json.loads(res.stdout)
    except ValueError:
        raise DumpRefused(f"py-spy dump of pid {pid}: unreadable output", False) from None
    text = format_dump(threads, label, pid, actor)
    return Dump(text, stacks.latest(text), time.time(), sample_in_flight(threads, pid))


INDEX_NAMES = ("idx", "index", "i", "item", "key")


def sample_in_flight(threads: list[dict], pid: int) -> str | None:
    """The index a DataLoader worker's main thread is fetching, from its frames' locals: the
    ``__getitem__`` argument, and the batch ``fetch`` was given (None when not fetching)."""
    main = next((t for t in threads if isinstance(t, dict) and t.get("os_thread_id") == pid), None)
    if main is None:
        return None
    index = batch = None
    for f in main.get("frames") or []:
        found = {v.get("name"): v.get("repr") for v in f.get("locals") or [] if isinstance(v, dict)}
        if f.get("name") == "__getitem__" and index is None:
            index = next((found[n] for n in INDEX_NAMES if found.get(n) is not None), None)
        if f.get("name") == "fetch" and "_utils" in str(f.get("filename")) and batch is None:
            batch = found.get("possibly_batched_index")
    if index is None and batch is None:
        return None
    text = f"index {index}" if index is not None else ""
    if batch is not None:
        text += f" (batch {batch})" if text else f"batch {batch}"
    return text[:200]


def format_dump(threads: list[dict], label: str, pid: int, actor: str) -> str:
    """py-spy's JSON as faulthandler writes a dump (innermost frame first)."""
    return pyspy_as_faulthandler(threads if isinstance(threads, list) else [], label, pid, actor)


def gone(pid: int) -> bool:
    return not os.path.exists(f"/proc/{pid}")
