"""Console load: 256 ranks x 8 DataLoader workers writing records at 1 Hz each, the console
headless, refreshing every second, for 30 s. Prints one JSON line.

- console_cpu_pct: CPU of the console process (all threads) over the window, % of one core
  (target < 15)
- slowest_refresh_ms: the slowest redraw of a snapshot on the UI thread (target < 100)
- slowest_read_ms: the slowest poll (files read + health) in the poll thread
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

GENERATOR = textwrap.dedent(
    """
    import os, socket, sys, time
    from pathlib import Path
    from ups.status.procs import this_process_start
    from ups.status.record import StatusRecord, process_name
    from ups.status.files import write_atomic
    run, ranks, workers = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    pid, start, host = os.getpid(), this_process_start(), socket.gethostname()
    names = [("rank", r, None) for r in range(ranks)] + [("worker", r, w) for r in range(ranks) for w in range(workers)]
    t0 = time.time()
    tick = 0
    while True:
        tick_start = time.time()
        for i, (role, r, w) in enumerate(names):
            now = time.time()
            step = tick * (2 if role == "rank" else 5) + (i % 3)
            rec = StatusRecord(run_id=run.name, role=role, name=process_name(role, r, w), pid=pid, pid_start=start,
                               host=host, rank=r, worker=w, world_size=ranks, phase="train" if role == "rank" else "read",
                               step=step, total=10_000 if role == "rank" else None, unit="steps" if role == "rank" else "samples",
                               rate=2.0 + (i % 7) * 0.1, started_at=t0, heartbeat_at=now, progress_at=now, phase_at=t0,
                               item=None if role == "rank" else f"shard_{w:03d}.h5#{step}", metrics={"loss": 0.1})
            write_atomic(run / "status" / f"{rec.name}.json", rec.to_json().encode())
        tick += 1
        time.sleep(max(0.0, 1.0 - (time.time() - tick_start)))
    """
)

CONSOLE = textwrap.dedent(
    """
    import json, resource, sys, time
    from console.app import UpsConsole
    runs, run_id, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    app = UpsConsole(runs, run_id=run_id, refresh=1.0, gpu_provider=None)
    box = {}
    def start():
        box["t"] = time.perf_counter(); r = resource.getrusage(resource.RUSAGE_SELF); box["cpu"] = r.ru_utime + r.ru_stime
        app.stats.__init__()  # measure the steady state only
    def stop():
        r = resource.getrusage(resource.RUSAGE_SELF)
        box["cpu_used"] = (r.ru_utime + r.ru_stime) - box["cpu"]; box["wall"] = time.perf_counter() - box["t"]
        app.exit()
    def on_ready():
        app.set_timer(3.0, start)  # after start-up and the first full read
        app.set_timer(3.0 + seconds, stop)
    app.call_later(on_ready)
    app.run(headless=True, size=(120, 40))
    s = app.stats
    print(json.dumps({"cpu_pct": 100 * box["cpu_used"] / box["wall"], "refreshes": s.count, "max_ms": s.max_ms,
                      "mean_ms": s.total_ms / max(1, s.count), "max_read_ms": s.max_read_ms}))
    """
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=256)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=30.0)
    args = ap.parse_args()
    env = dict(os.environ, PYTHONPATH=str(REPO))
    sys.path.insert(0, str(REPO))
    from ups.runs.rundir import RunDir

    with tempfile.TemporaryDirectory() as d:
        run = RunDir.create(Path(d) / "runs", "train", extra={"world_size": args.ranks})
        run.set_state("running")
        gen = subprocess.Popen([sys.executable, "-c", GENERATOR, str(run.path), str(args.ranks), str(args.workers)], env=env)
        try:
            while len(list(run.status_dir.glob("*.json"))) < args.ranks * (args.workers + 1):
                time.sleep(0.2)
            res = subprocess.run([sys.executable, "-c", CONSOLE, str(run.path.parent), run.run_id, str(args.seconds)],
                                 env=env, capture_output=True, text=True, timeout=args.seconds + 120)
        finally:
            gen.kill()
            gen.wait()
    if res.returncode != 0:
        raise SystemExit(res.stderr[-2000:])
    out = json.loads(res.stdout.strip().splitlines()[-1])
    print(json.dumps({
        "ranks": args.ranks, "workers_per_rank": args.workers, "records": args.ranks * (args.workers + 1),
        "seconds": args.seconds, "refreshes": out["refreshes"],
        "console_cpu_pct": round(out["cpu_pct"], 1), "console_cpu_target_pct": 15,
        "slowest_refresh_ms": round(out["max_ms"], 1), "mean_refresh_ms": round(out["mean_ms"], 1),
        "slowest_refresh_target_ms": 100, "slowest_read_ms": round(out["max_read_ms"], 1),
    }))


if __name__ == "__main__":
    main()
