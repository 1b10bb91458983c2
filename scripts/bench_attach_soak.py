"""Soak of ``ups attach``: the observer's own cost over a long attach to a job that churns.
Prints one JSON line.

Two modes:

- soak (the default): a plain ``torchrun --nproc-per-node 2`` of tests/programs/churn_train.py
  (2 ranks x 2 DataLoader workers made anew every epoch, ``persistent_workers=False``, short
  epochs; its output to a file), started without ups, then ``ups attach`` (with
  ``--notify cmd:cat >/dev/null`` under ``--notify``: the run is judged every 2 s), for
  ``--minutes`` (default 10). Every ``--window`` seconds (default 60): the observer's CPU (% of
  one core over the window, its py-spy dumps included), RSS and open descriptors; the run folder's bytes (``stacks/``,
  ``events.jsonl``, ``logs/``, ``status/``) and the events logged. The growth per hour is
  extrapolated from the last window against the first.
- fast-forward (``--generations N``): a job of one rank (RANK=0 in its environment, no torch)
  that forks, per generation, ``--workers`` DataLoader-like workers (named ``pt_data_worker``,
  as torch names them) and ``--helpers`` other short-lived children, prints a few progress
  lines to its log, then ends them; the real observer (ups.attach.observe.AttachObserver on a
  run folder made as ``ups attach`` makes it) is driven pass by pass from this process, two
  passes a generation while they live and one after (``--notify``: the run judged at every
  pass). It reports the observer's CPU per generation (thread CPU time of its passes) per
  window of generations, how many ended processes it still holds, the files under
  ``status/`` and the events logged: days of churn in minutes.

A flat cost has last ~ first:

    python scripts/bench_attach_soak.py --minutes 10 [--notify]
    python scripts/bench_attach_soak.py --generations 2000 [--notify] [--helpers 1]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))
from bench_attach import cpu_s  # noqa: E402 - the observer's CPU with its reaped py-spy dumps
from bench_soak import fds, read_events, rss_mib, tree_bytes  # noqa: E402 - the soak's own measures

CHURN = REPO / "tests" / "programs" / "churn_train.py"
NOTIFY = "cmd:cat >/dev/null"


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def folder(run: Path) -> dict[str, int]:
    return {"stacks_bytes": tree_bytes(run / "stacks"), "events_bytes": _size(run / "events.jsonl"),
            "logs_bytes": tree_bytes(run / "logs"), "status_bytes": tree_bytes(run / "status"),
            "status_files": len(os.listdir(run / "status")) if (run / "status").is_dir() else 0}


# ----------------------------------------------------------------------------- the soak
def soak(minutes: float, window: float, notify: bool) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="ups-attach-soak-"))
    env = dict(os.environ, PYTHONPATH=str(REPO), UPS_RUNS_DIR=str(tmp / "runs"))
    log = open(tmp / "train.log", "wb")  # the job's output, for its life
    job = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                            str(CHURN), "--epochs", "0", "--minutes", str(minutes + 3)],
                           stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=tmp)
    windows: list[dict] = []
    observer = None
    try:
        deadline = time.monotonic() + 180
        while b"epoch 1 done" not in (tmp / "train.log").read_bytes() and time.monotonic() < deadline:
            time.sleep(0.5)  # torch's import and the rendezvous, on a loaded box
        told = f"cmd:tr -d '\\n' >> {tmp / 'notified'}; echo >> {tmp / 'notified'}"  # one message a line
        args = ["attach", str(job.pid), "--json", "--run-id", "soak"] + (["--notify", told] if notify else [])
        res = subprocess.run([sys.executable, "-m", "ups", *args], capture_output=True, text=True, env=env, timeout=120)
        if res.returncode != 0:
            raise SystemExit(f"bench_attach_soak: ups attach failed: {res.stderr.strip()}")
        run = tmp / "runs" / "soak"
        observer = int(json.loads((run / "run.json").read_text())["launcher"]["pid"])
        t_start = time.monotonic()
        while time.monotonic() + window <= t_start + minutes * 60 and job.poll() is None:
            t0, c0 = time.monotonic(), cpu_s(observer)
            time.sleep(window)
            t1, c1 = time.monotonic(), cpu_s(observer)
            if c0 is None or c1 is None:
                break
            windows.append({"t_s": round(t1 - t_start), "observer_cpu_pct": round(100 * (c1 - c0) / (t1 - t0), 2),
                            "observer_rss_mib": rss_mib(observer), "observer_fds": fds(observer),
                            "events": len(read_events(run)), **folder(run), **seen_by_user(env)})
    finally:
        if observer is not None:
            with contextlib.suppress(OSError):
                os.kill(observer, signal.SIGTERM)
        for pid in [job.pid, *_descendants(job.pid)]:  # torchrun starts each rank in a session of its own
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        job.wait()
        log.close()
    first, last = windows[0], windows[-1]
    hours = (last["t_s"] - first["t_s"]) / 3600 or float("nan")
    out = {"mode": "soak", "notify": notify, "minutes": minutes, "window_s": window,
           "job": "torchrun 2 ranks x 2 DataLoader workers, persistent_workers=False",
           "epochs": _epochs(tmp / "train.log"), "load_avg_1m": round(os.getloadavg()[0], 2), "windows": windows}
    for key in ("observer_cpu_pct", "observer_rss_mib", "observer_fds", "events", "status_files"):
        out[f"{key}_first"], out[f"{key}_last"] = first[key], last[key]
    for key in ("stacks_bytes", "events_bytes", "logs_bytes", "status_bytes"):
        out[f"{key.removesuffix('_bytes')}_kib_per_hour"] = round((last[key] - first[key]) / 1024 / hours, 1)
    out["events_by_kind"] = _kinds(read_events(tmp / "runs" / "soak"))
    out["notified"] = _notified(tmp / "notified")
    out["dead_shown"] = sum(w["dead"] for w in windows)  # a process `ups status` called dead, over all windows
    out["verdicts"] = sorted({w["verdict"] for w in windows})
    out["run_dir"] = str(tmp / "runs" / "soak")
    return out


def seen_by_user(env: dict) -> dict:
    """What a user sees at the end of a window: how many processes `ups status` shows dead, and
    `ups why`'s verdict (a healthy job with worker churn: none dead, "healthy")."""
    def ups(*args: str) -> dict:
        res = subprocess.run([sys.executable, "-m", "ups", *args, "soak", "--json"], capture_output=True, text=True,
                             env=env, timeout=60)
        try:
            return json.loads(res.stdout)  # `ups why` exits 1 when it names a problem: its JSON still says which
        except ValueError:
            return {"verdict": {"mode": f"unreadable: {res.stderr.strip()[:80]}"}}
    procs = ups("status").get("processes") or []
    return {"dead": sum(p.get("health") == "dead" for p in procs), "verdict": (ups("why").get("verdict") or {}).get("mode")}


