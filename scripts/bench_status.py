"""Benchmark of the status protocol. Prints one JSON line.

- advance_ns: cost of Reporter.advance() per call (target < 2000 ns)
- write_us: cost of one record write (Reporter.flush: JSON + temp file + rename)
- read_classify_1024_ms: read 1,024 records from disk and classify them (target < 100 ms)
- help_overhead_s: `ups --help` wall time minus `python -c pass` (target < 0.3 s)
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ups.runs.rundir import RunDir  # noqa: E402
from ups.status.health import classify_run  # noqa: E402
from ups.status.procs import StaticProcessTable  # noqa: E402
from ups.status.reader import read_status_dir  # noqa: E402
from ups.status.record import StatusRecord  # noqa: E402
from ups.status.reporter import Reporter  # noqa: E402


def bench_advance(rep: Reporter, n: int = 1_000_000) -> float:
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter_ns()
        for _ in range(n):
            rep.advance()
        best = min(best, (time.perf_counter_ns() - t) / n)
    return best


def bench_write(rep: Reporter, n: int = 2000) -> float:
    t = time.perf_counter()
    for _ in range(n):
        rep.flush()
    return (time.perf_counter() - t) / n * 1e6


def bench_read_classify(tmp: Path, n: int = 1024) -> float:
    status = tmp / "many" / "status"
    status.mkdir(parents=True)
    now = time.time()
    pid, start = os.getpid(), Reporter(tmp / "many", stack_signal=None).snapshot().pid_start
    for i in range(n):
        rec = StatusRecord(
            run_id="bench", role="worker", name=f"rank-{i // 8}-worker-{i % 8}", pid=pid, pid_start=start,
            host=os.uname().nodename, rank=i // 8, worker=i % 8, heartbeat_at=now, progress_at=now,
            started_at=now - 100, phase_at=now, step=i, rate=float(i % 17), metrics={"loss": 0.1},
        )
        (status / f"{rec.name}.json").write_text(rec.to_json())
    times = []
    for _ in range(7):
        t = time.perf_counter()
        snap = read_status_dir(status)
        table = StaticProcessTable.snapshot(r.pid for r in snap.records)
        verdicts = classify_run(snap.records, time.time(), table)
        times.append((time.perf_counter() - t) * 1000)
        assert len(verdicts) == n and not snap.problems
    return statistics.median(times)


def wall(cmd: list[str], n: int = 7) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        run = RunDir.create(tmp / "runs", "bench")
        rep = Reporter(run.path, rank=0, interval=3600)
        advance_ns = bench_advance(rep)
        write_us = bench_write(rep)
        read_ms = bench_read_classify(tmp)
    env_cmd = [sys.executable, "-m", "ups", "--help"]
    help_s = wall(env_cmd)
    pass_s = wall([sys.executable, "-c", "pass"])
    print(json.dumps({
        "advance_ns": round(advance_ns, 1),
        "advance_target_ns": 2000,
        "write_us": round(write_us, 1),
        "read_classify_1024_ms": round(read_ms, 1),
        "read_classify_target_ms": 100,
        "help_s": round(help_s, 3),
        "python_pass_s": round(pass_s, 3),
        "help_overhead_s": round(help_s - pass_s, 3),
        "help_overhead_target_s": 0.3,
    }))


if __name__ == "__main__":
    main()
