"""Faults any program launched by ``ups launch torchrun|python --inject`` rehearses, with no code
change (``ups.faults.PROGRAM_FAULTS``): a straggler and a one-off pause, applied by the hooks.

- ``slow_step:rank=R,ms=M,after=S``: from S seconds after rank R's first optimizer step, M ms of
  CPU work on its main thread at every step (a rank whose compute is slower: a throttled GPU);
- ``slow_sample:rank=R,ms=M,after=S``: rank R's DataLoader takes M ms more per sample (a slow
  disk or a heavier decode on one node), in its DataLoader workers (not with ``num_workers=0``);
- ``pause:rank=R,s=S,after=A``: once, rank R stops for S seconds (a GC pause, a one-off
  checkpoint): nothing may be named for it.

``after`` counts from the rank's first optimizer step, which it tells its DataLoader workers
through the environment they inherit (``UPS_FAULT_T0``): workers started before that step
(persistent workers) never slow. Each fault says once on stderr when it starts.
"""

from __future__ import annotations

import os
import sys
import time

ENV_T0 = "UPS_FAULT_T0"

_faults: list | None = None  # parsed once per process
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
    return bool(os.environ.get("UPS_FAULTS")) and bool(_load())


def _started(fault, rank: int | None) -> bool:
    if fault.get("rank", rank) != rank:
        return False
    t0 = os.environ.get(ENV_T0)
    if t0 is None:
        return False
    if time.time() < float(t0) + float(fault.get("after", 0)):
        return False
    if str(fault) not in _said:
        _said.add(str(fault))
        print(f"ups: rehearsing {fault} on rank {rank} from {time.time():.3f}", file=sys.stderr, flush=True)
    return True


def on_step(rank: int | None) -> None:
    """At each optimizer step of a rank: the first one starts the clock."""
    global _paused
    if ENV_T0 not in os.environ:
        os.environ[ENV_T0] = repr(time.time())
    for f in _load():
        if f.name == "slow_step" and _started(f, rank):
            end = time.perf_counter() + float(f.get("ms", 10)) / 1e3
            while time.perf_counter() < end:  # work, not a sleep: the rank's core is busy
                pass
        elif f.name == "pause" and not _paused and _started(f, rank):
            _paused = True
            time.sleep(float(f.get("s", 3)))


def on_sample(rank: int | None) -> None:
    """At each sample a DataLoader fetches for ``rank``."""
    for f in _load():
        if f.name == "slow_sample" and _started(f, rank):
            time.sleep(float(f.get("ms", 1)) / 1e3)