def _notified(path: Path) -> list[str]:
    """What the notifier was told (one JSON message a line, from the cmd: target)."""
    out = []
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError):
                m = json.loads(line)
                out.append(f"{m.get('event')}: {m.get('summary')}" if isinstance(m, dict) else line[:80])
    return out


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        cur = todo.pop()
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{cur}/task"):
                kids = [int(k) for k in Path(f"/proc/{cur}/task/{task}/children").read_text().split()]
                out += kids
                todo += kids
    return out


def _epochs(log: Path) -> int:
    import re

    found = re.findall(rb"epoch (\d+) done", log.read_bytes())
    return int(found[-1]) if found else 0


def _kinds(evs: list[dict]) -> dict[str, int]:
    kinds: dict[str, int] = {}
    for e in evs:
        kinds[e.get("event", "?")] = kinds.get(e.get("event", "?"), 0) + 1
    return kinds


# ----------------------------------------------------------------------------- fast-forward
FF_JOB = textwrap.dedent(
    """
    import os, sys
    kids, gen = [], 0
    for line in sys.stdin:
        cmd = line.split()
        if cmd[0] == "spawn":
            workers, helpers = int(cmd[1]), int(cmd[2])
            for i in range(workers + helpers):
                r, w = os.pipe()
                ready_r, ready_w = os.pipe()
                pid = os.fork()
                if pid == 0:
                    os.close(w)
                    if i < workers:
                        with open("/proc/self/comm", "w") as fh:
                            fh.write("pt_data_worker")
                    os.write(ready_w, b"1")  # named before anyone looks
                    os.read(r, 1)
                    os._exit(0)
                os.close(r)
                os.close(ready_w)
                os.read(ready_r, 1)
                os.close(ready_r)
                kids.append((pid, w))
            for k in range(1, 5):
                print(f"epoch {gen} step {k}/4 loss 0.{k}", flush=True)
        else:
            for _, w in kids:
                os.close(w)
            for pid, _ in kids:
                os.waitpid(pid, 0)
            kids, gen = [], gen + 1
            print(f"epoch {gen} done", flush=True)
        sys.stderr.write("ok\\n")
        sys.stderr.flush()
    """
)


