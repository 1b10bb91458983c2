"""Fault rehearsal in the precompute job: what its ``UPS_FAULTS`` hooks do, and when.

The faults are named and parsed in ``ups.faults`` (so that the CLI checks ``--inject``
without torch); this module is what the job does with them:

* ``slow_read`` sleeps before every read, in a worker or in the main process;
* ``worker_hang`` and ``worker_crash`` hang or end a DataLoader worker at one sample
  (``sample=``) or after a count (``after=``). Each fires once across every process of the
  run (``times=N``: N times), or the loader rebuilt over the remaining samples would meet
  the same fault again, forever;
* ``write_enospc`` and ``write_hang`` name the sample of a batch whose write fails or never
  returns; ``ups.jobs.writers`` carries them out.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path

from ups.faults import Fault, Faults


def fire_once(run_dir: str | None, fault: Fault) -> bool:
    """True the first time across all processes of the run (``times=N`` allows N)."""
    times = int(fault.get("times", 1))
    if times <= 0 or run_dir is None:
        return run_dir is None
    from ups.status.confined import make_dirs

    marker_dir = make_dirs(run_dir, "faults")  # inside the run folder, no link followed
    try:
        for k in range(times):
            try:
                os.close(os.open(f"{fault.name}.{k}", os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW,
                                 dir_fd=marker_dir))
                return True
            except FileExistsError:
                continue
        return False
    finally:
        os.close(marker_dir)


def inject_hang(mode: str, run_dir: str | None = None) -> None:
    """Never return: ``gil`` blocks in ``h5py.File()`` holding the GIL, ``stop`` SIGSTOPs this
    process, anything else sleeps (the interpreter, heartbeats included, goes on)."""
    if mode == "gil":
        import h5py

        name = f"hang-fifo-{os.getpid()}"
        if run_dir is not None:  # in the run folder's faults/, gone with the run (never left in /tmp)
            from ups.status.confined import make_dirs

            fd = make_dirs(run_dir, "faults")
            try:
                with contextlib.suppress(FileExistsError):
                    os.mkfifo(name, dir_fd=fd)
            finally:
                os.close(fd)
            fifo = Path(run_dir) / "faults" / name
        else:
            fifo = Path(os.environ.get("TMPDIR", "/tmp")) / f"ups-fault-{name}"
            with contextlib.suppress(FileExistsError):
                os.mkfifo(fifo)
        h5py.File(fifo, "r")  # blocks in open() holding the GIL, like a hung network mount
    elif mode == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    while True:
        time.sleep(3600)


def before_read(faults: Faults, run_dir: str | None, worker: int | None, index: int, done: int) -> None:
    """The faults of one sample's read: ``worker`` is the DataLoader worker's id (None in the
    main process), ``done`` the samples that worker has read so far."""
    if not faults:
        return
    slow = faults.get("slow_read")
    if slow is not None:
        time.sleep(float(slow.get("delay", 0.2)))
    if worker is None:
        return  # hangs and crashes are rehearsed in worker processes
    for name in ("worker_hang", "worker_crash"):
        f = faults.get(name, worker=worker)
        if f is None:
            continue
        at_sample = f.get("sample")
        at_count = int(f.get("after", 0))
        due = index == at_sample if at_sample is not None else done >= at_count
        if due and fire_once(run_dir, f):
            print(f"ups: injected fault {f} in worker {worker} at sample {index}", file=sys.stderr, flush=True)
            if name == "worker_hang":
                inject_hang(str(f.get("mode", "sleep")), run_dir)
            if str(f.get("signal", "")).upper() in ("SEGV", "SIGSEGV"):
                os.kill(os.getpid(), signal.SIGSEGV)
            os._exit(1)  # a worker dying abruptly, as an OOM kill or a native crash would


def write_fault_at(faults: Faults, run_dir: str | None, name: str, base: int, n: int) -> int | None:
    """Where in a batch of ``n`` (the job's samples ``base``...) fault ``name`` fires, once."""
    f = faults.get(name)
    if f is None:
        return None
    for j in range(n):
        if base + j >= int(f.get("after", 0)) and fire_once(run_dir, f):
            return j
    return None
