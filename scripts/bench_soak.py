"""Soak: ups's own cost on a long run with DataLoader worker churn. Prints one JSON line.

Two modes:

- soak (the default): ``ups launch torchrun`` runs tests/programs/churn_train.py, 2 ranks x 2
  DataLoader workers made anew every epoch (``persistent_workers=False``), short epochs, for
  ``--minutes`` (default 10). Every ``--window`` seconds (default 15) it measures:
  the launcher's CPU (% of one core over the window), RSS and open descriptors; the log
  relay's CPU; the epochs done; the lines and bytes of ``events.jsonl`` and the bytes under
  ``status/`` and ``metrics/``; the wall time of ``ups status --json`` and of one console
  snapshot (console.snapshots.Poller, in a fresh process, the read only).
- fast-forward (``--generations N``): N worker generations (an epoch's 2 ranks x 2 workers:
  4 real short-lived processes each, forked, each writing its record, then its final record,
  then exiting) replayed through the launcher's exit watcher (ups.launch.exits.ExitWatcher),
  which this process drives tick by tick. It reports the watcher's CPU per generation (thread
  CPU time of its calls) per window of generations, and how many processes it holds: a day's
  churn in minutes.

The figures that matter are first against last window: a flat cost has last ~ first.

    python scripts/bench_soak.py --minutes 5
    python scripts/bench_soak.py --generations 10000
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHURN = REPO / "tests" / "programs" / "churn_train.py"


# ----------------------------------------------------------------------------- the soak
def cpu_s(pid: int) -> float | None:
    from ups.status import procfs  # the one reader of /proc

    st = procfs.stat(pid)
    return st.cpu_s() if st is not None else None


def rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None


def fds(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def _relay_pid(launcher: int) -> int | None:
    try:
        children = Path(f"/proc/{launcher}/task/{launcher}/children").read_text().split()
    except OSError:
        return None
    for c in children:
        from ups.status import procfs

        if "ups.launch.logrelay" in (procfs.cmdline(int(c)) or []):
            return int(c)
    return None


def tree_bytes(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


def _epochs(log: Path) -> int:
    try:
        with open(log, "rb") as fh:
            fh.seek(max(0, os.path.getsize(log) - 4096))
            tail = fh.read().decode(errors="replace")
    except OSError:
        return 0
    found = re.findall(r"epoch (\d+) done", tail)
    return int(found[-1]) if found else 0


SNAPSHOT = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from console.snapshots import Poller
    p = Poller(Path(sys.argv[1]), gpu_provider=None)
    t = time.perf_counter()
    p.snapshot(sys.argv[2], None)
    print((time.perf_counter() - t) * 1000)
    """
)


def _timed(cmd: list[str], env: dict[str, str]) -> tuple[float, str]:
    t = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    return (time.perf_counter() - t) * 1000, res.stdout


