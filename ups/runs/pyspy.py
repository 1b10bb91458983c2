"""py-spy, run and read in one place: ``py-spy dump --json --nonblocking`` and its output.

py-spy is another program's output, a format we do not control. Every reader of a process's
stacks from outside (``ups attach``'s observer, ``ups stacks`` of an attached run, the dump
that replaces the stack-dump signal when a program reset its handler, and so the launcher's
hang proof) runs it through :func:`dump_json` and reads its JSON here:

* :func:`as_faulthandler` writes it as faulthandler writes a dump, under the header of a
  requested dump, so that :mod:`ups.why.stacks` reads it like any other stack file;
* :func:`sample_in_flight` reads a DataLoader worker's index from its frames' locals;
* :func:`loop_counters` a rank's loop counters from them (its steps when its stack stays alike);
* :func:`function_name` is a frame's own function name. py-spy 0.4.3 prints a frame's
  qualified name (``co_qualname``: ``Trainer._run_epoch``, ``Outer.<locals>.inner``) where
  0.4.1 and older printed ``_run_epoch``; a rule compares the last dotted part, and a reader
  shows the qualified name where it is known. Recorded dumps of one program from each
  version are in ``tests/data/pyspy/``.

The JSON is read, never the text form (``py-spy dump`` without ``--json``), whose layout
changed between versions too. ``--nonblocking`` reads the process's memory while it runs: it
is never paused and never signalled.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time

DUMP_TIMEOUT_S = 10.0
MISSING = "py-spy is not installed: no stacks (pip install 'ups[attach]'); watching CPU, I/O and the log only"
PTRACE_FIX = ("ptrace refused: run ups as the job's user, allow it with `sysctl kernel.yama.ptrace_scope=0` "
              "(Yama), or give the container CAP_SYS_PTRACE; watching CPU, I/O and the log only")
INDEX_NAMES = ("idx", "index", "i", "item", "key")
OUTSIDE = "(py-spy, read from outside)"
"""Said in the header of every dump read here: not written by the process's own handler."""


class DumpRefused(Exception):
    """No dump: py-spy missing, ptrace refused, or the process went away. ``lasting`` says that
    retrying will not help (said once, then no more dumps are tried)."""

    def __init__(self, message: str, lasting: bool) -> None:
        super().__init__(message)
        self.lasting = lasting


def executable() -> str | None:
    return shutil.which("py-spy")