def fast_forward(generations: int, windows: int, workers: int, helpers: int, notify: bool) -> dict:
    sys.path.insert(0, str(REPO))
    from ups.attach.find import WORKER_COMM, find_job
    from ups.attach.observe import AttachObserver, notifier_for
    from ups.attach.start import create_run
    from ups.cli.launch_options import notify_fields
    from ups.status.reporter import Reporter

    assert WORKER_COMM == "pt_data_worker"
    tmp = Path(tempfile.mkdtemp(prefix="ups-attach-ff-"))
    log = open(tmp / "job.log", "wb")  # the job's output, for its life
    env = dict(os.environ, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
    (tmp / "job.py").write_text(FF_JOB)
    # under a shell, as a batch script starts it: a python parent of a process with RANK set
    # would be taken for the job's top (an mp.spawn parent)
    job = subprocess.Popen(["sh", "-c", f"{shlex.quote(sys.executable)} {shlex.quote(str(tmp / 'job.py'))}; :"],
                           stdin=subprocess.PIPE, stdout=log, stderr=subprocess.PIPE, env=env, start_new_session=True)

    def say(cmd: str) -> None:
        job.stdin.write(f"{cmd}\n".encode())
        job.stdin.flush()
        assert job.stderr.readline() == b"ok\n"

    out_windows: list[dict] = []
    try:
        say("spawn 0 0")  # started: its first lines
        top = int(Path(f"/proc/{job.pid}/task/{job.pid}/children").read_text().split()[0])  # the python under sh
        run = create_run(find_job(top), tmp / "runs", run_id="ff", fields=notify_fields([NOTIFY]) if notify else {})
        obs = AttachObserver(run)
        obs.notifier = notifier_for(run) if notify else None
        per_window = max(1, generations // windows)
        cpu, held_max, wall0 = 0.0, 0, time.monotonic()
        with Reporter(run.path, role="launcher", phase="supervise", run_id=obs.run_id, stack_signal=None) as reporter:

            def passes(n: int) -> float:
                used = 0.0
                for _ in range(n):
                    if notify:
                        obs.told_mono = float("-inf")  # judged at every pass, not every 2 s of wall time
                    c = time.thread_time()
                    assert obs.step(reporter), "the job is gone"
                    used += time.thread_time() - c
                return used

            passes(1)
            for gen in range(generations):
                say(f"spawn {workers} {helpers}")
                cpu += passes(2)
                say("end")
                cpu += passes(1)
                held_max = max(held_max, len(obs.seen))
                if (gen + 1) % per_window == 0:
                    out_windows.append({"generations": gen + 1,
                                        "cpu_us_per_generation": round(1e6 * cpu / per_window),
                                        "held": len(obs.seen),
                                        "held_ended": sum(1 for s in obs.seen.values() if s.gone_at is not None),
                                        "rss_mib": rss_mib(os.getpid()), **folder(run.path)})
                    cpu = 0.0
            if obs.notifier is not None:
                obs.notifier.drain(10.0)
    finally:
        with contextlib.suppress(OSError):
            os.killpg(job.pid, signal.SIGKILL)
        job.wait()
        log.close()
    first, last = out_windows[0], out_windows[-1]
    evs = read_events(run.path)
    shutil.rmtree(tmp, ignore_errors=True)
    return {"mode": "fast-forward", "notify": notify, "generations": generations, "workers": workers, "helpers": helpers,
            "processes": generations * (workers + helpers), "wall_s": round(time.monotonic() - wall0, 1),
            "windows": out_windows,
            "cpu_us_per_generation_first": first["cpu_us_per_generation"],
            "cpu_us_per_generation_last": last["cpu_us_per_generation"],
            "held_max": held_max, "held_ended_last": last["held_ended"],
            "status_files_last": last["status_files"], "events": len(evs), "events_by_kind": _kinds(evs),
            "events_bytes_per_generation": round(last["events_bytes"] / generations, 1),
            "logs_bytes_per_generation": round(last["logs_bytes"] / generations, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10.0, help="how long the soak runs (default 10)")
    ap.add_argument("--window", type=float, default=60.0, help="seconds per measured window (default 60)")
    ap.add_argument("--notify", action="store_true", help=f"attach with --notify {NOTIFY!r}: the run judged every 2 s")
    ap.add_argument("--generations", type=int, default=0,
                    help="fast-forward instead: this many generations of the job's children through the observer")
    ap.add_argument("--windows", type=int, default=10, help="fast-forward: windows of generations (default 10)")
    ap.add_argument("--workers", type=int, default=2, help="fast-forward: DataLoader workers a generation (default 2)")
    ap.add_argument("--helpers", type=int, default=0, help="fast-forward: other children a generation (default 0)")
    args = ap.parse_args(argv)
    if args.generations:
        result = fast_forward(args.generations, args.windows, args.workers, args.helpers, args.notify)
    else:
        result = soak(args.minutes, args.window, args.notify)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