def soak(minutes: float, window: float) -> dict:
    root = Path(tempfile.mkdtemp(prefix="ups-soak-"))
    env = dict(os.environ, UPS_RUNS_DIR=str(root), PYTHONPATH=str(REPO))
    res = subprocess.run([sys.executable, "-m", "ups", "launch", "torchrun", "--detach", "--json", "--nproc-per-node", "2",
                          str(CHURN), "--epochs", "0", "--minutes", str(minutes + 3)],  # outlives the windows
                         capture_output=True, text=True, env=env, cwd=root, timeout=120)
    if res.returncode != 0:
        raise SystemExit(f"bench_soak: the launch failed: {res.stderr.strip()}")
    run = Path(json.loads(res.stdout)["run_dir"])
    manifest = json.loads((run / "run.json").read_text())
    launcher = int(manifest["launcher"]["pid"])
    relay = None
    windows: list[dict] = []
    last = None
    try:
        deadline = time.monotonic() + 180  # torch's import and the rendezvous, on a loaded box
        while _epochs(run / "logs" / "job.log") < 1 and time.monotonic() < deadline and cpu_s(launcher) is not None:
            time.sleep(0.5)  # the windows start once the job trains
        t_start = time.monotonic()
        t_end = t_start + minutes * 60
        while time.monotonic() + window <= t_end and cpu_s(launcher) is not None:
            relay = relay or _relay_pid(launcher)
            t0, c0, r0 = time.monotonic(), cpu_s(launcher), cpu_s(relay) if relay else None
            e0 = _epochs(run / "logs" / "job.log")
            lines0 = _lines(run / "events.jsonl")
            time.sleep(window)
            t1, c1, r1 = time.monotonic(), cpu_s(launcher), cpu_s(relay) if relay else None
            if c1 is None or c0 is None:
                break
            e1 = _epochs(run / "logs" / "job.log")
            lines1 = _lines(run / "events.jsonl")
            status_ms, _ = _timed([sys.executable, "-m", "ups", "status", str(run), "--json"], env)
            snap_ms, out = _timed([sys.executable, "-c", SNAPSHOT, str(root), run.name], env)
            last = {
                "t_s": round(t1 - t_start),
                "launcher_cpu_pct": round(100 * (c1 - c0) / (t1 - t0), 2),
                "launcher_rss_mib": rss_mib(launcher),
                "launcher_fds": fds(launcher),
                "relay_cpu_pct": round(100 * (r1 - r0) / (t1 - t0), 2) if r0 is not None and r1 is not None else None,
                "epochs": e1,
                "event_lines": lines1,
                "event_lines_per_epoch": round((lines1 - lines0) / (e1 - e0), 3) if e1 > e0 else None,
                "events_bytes": _size(run / "events.jsonl"),
                "status_bytes": tree_bytes(run / "status"),
                "metrics_bytes": tree_bytes(run / "metrics"),
                "status_json_ms": round(status_ms),
                "snapshot_ms": round(float(out.strip() or "nan"), 1),
            }
            windows.append(last)
    finally:
        subprocess.run([sys.executable, "-m", "ups", "kill", str(run), "--force"], capture_output=True, env=env,
                       timeout=60)
        try:
            os.kill(launcher, signal.SIGTERM)
        except OSError:
            pass
    first = windows[0] if windows else {}
    out = {"mode": "soak", "minutes": minutes, "window_s": window, "job": "2 ranks x 2 workers, persistent_workers=False",
           "windows": windows}
    for key in ("launcher_cpu_pct", "launcher_rss_mib", "launcher_fds", "relay_cpu_pct", "event_lines_per_epoch",
                "status_json_ms", "snapshot_ms"):
        out[f"{key}_first"], out[f"{key}_last"] = first.get(key), (last or {}).get(key)
    half = len(windows) // 2  # descriptors come and go with the live workers (a pidfd each): compare the highs
    out["launcher_fds_max_first_half"] = max((w["launcher_fds"] or 0 for w in windows[:half]), default=None)
    out["launcher_fds_max_second_half"] = max((w["launcher_fds"] or 0 for w in windows[half:]), default=None)
    out["epochs"] = (last or {}).get("epochs")
    out["unclean_worker_exits"] = sum(1 for e in read_events(run) if e.get("event") == "process.exit"
                                      and e.get("role") == "worker" and not e.get("clean"))
    out["run_dir"] = str(run)
    return out


def _lines(path: Path) -> int:
    try:
        with open(path, "rb") as fh:
            return sum(1 for _ in fh)
    except OSError:
        return 0


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def read_events(run: Path) -> list[dict]:
    out = []
    try:
        for line in (run / "events.jsonl").read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    except OSError:
        pass
    return out