def dump_json(pid: int, *, timeout: float = DUMP_TIMEOUT_S, with_locals: bool = False,
              exe: str | None = None) -> list[dict]:
    """Every thread of ``pid`` as py-spy's JSON gives it (a list of thread objects, each with its
    ``frames``, innermost first); DumpRefused says why not, in one line with the fix.
    ``with_locals``: the frames' local variables too (a DataLoader worker's index)."""
    exe = exe or executable()
    if exe is None:
        raise DumpRefused(MISSING, True)
    try:
        res = subprocess.run([exe, "dump", "--pid", str(pid), "--json", "--nonblocking",
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
        # Its first line says why ("Error: ..."); a backtrace may follow (its last line: "10: main").
        said = next((line.strip() for line in err.splitlines() if line.strip()), None)
        raise DumpRefused(f"py-spy dump of pid {pid} failed: {said or res.returncode}", False)
    try:
        threads = json.loads(res.stdout)
    except ValueError:
        raise DumpRefused(f"py-spy dump of pid {pid}: unreadable output", False) from None
    if not isinstance(threads, list):
        raise DumpRefused(f"py-spy dump of pid {pid}: unreadable output", False)
    return [t for t in threads if isinstance(t, dict)]


def function_name(name: object) -> str:
    """A frame's own function name, whichever way its tool printed it: ``Trainer._run_epoch``
    (py-spy >= 0.4.3, ``co_qualname``) and ``_run_epoch`` (older py-spy, faulthandler, a
    traceback) both give ``_run_epoch``; ``outer.<locals>.inner`` gives ``inner``."""
    return str(name or "").rsplit(".", 1)[-1]


def _frames(thread: dict) -> list[dict]:
    return [f for f in thread.get("frames") or [] if isinstance(f, dict)]


def as_faulthandler(threads: list[dict], label: str, pid: int, actor: str, note: str | None = None) -> str:
    """py-spy's JSON as faulthandler writes a dump (innermost frame first), under the header of
    a requested dump that :mod:`ups.why.stacks` reads; ``note`` (why py-spy was used) is a line
    of its own under the header. The frame's name is kept as py-spy printed it (qualified where
    it could)."""
    lines = [f"=== stack dump of {label} pid {pid} requested by {actor} at {time.strftime('%Y-%m-%d %H:%M:%S')} "
             f"{OUTSIDE} ==="]
    if note:
        lines.append(f"({note})")
    for t in threads:
        if not isinstance(t, dict):
            continue
        tid = t.get("thread_id") or t.get("os_thread_id") or 0
        try:
            tid = int(tid)
        except (TypeError, ValueError):
            tid = 0
        current = t.get("os_thread_id") == pid
        lines.append(f"{'Current thread' if current else 'Thread'} 0x{tid:016x} (most recent call first):")
        for f in _frames(t):
            lines.append(f'  File "{f.get("filename")}", line {f.get("line")} in {f.get("name")}')
        lines.append("")
    return "\n".join(lines) + "\n"


def loop_counters(threads: list[dict], pid: int) -> tuple:
    """The main thread's integer locals, frame by frame (function, name, value), innermost first:
    a loop's counters (Lightning's ``batch_idx`` in ``training_step`` and in its epoch loop, a
    plain loop's ``step`` or ``i``). Two reads of a rank whose frames are the same but whose
    counters differ went round in between (a step that sleeps or waits most of its time is read
    at the same line every time). Only plain integers: an object's repr carries its address,
    which changes with every new tensor."""
    main = next((t for t in threads if isinstance(t, dict) and t.get("os_thread_id") == pid), None)
    if main is None:
        return ()
    found = []
    for f in _frames(main):
        for v in f.get("locals") or []:
            value = _int(v.get("repr")) if isinstance(v, dict) else None
            if value is not None:
                found.append((function_name(f.get("name")), str(v.get("name")), value))
    return tuple(found)


LIGHTNING_MODULE = ("lightning/pytorch/core/module.py", "pytorch_lightning/core/module.py")
LIGHTNING_TRAINER = ("lightning/pytorch/trainer/trainer.py", "pytorch_lightning/trainer/trainer.py")


def _int(r: object) -> int | None:
    return int(r) if isinstance(r, str) and 0 < len(r) <= 20 and r.lstrip("-").isdigit() else None


def trainer_position(threads: list[dict], pid: int) -> dict | None:
    """Where a Lightning rank's fit loop is, from its main thread's frames (py-spy ``--locals``):
    ``LightningModule.optimizer_step(epoch, batch_idx, ...)``'s arguments, and ``max_epochs``
    from ``Trainer._run``'s locals where it is set (-1: no end in epochs). None when the read
    caught the rank anywhere else (between two epochs, validating, waiting for its data): no
    guess. Recorded samples: tests/data/pyspy/lightning-*.json."""
    main = next((t for t in threads if isinstance(t, dict) and t.get("os_thread_id") == pid), None)
    if main is None:
        return None
    found: dict = {}
    for f in _frames(main):
        path = str(f.get("filename") or "").replace("\\", "/")
        name = function_name(f.get("name"))
        got = {v.get("name"): _int(v.get("repr")) for v in f.get("locals") or [] if isinstance(v, dict)}
        if name == "optimizer_step" and path.endswith(LIGHTNING_MODULE) and "epoch" not in found:
            if got.get("epoch") is not None and got.get("batch_idx") is not None:
                found.update(epoch=got["epoch"], batch_idx=got["batch_idx"])
        elif name == "_run" and path.endswith(LIGHTNING_TRAINER) and (got.get("max_epochs") or 0) > 0:
            found["max_epochs"] = got["max_epochs"]
    return found if "epoch" in found else None


def sample_in_flight(threads: list[dict], pid: int) -> str | None:
    """The index a DataLoader worker's main thread is fetching, from its frames' locals: the
    ``__getitem__`` argument, and the batch torch's ``fetch`` was given (None when not fetching)."""
    main = next((t for t in threads if isinstance(t, dict) and t.get("os_thread_id") == pid), None)
    if main is None:
        return None
    index = batch = None
    for f in _frames(main):
        found = {v.get("name"): v.get("repr") for v in f.get("locals") or [] if isinstance(v, dict)}
        name = function_name(f.get("name"))
        if name == "__getitem__" and index is None:
            index = next((found[n] for n in INDEX_NAMES if found.get(n) is not None), None)
        if name == "fetch" and "_utils" in str(f.get("filename")) and batch is None:
            batch = found.get("possibly_batched_index")
    if index is None and batch is None:
        return None
    text = f"index {index}" if index is not None else ""
    if batch is not None:
        text += f" (batch {batch})" if text else f"batch {batch}"
    return text[:200]
