"""Stack dumps: faulthandler registered for fatal signals and for a stack-dump signal, writing
to ``stacks/<name>.txt`` in the run folder (the Reporter's collaborator, see
:mod:`ups.status.reporter`).

The signal is a real-time one (``SIGRTMIN+7``), not SIGUSR1: programs own SIGUSR1
(Lightning's teardown resets it to its default, SLURM's ``--signal=USR1`` and requeue,
servers), and no framework we know touches real-time signals. The record names the signal,
so tools only send it to processes that registered it (by default that signal kills a
process); if the program later installs its own handler for it, or resets it, the record
stops naming it (tools also check the live caught-signal mask before every send: see
ups.runs.signals).

Imported by every instrumented process: standard library's light modules only.
"""

from __future__ import annotations

import _signal  # signal's constants and getsignal, without the enums signal.py builds at import
import faulthandler
import os
import threading

from ups.status import procfs
from ups.status.confined import make_dirs, open_append

ENV_STACK_SIGNAL = "UPS_STACK_SIGNAL"
DEFAULT_STACK_SIGNAL = int(_signal.SIGRTMIN) + 7  # see the module's docstring: not SIGUSR1

TYPE_CHECKING = False  # typing costs ~10 ms to import; annotations here are strings
if TYPE_CHECKING:
    from typing import Any


def catches_self(signum: int) -> bool | None:
    """Whether this process has a handler for ``signum`` (its SigCgt mask), None if unknown."""
    mask = (procfs.status("self") or {}).get("SigCgt")  # read past the open() hook (procfs)
    try:
        return None if mask is None else bool(int(mask, 16) >> (signum - 1) & 1)
    except ValueError:
        return None


class StackDumps:
    """This process's stack file (``file``, ``rel``: its path in the run folder) and the
    signal that dumps every thread's stack into it (``signal``, None when there is none)."""

    def __init__(self) -> None:
        self.file: Any = None
        self.signal: int | None = None
        self.rel: str | None = None

    def install(self, run_dir: str, name: str, signum: int) -> str | None:
        """Register faulthandler for fatal signals and ``signum``; returns what went wrong, if anything."""
        stacks = os.path.join(run_dir, "stacks")
        try:
            stacks_fd = make_dirs(run_dir, "stacks")  # never through a link (ups.status.confined)
            try:
                self.file = open(f"{name}.txt", "a", buffering=1,
                                 opener=lambda name, _flags: open_append(name, dir_fd=stacks_fd))
            finally:
                os.close(stacks_fd)
            # disable() first: after a fork (DataLoader workers) faulthandler still believes it
            # is enabled and enable() would keep whatever SIGSEGV handler was set since (torch
            # installs its own in workers), so the crash traceback would never be written.
            faulthandler.disable()
            faulthandler.enable(file=self.file, all_threads=True)
            faulthandler.unregister(signum)
            faulthandler.register(signum, file=self.file, all_threads=True, chain=False)
        except (OSError, ValueError, RuntimeError) as exc:
            return f"could not register stack dumps in {stacks}: {exc}"
        self.signal = int(signum)
        self.rel = f"stacks/{name}.txt"
        return None

    def rename(self, run_dir: str, new_name: str) -> None:
        """The process took a new name: its stack file follows (faulthandler's open descriptor
        follows the file), unless the new name's file exists already (then the old one is kept)."""
        if self.rel is None:
            return
        old_stack = os.path.join(run_dir, self.rel)
        new_rel = f"stacks/{new_name}.txt"
        new_stack = os.path.join(run_dir, new_rel)
        try:
            if not os.path.exists(new_stack):
                os.rename(old_stack, new_stack)
                self.rel = new_rel
        except OSError:
            pass

    def rearm_fatal_handler(self) -> None:
        """Put faulthandler back in front for fatal signals, after a library (``import torch``)
        installed its own SIGSEGV handler over it. faulthandler dumps, then hands the signal
        on to the handler it replaced."""
        if self.file is None:
            return
        try:
            faulthandler.disable()
            faulthandler.enable(file=self.file, all_threads=True)
        except (OSError, ValueError, RuntimeError):
            pass

    def append_text(self, text: str) -> None:
        """Append text (a traceback) to the stack file; never raises."""
        if self.file is None:
            return
        try:
            self.file.write(text if text.endswith("\n") else text + "\n")
            self.file.flush()
        except (OSError, ValueError):
            pass

    def check_handler(self) -> None:
        """A program that installs its own Python handler for our signal replaces faulthandler's,
        and one that resets it (``signal.signal(sig, SIG_DFL)``) leaves the default, deadly
        action: from then on the record must stop inviting tools to send it."""
        sig = self.signal
        if sig is None or threading.current_thread() is threading.main_thread():
            return
        if callable(_signal.getsignal(sig)) or catches_self(sig) is False:
            self.signal = None