# ----------------------------------------------------------------------------- fast-forward
def fast_forward(generations: int, windows: int = 10, ranks: int = 2, workers: int = 2) -> dict:
    """Replay ``generations`` epochs' worker sets through an ExitWatcher (see the module's
    docstring); the watcher's CPU per generation in ``windows`` equal windows."""
    sys.path.insert(0, str(REPO))
    from ups.launch.exits import ExitWatcher
    from ups.runs.rundir import RunDir
    from ups.status.files import write_atomic
    from ups.status.host import hostname
    from ups.status.procs import this_process_start
    from ups.status.record import StatusRecord, process_name

    root = Path(tempfile.mkdtemp(prefix="ups-ff-"))
    run = RunDir.create(root, "train", name="fastforward")
    watcher = ExitWatcher(run)  # driven from this thread (tick), not started
    host, t0 = hostname(), time.time()
    slots = [(r, w) for r in range(ranks) for w in range(workers)]
    per_window = max(1, generations // windows)
    cpu_window = 0.0
    out_windows: list[dict] = []
    held_max = 0

    def record(r: int, w: int, state: str, step: int) -> bytes:
        now = time.time()
        return StatusRecord(run_id=run.run_id, role="worker", name=process_name("worker", r, w), pid=os.getpid(),
                            pid_start=this_process_start(), host=host, rank=r, worker=w, world_size=ranks,
                            phase="fetch" if state == "running" else "done", state=state, step=step, unit="samples",
                            started_at=t0, heartbeat_at=now, progress_at=now, phase_at=now,
                            exit_code=None if state == "running" else 0).to_json().encode()

    wall0 = time.monotonic()
    for gen in range(generations):
        kids = []
        for r, w in slots:
            ready_r, ready_w = os.pipe()
            go_r, go_w = os.pipe()
            pid = os.fork()
            if pid == 0:  # the worker: its record, a word to the driver, its end when told
                try:
                    os.close(ready_r)
                    os.close(go_w)
                    path = run.status_dir / f"{process_name('worker', r, w)}.json"
                    write_atomic(path, record(r, w, "running", 0))
                    os.write(ready_w, b"1")
                    os.read(go_r, 1)
                    write_atomic(path, record(r, w, "done", 4))
                finally:
                    os._exit(0)
            os.close(ready_w)
            os.close(go_r)
            os.read(ready_r, 1)
            os.close(ready_r)
            kids.append((pid, go_w, process_name("worker", r, w)))
        c = time.thread_time()
        watcher.scan()  # the launcher's scan sees the epoch's workers running
        cpu_window += time.thread_time() - c
        held_max = max(held_max, watcher.watching())
        for _pid, go_w, _ in kids:
            os.write(go_w, b"1")
            os.close(go_w)
        for pid, _, _ in kids:
            os.waitpid(pid, 0)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            c = time.thread_time()
            watcher.tick(0)
            cpu_window += time.thread_time() - c
            if all(watcher.exits.get(name) is not None and watcher.exits[name].pid == pid for pid, _, name in kids):
                break
        if (gen + 1) % per_window == 0:
            out_windows.append({"generations": gen + 1, "cpu_us_per_generation": round(1e6 * cpu_window / per_window, 1),
                                "held": watcher.watching()})
            cpu_window = 0.0
    watcher.stop()
    events = [e for e in read_events(run.path) if e.get("event") == "process.exit"]
    first, last = out_windows[0], out_windows[-1]
    return {"mode": "fast-forward", "generations": generations, "processes": generations * len(slots),
            "wall_s": round(time.monotonic() - wall0, 1), "windows": out_windows,
            "cpu_us_per_generation_first": first["cpu_us_per_generation"],
            "cpu_us_per_generation_last": last["cpu_us_per_generation"],
            "held_first": first["held"], "held_last": last["held"], "held_max": held_max,
            "exit_events": len(events), "unclean": sum(1 for e in events if not e.get("clean"))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10.0, help="how long the soak runs (default 10)")
    ap.add_argument("--window", type=float, default=15.0, help="seconds per measured window (default 15)")
    ap.add_argument("--generations", type=int, default=0,
                    help="fast-forward instead: replay this many worker generations through the exit watcher")
    ap.add_argument("--windows", type=int, default=10, help="fast-forward: windows of generations (default 10)")
    args = ap.parse_args(argv)
    if args.generations:
        result = fast_forward(args.generations, args.windows)
    else:
        result = soak(args.minutes, args.window)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
