"""The slow rank named (issue 48): seconds to named, the rank, the cause and the estimated cost
against the measured one, for injected stragglers on outside-style DDP and FSDP2 scripts; and
the false alarms of healthy runs, one-off pauses and a busy box. One JSON line (``--out`` also
writes it to a file), a line per case on stderr as it goes.

Jobs: pytorch/examples' multigpu_torchrun.py (tests/programs/multigpu_torchrun.py, CPU/gloo copy,
2 DataLoader workers a rank) and the FSDP2 tutorial (tests/programs/sharded/fsdp2_tutorial.py),
2 ranks each under ``ups launch torchrun``, the faults rehearsed by the instrumentation (no code
change: ``--inject``, ups.instrument.torch.rehearse), each from ``after`` s past the first step:

- compute x F: ``slow_step`` of (F - 1) x the healthy run's own time per step (measured first);
- input: ``slow_sample`` on rank 1 (its workers): 1 ms a sample (DDP), 40 ms (FSDP2's steps are ~15x longer);
- host: each rank pinned to its own core (``taskset``) and a CPU hog pinned to rank 0's, which the job's
  other processes (agent, launcher, observers) share too on this 2-core box: rank 0 is the one to name;
  host-2, host-4: two or four hogs there (rank 0 gets a third or a fifth of its core: bigger stragglers);
- pause: rank 1 stops once for 3 s; busy: two unpinned CPU hogs for the whole run; healthy.

Judged in this process with the code ``ups status`` runs (``open_run``: health, ups.status.straggler),
every 0.5 s. Measured loss: 1 - (step rate after the fault) / (step rate before it), from rank 0's
steps; for a compute straggler also ``injected_share``: its injected ms a step over the step measured
after it, the loss free of the box's drift between before and after; estimated: the straggler's
cost while named (median). False alarms: named episodes while
no straggler is injected (healthy, busy and pause runs, and every run before its fault), per hour.

    python scripts/bench_straggler.py [--only ddp-compute-1.25,...] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROGRAMS = {"ddp": (ROOT / "tests/programs/multigpu_torchrun.py", ["1000000", "100000"], {}),
            "fsdp2": (ROOT / "tests/programs/sharded/fsdp2_tutorial.py", [], {"TUTORIAL_STEPS": "20000"})}  # its dataset holds 16 samples a step
SAMPLE_MS = {"ddp": 1, "fsdp2": 40}  # a slow Dataset: ~1.5-2x the healthy own time (32 and 8 samples a batch, 2 workers)
AFTER_S = 20  # the fault starts this long after the first step: a healthy stretch before it
AFTER_FAULT_S = 30  # watched this long after the fault starts
POLL_S = 0.5
HOG = [sys.executable, "-c", "while True: pass"]


def ups(*args: str, env=None) -> str:
    return subprocess.run([sys.executable, "-m", "ups", *args], capture_output=True, text=True, check=True,
                          env=env).stdout


def launch(runs: Path, name: str, kind: str, inject: list[str]) -> Path:
    program, args, extra = PROGRAMS[kind]
    env = {**os.environ, **extra}
    cmd = ["launch", "torchrun", "--runs-dir", str(runs), "--detach", "--name", name]
    for f in inject:
        cmd += ["--inject", f]
    out = ups(*cmd, "--nproc-per-node", "2", str(program), *args, env=env)
    run_id = re.search(r"started (\S+)", out).group(1)
    return runs / run_id


def judge_now(run_dir: Path):
    from ups.runs.read import open_run
    from ups.runs.rundir import RunDir
    from ups.status.straggler import judge

    view = open_run(RunDir(run_dir))
    ranks = [p for p in view.processes if p.record.role == "rank"]
    named = [p for p in ranks if p.verdict.health.value == "straggler"]
    times, found = judge([p.record for p in ranks], view.thresholds.straggler_score)
    steps = {p.record.rank: p.record.step for p in ranks}
    own = (statistics.median(t.own for t in times), min(t.score for t in times)) if len(times) > 1 else (None, None)
    return own, (found if named else None), steps


def rank_pids(run_dir: Path) -> dict[int, int]:
    out = {}
    for f in (run_dir / "status").glob("rank-*.json"):
        if "worker" in f.name:
            continue
        try:
            rec = json.loads(f.read_text())
            out[rec["rank"]] = rec["pid"]
        except (OSError, ValueError, KeyError):
            pass
    return out


def fault_started(run_dir: Path) -> float | None:
    for log in (run_dir / "logs").rglob("*"):
        if log.is_file():
            m = re.search(r"ups: rehearsing \S+ on rank \d+ from ([\d.]+)", log.read_text(errors="replace"))
            if m:
                return float(m.group(1))
    return None


def run_case(runs: Path, name: str, kind: str, inject: list[str], *, host: int = 0, busy: bool = False,
             injected: bool = True, expected: str | None = None) -> dict:
    hogs: list[subprocess.Popen] = []
    if busy:
        hogs = [subprocess.Popen(HOG) for _ in range(2)]
    run_dir = launch(runs, name, kind, inject)
    samples, first_step_at, start_at, named_at, pinned = [], None, None, None, False
    deadline = time.time() + 240
    try:
        while time.time() < deadline:
            time.sleep(POLL_S)
            try:
                own, found, steps = judge_now(run_dir)
            except Exception:  # noqa: BLE001 - a run folder being made
                continue
            now = time.time()
            if first_step_at is None and steps and min(steps.values()) > 0:
                first_step_at = now
            if first_step_at is None:
                if now > deadline - 180:
                    raise SystemExit(f"{name}: no step")
                continue
            if start_at is None:
                if host and now >= first_step_at + AFTER_S and not pinned:
                    # Each rank (its threads, and the DataLoader workers it forks later) on its own
                    # core, and a CPU hog on rank 0's: the job's other processes (its agent, the
                    # launcher, the observers) go where there is room, rank 0's core is the crowded one.
                    for rank, pid in rank_pids(run_dir).items():
                        subprocess.run(["taskset", "-a", "-cp", str(rank % (os.cpu_count() or 2)), str(pid)],
                                       capture_output=True)
                    pinned = True
                    hogs += [subprocess.Popen(["taskset", "-c", "0", *HOG]) for _ in range(host)]
                    start_at = now
                elif not host:
                    start_at = fault_started(run_dir) if injected else None
                    if not injected and now >= first_step_at + AFTER_S:
                        start_at = now
            samples.append({"t": now, "step": steps.get(0, 0), "own": own[0], "min_score": own[1],
                            "named": None if found is None else {"rank": found.rank.rank, "cause": found.cause,
                                                                  "cost": found.cost, "score": found.rank.score,
                                                                  "why": found.why, "evidence": found.evidence}})
            if found is not None and named_at is None and start_at is not None and injected:
                named_at = now
            if start_at is not None and now >= start_at + AFTER_FAULT_S:
                break
    finally:
        for h in hogs:
            h.kill()
        subprocess.run([sys.executable, "-m", "ups", "kill", run_dir.name, "--runs-dir", str(runs)], capture_output=True)
    out = summarize(name, samples, first_step_at, start_at, named_at, injected, expected, 0 if host else 1)
    slow = next((re.search(r"ms=([0-9.]+)", f) for f in inject if f.startswith("slow_step:")), None)
    if slow and out.get("rate_after"):
        # The loss a compute straggler causes, from what was injected: its extra time a step on the
        # step's path, over the step measured after it (drift between before and after cancels).
        out["injected_share"] = round(float(slow.group(1)) / (1000.0 / out["rate_after"]), 3)
    return out


def rate(samples: list[dict], t0: float, t1: float) -> float | None:
    inside = [s for s in samples if t0 <= s["t"] <= t1]
    if len(inside) < 4 or inside[-1]["t"] <= inside[0]["t"]:
        return None
    return (inside[-1]["step"] - inside[0]["step"]) / (inside[-1]["t"] - inside[0]["t"])


def episodes(samples: list[dict]) -> list[dict]:
    out, inside = [], False
    for s in samples:
        if s["named"] and not inside:
            out.append({**s["named"], "at_s": s["t"]})
        inside = bool(s["named"])
    return out


def summarize(name, samples, first_step_at, start_at, named_at, injected, expected=None, expected_rank=1) -> dict:
    out: dict = {"case": name}
    before = [s for s in samples if start_at is None or s["t"] < start_at] if injected else samples
    healthy_s = (before[-1]["t"] - before[0]["t"]) if len(before) > 1 else 0.0
    out["healthy_s"] = round(healthy_s, 1)
    alarms = episodes(before)
    out["false_alarms"] = len(alarms)
    if alarms:
        out["false_alarm_first"] = {**alarms[0], "at_s": round(alarms[0]["at_s"] - (first_step_at or 0), 1)}
    owns = [s["own"] for s in before if s["own"] and first_step_at and s["t"] > first_step_at + 5]
    out["own_ms"] = round(statistics.median(owns) * 1e3, 3) if owns else None
    scores = sorted(s["min_score"] for s in before if s["min_score"] is not None)
    if scores:  # how close a run with no straggler came to the threshold: the lowest scores seen
        out["lowest_score_p5"] = round(scores[len(scores) // 20], 3)
        out["lowest_score"] = round(scores[0], 3)
    if start_at is not None:
        r0 = rate(samples, max(first_step_at + 5, start_at - 15), start_at - 1)
        r1 = rate(samples, start_at + 10, samples[-1]["t"])
        if r0 and r1:
            out["rate_before"], out["rate_after"] = round(r0, 1), round(r1, 1)
            out["measured_cost"] = round(max(0.0, 1 - r1 / r0), 3)
    if not injected or start_at is None:
        out["named"] = None
        return out
    after = [s for s in samples if s["t"] >= start_at]
    low = [s["min_score"] for s in after if s["min_score"] is not None]
    out["lowest_score_after"] = round(min(low), 3) if low else None
    hits = [s["named"] for s in after if s["named"]]
    out["seconds_to_named"] = None if named_at is None else round(named_at - start_at, 1)
    right = [s for s in after if s["named"] and s["named"]["rank"] == expected_rank and s["named"]["cause"] == expected]
    out["expected_rank"] = expected_rank
    out["expected_cause"] = expected
    out["seconds_to_right_cause"] = round(right[0]["t"] - start_at, 1) if right else None
    if hits:
        out["causes"] = {c: sum(1 for h in hits if h["cause"] == c) for c in sorted({h["cause"] for h in hits})}
        first = hits[0]
        out["named"] = {"rank": first["rank"], "cause": first["cause"], "why": first["why"],
                        "evidence": first["evidence"]}
        out["score"] = round(statistics.median(h["score"] for h in hits), 3)
        out["estimated_cost"] = round(statistics.median(h["cost"] for h in hits), 3)
    else:
        out["named"] = None
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="comma-separated case names")
    ap.add_argument("--kinds", default="ddp,fsdp2")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    only = set(filter(None, args.only.split(",")))
    tmp = Path(tempfile.mkdtemp(prefix="bench-straggler-"))
    runs = tmp / "runs"
    results = []
    try:
        for kind in args.kinds.split(","):
            # The healthy run first: its ranks' own time per step sizes the compute stragglers.
            base = None
            todo = [(f"{kind}-healthy", [], {"injected": False})]
            for name, inject, opts in todo:
                if only and not any(c.startswith(kind) for c in only):
                    continue
                res = run_case(runs, name, kind, inject, **opts)
                base = res.get("own_ms")
                results.append(res)
                print(json.dumps(res), file=sys.stderr, flush=True)
            base = base or 5.0
            more = [(f"{kind}-compute-{f}", [f"slow_step:rank=1,ms={round((f - 1) * base, 2)},after={AFTER_S}"],
                     {"expected": "compute"}) for f in (1.1, 1.25, 1.5, 2.0)]
            more += [(f"{kind}-input", [f"slow_sample:rank=1,ms={SAMPLE_MS[kind]},after={AFTER_S}"], {"expected": "input"}),
                     (f"{kind}-host", [], {"host": 1, "expected": "host"}),
                     (f"{kind}-host-2", [], {"host": 2, "expected": "host"}),
                     (f"{kind}-host-4", [], {"host": 4, "expected": "host"}),
                     (f"{kind}-pause", [f"pause:rank=1,s=3,after={AFTER_S}"], {"injected": False}),
                     (f"{kind}-busy", [], {"busy": True, "injected": False})]
            for name, inject, opts in more:
                if only and name not in only:
                    continue
                res = run_case(runs, name, kind, inject, **opts)
                results.append(res)
                print(json.dumps(res), file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    healthy_s = sum(r["healthy_s"] for r in results)
    alarms = sum(r["false_alarms"] for r in results)
    line = json.dumps({"cases": results, "healthy_hours": round(healthy_s / 3600, 3), "false_alarms": alarms,
                       "false_alarms_per_hour": round(alarms / (healthy_s / 3600), 2) if healthy_s else None,
                       "cpus": os.cpu_count()})
    print(line)
    if args.out:
        Path(args.out).write_text(line + "\n")


if __name__ == "__main__":
    main()
