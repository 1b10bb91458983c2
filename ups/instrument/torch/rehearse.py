"""Faults any program launched by ``ups launch torchrun|python --inject`` rehearses, with no code
change (``ups.faults.PROGRAM_FAULTS``): a straggler and a one-off pause, applied by the hooks.

- ``slow_step:rank=R,ms=M,after=S[,mode=wait|spin]``: from S seconds after rank R's first
  optimizer step, M ms more at every step on its main thread: waiting (``wait``, the default: a
  slower device, which the host waits for) or CPU work (``spin``: a slower CPU-bound step);
- ``slow_sample:rank=R,ms=M,after=S``: rank R's DataLoader takes M ms more per sample (a slow
  disk or a heavier decode on one node), in its DataLoader workers (not with ``num_workers=0``);
- ``pause:rank=R,s=S,after=A``: once, rank R stops for S seconds (a GC pause, a one-off
  checkpoint): nothing may be named for it.

``after`` counts from the rank's first optimizer step. The rank writes that time into a shared
anonymous mapping made when torch is instrumented, before any worker forks, so its forked
DataLoader workers see it whenever they were started (an epoch's workers start before its first
step); spawn-context workers get it from the environment they inherit (``UPS_FAULT_T0``), set at
that step. Each fault says once on stderr when it starts.
"""

from __future__ import annotations

import mmap
import os
import struct
import sys
import time

ENV_T0 = "UPS_FAULT_T0"

_faults: list | None = None  # parsed once per process
_clock: mmap.mmap | None = None  # the rank's first step (a double), shared with its forked workers
_said: set[str] = set()
_paused = False


def _load() -> list:
    global _faults
    if _faults is None:
        from ups.faults import parse_faults

        try:
            _faults = [f for f in parse_faults(os.environ.get("UPS_FAULTS")) if f.name in ("slow_step", "slow_sample", "pause")]
        except Exception:  # noqa: BLE001 - a bad spec was refused at launch; never in the program's way
            _faults = []
    return _faults


def wanted() -> bool:
    """Whether this process has any program fault to rehearse (the hooks' cheap check)."""
    global _clock
    if not (os.environ.get("UPS_FAULTS") and _load()):
        return False
    if _clock is None:
        try:
            _clock = mmap.mmap(-1, 8)  # MAP_SHARED: a forked child writes and reads the same page
        except (OSError, ValueError):
            _clock = None
    return True


def _t0() -> float | None:
    if _clock is not None:
        (t0,) = struct.unpack_from("d", _clock)
        if t0:
            return t0
    value = os.environ.get(ENV_T0)
    return float(value) if value else None


def _started(fault, rank: int | None) -> bool:
    if fault.get("rank", rank) != rank:
        return False
    t0 = _t0()
    if t0 is None:
        return False
    if time.time() < t0 + float(fault.get("after", 0)):
        return False
    if str(fault) not in _said:
        _said.add(str(fault))
        print(f"ups: rehearsing {fault} on rank {rank} from {time.time():.3f}", file=sys.stderr, flush=True)
    return True


def on_step(rank: int | None) -> None:
    """At each optimizer step of a rank: the first one starts the clock."""
    global _paused
    if ENV_T0 not in os.environ:
        now = time.time()
        os.environ[ENV_T0] = repr(now)
        if _clock is not None:
            struct.pack_into("d", _clock, 0, now)
    for f in _load():
        if f.name == "slow_step" and _started(f, rank):
            seconds = float(f.get("ms", 10)) / 1e3
            if f.get("mode") == "spin":
                end = time.perf_counter() + seconds
                while time.perf_counter() < end:  # work: the rank's core is busy
                    pass
            else:
                time.sleep(seconds)
        elif f.name == "pause" and not _paused and _started(f, rank):
            _paused = True
            time.sleep(float(f.get("s", 3)))


def on_sample(rank: int | None) -> None:
    """At each sample a DataLoader fetches for ``rank``."""
    for f in _load():
        if f.name == "slow_sample" and _started(f, rank):
            time.sleep(float(f.get("ms", 1)) / 1e3)
