"""What watching a job from outside costs it: `ups attach` on a CPU-bound torch training loop
(one process, one thread, no sleep: every cycle taken from it shows). Prints one JSON line.

- rate_change_pct: the job's step rate while attached (the real observer: /proc once a second,
  ``py-spy dump --nonblocking`` every 10 s) against not attached, median over alternating windows
  (``--pairs`` x (detached, attached), ``--window`` s each; target |change| <= 1)
- noise_pct: the spread of the detached windows' rates alone (max - min over the median): on a
  shared box a change below it is not measurable, and the two figures below bound the cost
- observer_cpu_pct: the observer's own CPU while attached, % of one core: all it can take from
  the job, and only when every core is busy
- ``--notify``: attach with ``--notify cmd:cat >/dev/null`` (a local target): the observer then
  also judges the run with ``ups why``'s rules every 2 s; the figures above include that
- dump_wall_ms / blocking_bound_pct_at_10s: median wall time of one *blocking* `py-spy dump`
  (an upper bound on how long it stops the job) and that bound at one dump every 10 s; the
  observer dumps with --nonblocking, which does not stop the job at all
- nonblocking_lost_pct_at_10_per_s: the job's rate lost while dumped --nonblocking 10 times a
  second (100 x the observer's rate), against not dumped, alternating 3 s windows
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

JOB = textwrap.dedent(
    """
    import sys, time
    import torch
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(32, 64), torch.randn(32, 1)
    step = 0
    out = open(sys.argv[1], "a", buffering=1)
    while True:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        step += 1
        if step % 50 == 0:
            out.write(f"{step} {time.monotonic()}\\n")
    """
)


def rate(log: Path, t0: float, t1: float) -> float:
    pts = []
    for line in log.read_text().splitlines():
        try:
            step, at = line.split()
            step, at = int(step), float(at)
        except ValueError:
            continue
        if t0 <= at <= t1:
            pts.append((at, step))
    if len(pts) < 2:
        return float("nan")
    return (pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0])


def cpu_s(pid: int) -> float:
    """utime + stime of a process and its reaped children (py-spy), in seconds."""
    from ups.status import procfs  # the one reader of /proc

    st = procfs.stat(pid)
    if st is None:
        raise OSError(f"no process {pid}")
    return st.cpu_s(children=True)


def ups(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "ups", *args], capture_output=True, text=True, env=env, timeout=120)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--window", type=float, default=12.0)
    ap.add_argument("--notify", action="store_true", help="attach with --notify to a local cmd: target")
    args = ap.parse_args()
    pyspy = shutil.which("py-spy")
    tmp = Path(tempfile.mkdtemp(prefix="bench-attach-"))
    log = tmp / "steps.log"
    prog = tmp / "job.py"
    prog.write_text(JOB)
    job = subprocess.Popen([sys.executable, str(prog), str(log)], start_new_session=True)
    try:
        while not log.exists() or len(log.read_text().splitlines()) < 5:
            time.sleep(0.2)
        time.sleep(2.0)
        detached: list[float] = []
        attached: list[float] = []
        observer_cpu: list[float] = []
        for i in range(args.pairs):
            t0 = time.monotonic()
            time.sleep(args.window)
            detached.append(rate(log, t0, time.monotonic()))
            notify = ["--notify", "cmd:cat >/dev/null"] if args.notify else []
            res = ups("attach", str(job.pid), "--runs-dir", str(tmp / "runs"), "--json", "--run-id", f"bench-{i}", *notify)
            if res.returncode != 0:
                raise SystemExit(f"ups attach failed: {res.stderr.strip()}")
            m = json.loads((tmp / "runs" / f"bench-{i}" / "run.json").read_text())
            t0, c0 = time.monotonic(), cpu_s(m["launcher"]["pid"])
            time.sleep(args.window)
            attached.append(rate(log, t0, time.monotonic()))
            observer_cpu.append(100 * (cpu_s(m["launcher"]["pid"]) - c0) / (time.monotonic() - t0))
            os.kill(m["launcher"]["pid"], signal.SIGTERM)  # watching ends; the job goes on
            time.sleep(1.5)
        out: dict = {"pairs": args.pairs, "window_s": args.window, "notify": args.notify,
                     "load_avg_1m": round(os.getloadavg()[0], 2),
                     "detached_steps_per_s": round(statistics.median(detached), 1),
                     "attached_steps_per_s": round(statistics.median(attached), 1)}
        base = statistics.median(detached)
        out["rate_change_pct"] = round(100 * (statistics.median(attached) - base) / base, 2)
        out["noise_pct"] = round(100 * (max(detached) - min(detached)) / base, 2)
        out["observer_cpu_pct"] = round(statistics.median(observer_cpu), 2)
        if pyspy:
            walls = []
            for _ in range(10):
                t = time.monotonic()
                subprocess.run([pyspy, "dump", "--pid", str(job.pid), "--json"], capture_output=True, timeout=30)
                walls.append(1000 * (time.monotonic() - t))
            out["dump_wall_ms"] = round(statistics.median(walls), 1)
            out["blocking_bound_pct_at_10s"] = round(100 * statistics.median(walls) / 1000 / 10.0, 3)
            quiet, busy = [], []
            for _ in range(4):
                t0 = time.monotonic()
                time.sleep(3.0)
                quiet.append(rate(log, t0, time.monotonic()))
                t0 = time.monotonic()
                while time.monotonic() - t0 < 3.0:
                    subprocess.run([pyspy, "dump", "--pid", str(job.pid), "--json", "--nonblocking"],
                                   capture_output=True, timeout=30)
                    time.sleep(0.1)
                busy.append(rate(log, t0, time.monotonic()))
            out["nonblocking_lost_pct_at_10_per_s"] = round(100 * (1 - statistics.median(busy) / statistics.median(quiet)), 2)
        else:
            out["pyspy"] = "not installed"
        print(json.dumps(out))
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
