"""`ups exporter`'s cost: one run of 256 ranks x 8 DataLoader workers (2,304 live records,
rewritten every 5 s by a generator so that they stay fresh), scraped over HTTP as Prometheus
would. Prints one JSON line.

- scrape_ms_median / scrape_ms_max: one GET of /metrics, read + verdict + text (target <= 100)
- scrape_cpu_ms: the exporter's CPU per scrape (what a scrape takes on a core of its own; on a
  loaded box the wall times above are mostly waiting for one)
- cpu_pct_at_15s: the exporter's CPU (all threads, from /proc) over --seconds while scraped every
  15 s, % of one core (target <= 1)
- read_ms / verdict_ms / families_ms / text_ms: where a scrape's CPU goes (process time, not
  wall time: on a shared box wall time is mostly waiting for a core), measured in this process
  on the same folder (median of --scrapes): open_run (every record read and judged),
  `ups why`'s verdict, the metric families, the endpoint's text (ups/exporter/text.py);
  client_text_ms: prometheus_client's generate_latest on the same families, for comparison
- series: samples in one scrape; series_per_rank: of them, per rank with its 8 workers
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

def generate(run: Path, ranks: int, workers: int) -> None:
    """The job's records, as its ranks and workers would write them: all of them, then again
    every 5 s (fresh heartbeats: every process reads ok). Runs in a process of its own, whose
    pid the records name (alive), until it is terminated."""
    import socket

    from ups.status.files import write_atomic
    from ups.status.procs import this_process_start
    from ups.status.record import GpuMemory, StatusRecord, process_name

    me = {"pid": os.getpid(), "pid_start": this_process_start(), "host": socket.gethostname(), "run_id": run.name}
    rank_metrics = {"loss": 0.1, "lr": 3e-4, "grad_norm": 1.5, "samples_per_s": 64.0}
    procs = [(r, None) for r in range(ranks)] + [(r, w) for r in range(ranks) for w in range(workers)]
    began = time.time()
    for tick in range(1 << 30):
        for i, (r, w) in enumerate(procs):
            role, at = ("rank" if w is None else "worker"), time.time()
            step = tick * (10 if w is None else 25) + i % 3
            extra = ({"phase": "train", "total": 10_000, "unit": "steps", "coll_seq": 3 * step, "metrics": rank_metrics,
                      "gpu": GpuMemory(0, 2 << 30, 3 << 30, 4 << 30)} if w is None else {"phase": "read", "unit": "samples"})
            rec = StatusRecord(role=role, name=process_name(role, r, w), rank=r, worker=w, world_size=ranks, step=step,
                               rate=2.0 + (i % 7) / 10, started_at=began, phase_at=began, heartbeat_at=at,
                               progress_at=at, **me, **extra)
            write_atomic(run / "status" / f"{rec.name}.json", rec.to_json().encode())
        if tick == 0:
            print("written", flush=True)
        time.sleep(5.0)


def cpu_seconds(pid: int) -> float:
    from ups.status import procfs  # the one reader of /proc

    st = procfs.stat(pid)
    if st is None:
        raise OSError(f"no process {pid}")
    return st.cpu_s()


def scrape(url: str) -> tuple[float, bytes]:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=30) as resp:
        body = resp.read()
    return time.perf_counter() - started, body


def split(run, scrapes: int) -> dict[str, float]:
    """The parts of one scrape, in this process (medians over ``scrapes``)."""
    from prometheus_client import CollectorRegistry, generate_latest

    from ups.exporter.families import Families
    from ups.exporter.text import exposition
    from ups.runs.read import open_run
    from ups.why import diagnose_view

    class Prebuilt:
        def __init__(self, families):
            self.fams = families

        def collect(self):
            return iter(self.fams)

    parts: dict[str, list[float]] = {"read_ms": [], "verdict_ms": [], "families_ms": [], "text_ms": [],
                                     "client_text_ms": []}
    for _ in range(scrapes):
        t0 = time.process_time()
        view = open_run(run)
        t1 = time.process_time()
        verdict = diagnose_view(view)
        t2 = time.process_time()
        fams = Families()
        fams.add_run(view, verdict)
        t3 = time.process_time()
        exposition(fams.families())
        t4 = time.process_time()
        registry = CollectorRegistry(auto_describe=False)
        registry.register(Prebuilt(fams.families()))
        generate_latest(registry)
        t5 = time.process_time()
        for key, took in zip(parts, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4), strict=True):
            parts[key].append(1000 * took)
    return {k: round(statistics.median(v), 1) for k, v in parts.items()}


def main() -> None:
    if sys.argv[1:2] == ["--generate"]:
        sys.path.insert(0, str(REPO))
        return generate(Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=256)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--scrapes", type=int, default=10, help="back-to-back scrapes timed")
    ap.add_argument("--seconds", type=float, default=60.0, help="window of the CPU figure (scraped every 15 s)")
    args = ap.parse_args()
    env = dict(os.environ, PYTHONPATH=str(REPO))
    sys.path.insert(0, str(REPO))
    from ups.runs.rundir import RunDir

    with tempfile.TemporaryDirectory() as d:
        root = Path(d) / "runs"
        run = RunDir.create(root, "train", extra={"world_size": args.ranks})
        run.set_state("running")
        gen = subprocess.Popen([sys.executable, __file__, "--generate", str(run.path), str(args.ranks), str(args.workers)],
                               env=env, stdout=subprocess.PIPE, text=True)
        exporter = None
        try:
            assert gen.stdout is not None and gen.stdout.readline().strip() == "written"
            # cwd: `python -m` puts the current folder first, before PYTHONPATH: this tree's ups, not another's
            exporter = subprocess.Popen([sys.executable, "-m", "ups", "exporter", "--port", "0", "--runs-dir", str(root)],
                                        env=env, stdout=subprocess.PIPE, text=True, cwd=REPO)
            assert exporter.stdout is not None
            url = exporter.stdout.readline().split()[1]
            scrape(url)  # the first read pays for imports
            times, body = [], b""
            cpu_before = cpu_seconds(exporter.pid)
            for _ in range(args.scrapes):
                took, body = scrape(url)
                times.append(took)
            scrape_cpu = (cpu_seconds(exporter.pid) - cpu_before) / args.scrapes
            lines = [ln for ln in body.decode().splitlines() if ln and not ln.startswith("#")]
            per_run = [ln for ln in lines if ln.startswith("ups_run_")]
            own = [ln for ln in lines if ln.startswith("ups_exporter_")]
            cpu0, wall0 = cpu_seconds(exporter.pid), time.monotonic()
            scrapes_in_window = 0
            while time.monotonic() - wall0 < args.seconds:
                scrape(url)
                scrapes_in_window += 1
                time.sleep(max(0.0, min(15.0, args.seconds - (time.monotonic() - wall0))))
            cpu_pct = 100 * (cpu_seconds(exporter.pid) - cpu0) / (time.monotonic() - wall0)
            parts = split(run, args.scrapes)
        finally:
            for p in (exporter, gen):
                if p is not None:
                    p.terminate()
                    p.wait(10)
    print(json.dumps({
        "ranks": args.ranks, "workers_per_rank": args.workers, "records": args.ranks * (args.workers + 1),
        "scrape_ms_median": round(1000 * statistics.median(times), 1), "scrape_ms_max": round(1000 * max(times), 1),
        "scrape_cpu_ms": round(1000 * scrape_cpu, 1), "scrape_target_ms": 100, **parts, "series": len(lines),
        "series_per_rank": round((len(lines) - len(per_run) - len(own)) / args.ranks, 1), "series_per_run": len(per_run),
        "bytes": len(body), "cpu_window_s": args.seconds, "scrapes_in_window": scrapes_in_window,
        "cpu_pct_at_15s": round(cpu_pct, 2), "cpu_target_pct": 1.0,
    }))


if __name__ == "__main__":
    main()
