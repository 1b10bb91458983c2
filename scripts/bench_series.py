"""Cost of keeping every step's loss for the metrics series (issue 38). One JSON line.

- note_loss_ns: the training thread's cost of one CPU loss captured (``Capture.note_loss``:
  detach, the value read for the NaN check, a queue entry), best block of 1,000;
- heartbeat_read_ns_per_step: the heartbeat thread's read of those losses (``Capture.sample``
  over a tick of 1,000 steps), per step;
- series_add_ns_per_step: the heartbeat thread's ``SeriesWriter.add`` of a tick's steps, per step;
- series_bytes: the series file after 100,000 steps with a NaN at step 60,000 (it stays
  bounded: recent detail, overview, the steps around the first NaN).

The training thread pays note_loss_ns whether or not the series keeps every step (the NaN check
reads the value already); the rest is the heartbeat thread's, once a tick.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

STEPS_PER_TICK = 1000


def main() -> None:
    import torch

    from ups.instrument.metrics import Capture
    from ups.status.series import SeriesWriter

    cap = Capture()
    losses = [torch.tensor(float(i) / 7) for i in range(64)]
    note = read = 1e18
    for _ in range(200):
        t0 = time.perf_counter_ns()
        for i in range(STEPS_PER_TICK):
            cap.note_loss(losses[i & 63], i)
        t1 = time.perf_counter_ns()
        cap.sample()
        t2 = time.perf_counter_ns()
        note, read = min(note, (t1 - t0) / STEPS_PER_TICK), min(read, (t2 - t1) / STEPS_PER_TICK)

    with tempfile.TemporaryDirectory() as run:
        w = SeriesWriter(run, "rank-0")
        add = 1e18
        for tick in range(100):
            base = tick * STEPS_PER_TICK
            steps = [(s, float("nan") if s >= 60_000 else 1.0 / (s + 1)) for s in range(base, base + STEPS_PER_TICK)]
            t0 = time.perf_counter_ns()
            w.add({"t": 1.8e9 + tick, "step": base, "loss": steps[-1][1], "rate": 1000.0}, steps=steps)
            add = min(add, (time.perf_counter_ns() - t0) / STEPS_PER_TICK)
        w.maybe_write(force=True)
        size = os.path.getsize(w.path)
    print(json.dumps({"note_loss_ns": round(note), "heartbeat_read_ns_per_step": round(read),
                      "series_add_ns_per_step": round(add), "series_bytes": size}))


if __name__ == "__main__":
    main()
