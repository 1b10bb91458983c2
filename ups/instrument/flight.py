"""PyTorch's Flight Recorder, dumped into the run folder when a rank goes quiet or a collective fails.

When the program runs with the Flight Recorder on (``TORCH_FR_BUFFER_SIZE``, or its older name
``TORCH_NCCL_TRACE_BUFFER_SIZE``, above 0), torch keeps each rank's last collectives in memory,
gloo's as well as NCCL's. NCCL's watchdog writes them out on a timeout; gloo has no watchdog
that does, and a hang that has not timed out yet writes nothing. So a rank's own process writes
its buffer, in torch's JSON form (``_dump_fr_trace_json``), to ``<run>/flight/<name>.json``:

* from the heartbeat thread, once a quiet spell (no step, no phase change, no collective entered
  or left) lasts :data:`QUIET_S` (or :data:`QUIET_P99` times the rank's p99 step interval when
  that is longer: slow steps are no quiet spell), once per spell: the main thread may be
  blocked in C++, the heartbeat thread is not;
* from the collective's wrapper when a collective raises (a gloo timeout, a size mismatch).

``ups why`` reads them (:mod:`ups.why.flight`). Nothing happens without the Flight Recorder on:
no file, and one integer compare per heartbeat.
"""

from __future__ import annotations

import os
import sys
import time

QUIET_S = 5.0
QUIET_P99 = 3.0  # times the rank's learned p99 step interval, when that is longer
ENV_BUFFER = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
FLIGHT_DIR = "flight"


def recording() -> bool:
    """Whether the program runs with the Flight Recorder's buffer on."""
    for name in ENV_BUFFER:
        value = os.environ.get(name)
        if value is not None:
            try:
                return int(value) > 0
            except ValueError:
                return False
    return False


def dump(rep) -> str | None:  # a Reporter
    """Write this process's Flight Recorder buffer as JSON; the path, or None. Never raises."""
    c10d = sys.modules.get("torch._C._distributed_c10d")
    dump_json = getattr(c10d, "_dump_fr_trace_json", None)
    if dump_json is None:
        return None
    try:
        from ups.status.confined import make_dirs, write_atomic_at

        data = dump_json()
        if not data:
            return None
        # flight/ made when missing and opened O_NOFOLLOW, the file written relative to it: never
        # through a link (docs/safety.md); a vanished run folder is never made again.
        folder = make_dirs(rep.run_dir, FLIGHT_DIR)
        try:
            write_atomic_at(folder, f"{rep.name}.json", bytes(data))
        finally:
            os.close(folder)
        return os.path.join(rep.run_dir, FLIGHT_DIR, f"{rep.name}.json")
    except Exception:  # noqa: BLE001 - evidence is a bonus, never a failure of the program
        return None


class QuietWatch:
    """A Reporter sampler: dumps the buffer once per quiet spell of :data:`QUIET_S` or longer."""

    def __init__(self, rep) -> None:
        self.rep = rep
        self.dumped_for: float | None = None  # the quiet spell (its start) already dumped

    def __call__(self) -> dict:
        since = self.rep.quiet_since
        p99 = self.rep.interval_p99
        quiet = max(QUIET_S, QUIET_P99 * p99) if p99 else QUIET_S  # a loop of 10 s steps is not quiet at 5 s
        if since != self.dumped_for and time.monotonic() - since >= quiet:
            self.dumped_for = since
            if dump(self.rep):
                return {"flight_dump": f"{FLIGHT_DIR}/{self.rep.name}.json"}
        return {}


_watched: list = []  # the reporters already watched (one per process; a forked child's is its own)


def watch(rep) -> None:
    """Start dumping for this rank's reporter (after init_process_group) when the recorder is on."""
    if rep is None or not recording() or any(r is rep for r in _watched):
        return
    _watched.append(rep)
    rep.add_sampler(QuietWatch(rep))


def on_error(rep) -> None:
    """A collective raised: write the buffer now (the process may be about to end)."""
    if rep is not None and recording():
        dump(rep)
