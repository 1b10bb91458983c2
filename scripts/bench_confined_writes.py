"""What writing a run's files without following links costs (issue 40): a status record as
the Reporter writes it once a second in every process of a job, the old way (``write_atomic``
on the record's path) and the new way (``status/`` made and opened ``O_NOFOLLOW`` under the
run folder, the record written in that folder), and one ``events.jsonl`` line as the launcher
appends it (the run folder opened and proven each time). Rounds alternate; the median of each
is kept. Prints one JSON line:

- path_us / confined_us: microseconds per status record, old way / new way
- confined_over_path: the ratio (1.0: no cost)
- event_us: microseconds per event appended through ``RunDir.append_event``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ups.runs.rundir import RunDir
from ups.status.confined import in_folder, make_dirs
from ups.status.files import write_atomic

RECORD = json.dumps({"pid": 1, "phase": "train", "step": 12345, "heartbeat_at": 0.0, "pad": "x" * 600}).encode()


def per_write_us(fn, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--writes", type=int, default=2000, help="writes per round")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run = RunDir.create(tmp, "bench")
        path = str(run.status_dir / "rank-0.json")

        def old() -> None:
            write_atomic(path, RECORD)

        def new() -> None:
            folder = make_dirs(str(run.path), "status")
            try:
                write_atomic(in_folder(folder, "rank-0.json"), RECORD)
            finally:
                os.close(folder)

        olds, news = [], []
        for _ in range(args.rounds):
            olds.append(per_write_us(old, args.writes))
            news.append(per_write_us(new, args.writes))
        event = per_write_us(lambda: run.append_event("bench", actor="bench"), args.writes)
    path_us, confined_us = statistics.median(olds), statistics.median(news)
    print(json.dumps({"path_us": round(path_us, 1), "confined_us": round(confined_us, 1),
                      "confined_over_path": round(confined_us / path_us, 2), "event_us": round(event, 1),
                      "writes": args.writes, "rounds": args.rounds}))


if __name__ == "__main__":
    main()
