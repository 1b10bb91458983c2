"""False restarts of healthy pauses, and seconds from a real hang to its restart, under
`ups launch torchrun --on-hang restart` at the default thresholds. Prints one JSON line.

The program is a third-party-style DDP script (tests/programs/ddp_pauses.py: pytorch/examples'
shape, CPU, gloo, 2 ranks with 2 DataLoader workers each). The drills of issue 30:

* healthy pauses, each its own run, each longer than any stall limit: a 45 s checkpoint to a
  stream without a name, a 45 s checkpoint through torch.distributed.checkpoint, a 60 s
  evaluation on rank 0 alone while rank 1 waits in DDP's all-reduce, a 45 s upload through
  `curl` after the save. Each must end `succeeded` on its first attempt, and `ups why`, polled
  every 0.5 s, must never say hang, stalled or stuck. ``false_restarts`` counts restarts (and
  kills) of these runs: the target is 0;
* real hangs of the same script: rank 1 asleep in its own code, a one-sided collective on a
  side group, and a DataLoader worker asleep in ``__getitem__`` with ``--on-worker-hang
  fallback`` (and no --on-hang). ``visible_to_restart_s``: from the hang becoming visible (the
  hung process's last progress plus its stall limit) to the restart event; ``proven_after_s``:
  from visible to proven (the launcher's two idle windows and two stack dumps).

    python scripts/bench_restart.py [--pause-secs 45] [--eval-secs 60] [--quick]

``--quick`` runs 15 s pauses with ``--stalled-after 3`` (minutes instead of a quarter hour).

``--rhythm`` (issue 38) measures instead, on one box in one run, at the default (learned)
thresholds:

* ``named_after_s``: seconds from a hang's start (the hung rank's last progress) to the first
  verdict of ``ups why`` (polled every 0.25 s) that names it, for a 2-rank DDP loop
  (tests/programs/rhythm_loop.py) at 2, 10 and 50 steps/s whose rank 1 sleeps in its own code;
  ``--reps`` runs each, the median reported;
* the healthy-pause matrix, each pause ``--pause-secs`` long (longer than the action's limit and
  proof, so a false proof would restart it) under ``--on-hang restart``: the 4 pauses above
  (after 12 steps, so that each rank's rhythm is learned), and on the rhythm loop at 10 steps/s:
  a long first step (CPU-bound, as a compile), a torch.compile'd model's first step, an
  evaluation on every rank, a DataLoader re-warm at an epoch boundary (worker init takes the
  pause), a garbage collection, a folder listing, a torch.distributed.checkpoint async save.
  ``false_alarms``: polls whose verdict says hang, stalled or stuck; ``false_restarts``:
  restarts or kills of these runs.

    python scripts/bench_restart.py --rhythm [--pause-secs 25] [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROGRAM = REPO / "tests" / "programs" / "ddp_pauses.py"
RHYTHM = REPO / "tests" / "programs" / "rhythm_loop.py"
HANG_MODES = ("stalled", "unresponsive", "rank_stuck_peers_wait", "one_sided_collective", "hung", "worker_stuck")
ALARM = re.compile(r"\b(hang|hung|stalled|stuck)\b", re.I)
FINAL = ("succeeded", "partial", "failed", "killed", "lost")


def launch(tmp: Path, extra: list[str], env: dict[str, str], program: Path = PROGRAM) -> Path:
    res = subprocess.run([sys.executable, "-m", "ups", "launch", "torchrun", "--runs-dir", str(tmp / "runs"), "--detach",
                          "--json", *extra, "--nproc-per-node", "2", str(program)],
                         env={**os.environ, "PYTHONPATH": str(REPO), **env}, capture_output=True, text=True, check=True,
                         cwd=tmp)
    return Path(json.loads(res.stdout)["run_dir"])


def events(run: Path, *names: str) -> list[dict]:
    out = []
    for line in (run / "events.jsonl").read_text().splitlines():
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if e.get("event") in names:
            out.append(e)
    return out


def poll(run: Path, timeout: float) -> tuple[dict, list[dict]]:
    sys.path.insert(0, str(REPO))
    from ups.runs.read import open_run
    from ups.runs.rundir import RunDir
    from ups.why import diagnose_view

    rd, seen = RunDir(run), []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            v = diagnose_view(open_run(rd))
            seen.append({"mode": v.mode, "headline": v.headline})
        except Exception:  # noqa: BLE001 - a record being replaced: the next poll
            pass
        m = json.loads((run / "run.json").read_text())
        if m.get("state") in FINAL:
            return m, seen
        time.sleep(0.5)
    subprocess.run([sys.executable, "-m", "ups", "kill", str(run), "--force"], capture_output=True)
    return json.loads((run / "run.json").read_text()), seen


def healthy(kind: str, secs: float, stalled: list[str], *, at: int = 4, rhythm: bool = False) -> dict:
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp:
        if rhythm:
            tree = Path(tmp) / "tree"
            for i in range(40):
                (tree / str(i)).mkdir(parents=True)
                for j in range(100):
                    (tree / str(i) / str(j)).touch()
            run = launch(Path(tmp), ["--on-hang", "restart", *stalled],
                         {"RHYTHM_PAUSE": f"{kind}:{secs:g}", "RHYTHM_PAUSE_STEP": "60", "RHYTHM_STEPS": "120",
                          "RHYTHM_RATE": "10", "RHYTHM_LISTING": str(tree), "RHYTHM_WORKDIR": tmp}, RHYTHM)
        else:
            run = launch(Path(tmp), ["--on-hang", "restart", *stalled],
                         {"EXAMPLE_PAUSE": f"{kind}:{secs:g}", "EXAMPLE_PAUSE_STEP": str(at), "EXAMPLE_STEPS": str(at + 4),
                          "EXAMPLE_WORKDIR": str(Path(tmp) / "work")})
        m, seen = poll(run, secs + 240)
        alarms = [v for v in seen if ALARM.search(v["mode"]) or ALARM.search(v["headline"])]
        busy = sorted({v["headline"].split(";")[0][:100] for v in seen if v["mode"] == "busy"})
        modes: dict[str, int] = {}
        for v in seen:
            modes[v["mode"]] = modes.get(v["mode"], 0) + 1
        return {"pause": f"{kind}:{secs:g}", "state": m.get("state"), "attempts": m.get("attempt") or 1,
                "restarted_or_killed": len(events(run, "restart")) + sum(e.get("action", "").startswith("kill")
                                                                        for e in events(run, "hang")),
                "polls": len(seen), "alarm_polls": len(alarms), "busy_said": busy[:3], "modes": modes}


def real_hang(fault: str, extra: list[str], stall_limit: float) -> dict:
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp:
        run = launch(Path(tmp), extra, {"EXAMPLE_FAULT": fault, "EXAMPLE_STEPS": "10",
                                        "EXAMPLE_WORKDIR": str(Path(tmp) / "work")})
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not events(run, "restart"):
            time.sleep(0.2)
        restarts = events(run, "restart")
        subprocess.run([sys.executable, "-m", "ups", "kill", str(run), "--force"], capture_output=True)
        if not restarts:
            return {"fault": fault, "restarted": False}
        hang = next(e for e in events(run, "hang") if e.get("action") == "restart")
        who = hang["proof"]["process"]
        rec = json.loads((run / "attempts" / "1" / "status" / f"{who}.json").read_text())
        visible = max(rec["progress_at"], rec["phase_at"]) + stall_limit
        return {"fault": fault, "restarted": True, "who": who, "visible_to_restart_s": round(restarts[0]["ts"] - visible, 1),
                "proof": hang["proof"]["text"][:200]}


def named_after(rate: float) -> dict:
    """A 2-rank loop at ``rate`` steps/s whose rank 1 hangs in its own code: seconds from the
    hang's start to the first verdict that names it (polled every 0.25 s)."""
    sys.path.insert(0, str(REPO))
    from ups.runs.read import open_run
    from ups.runs.rundir import RunDir
    from ups.why import diagnose_view

    hang_step = max(40, int(8 * rate))
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp:
        run = launch(Path(tmp), [], {"RHYTHM_RATE": f"{rate:g}", "RHYTHM_HANG": str(hang_step),
                                     "RHYTHM_STEPS": str(hang_step + 1000)}, RHYTHM)
        rd, out, first = RunDir(run), {"rate": rate, "named": False}, []
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            try:
                v = diagnose_view(open_run(rd))
            except Exception:  # noqa: BLE001 - a record being replaced: the next poll
                v = None
            rec = run / "status" / "rank-1.json"
            try:
                r1 = json.loads(rec.read_text())
            except (OSError, ValueError):
                r1 = None
            if r1 is not None and r1.get("step", 0) >= 1 and not first:
                first.extend((r1["step"], r1["progress_at"]))
            if v is not None and r1 is not None and r1.get("step", 0) >= hang_step and v.mode in HANG_MODES \
                    and (v.who or {}).get("name") == "rank-1":
                start = max(r1["progress_at"], r1["phase_at"])
                p99 = r1.get("interval_p99")
                out = {"rate": rate, "named": True, "named_after_s": round(time.time() - start, 1), "mode": v.mode,
                       "p99_interval_s": p99, "headline": v.headline[:120],
                       # the pace it kept: its steps over the time from the first seen to its last
                       "measured_rate": round((r1["step"] - first[0]) / max(1e-3, r1["progress_at"] - first[1]), 1)
                       if first else None}
                break
            time.sleep(0.25)
        subprocess.run([sys.executable, "-m", "ups", "kill", str(run), "--force"], capture_output=True)
        return out


def rhythm_main(args: argparse.Namespace) -> None:
    import statistics

    hangs = {rate: [named_after(rate) for _ in range(args.reps)] for rate in (2.0, 10.0, 50.0)}
    secs = args.pause_secs
    pauses = [healthy(kind, secs, [], at=12) for kind in ("ckpt_stream", "ckpt_dcp", "eval", "upload")]
    pauses += [healthy(kind, secs, [], rhythm=True)
               for kind in ("first_step", "compile", "eval_all", "rewarm", "gc", "listing", "dcp_async")]
    median = {f"{rate:g}": (statistics.median([h["named_after_s"] for h in hs if h["named"]])
                            if any(h["named"] for h in hs) else None) for rate, hs in hangs.items()}
    print(json.dumps({
        "named_after_s_median": median,
        "named_after_s": {f"{rate:g}": [h.get("named_after_s") for h in hs] for rate, hs in hangs.items()},
        "measured_rates": {f"{rate:g}": [h.get("measured_rate") for h in hs] for rate, hs in hangs.items()},
        "p99_intervals_s": {f"{rate:g}": [h.get("p99_interval_s") for h in hs] for rate, hs in hangs.items()},
        "false_alarms": sum(x["alarm_polls"] for x in pauses), "polls": sum(x["polls"] for x in pauses),
        "false_restarts": sum(x["restarted_or_killed"] for x in pauses), "healthy_pauses": len(pauses),
        "healthy_succeeded_first_attempt": sum(x["state"] == "succeeded" and x["attempts"] == 1 for x in pauses),
        "pause_secs": secs, "thresholds": "default (learned)", "pauses": pauses,
        "hangs": {f"{rate:g}": hs for rate, hs in hangs.items()},
    }))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pause-secs", type=float, default=45.0)
    p.add_argument("--eval-secs", type=float, default=60.0)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--rhythm", action="store_true", help="time to name a hang at 2/10/50 steps/s, and the healthy matrix")
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args()
    if args.rhythm:
        if args.pause_secs == 45.0:
            args.pause_secs = 25.0
        rhythm_main(args)
        return
    stalled = ["--stalled-after", "3"] if args.quick else []
    secs, eval_secs = (15.0, 15.0) if args.quick else (args.pause_secs, args.eval_secs)
    stall_limit = 3.0 if args.quick else 10.0  # the learned limit's floor: these steps are fast
    pauses = [healthy(kind, eval_secs if kind == "eval" else secs, stalled)
              for kind in ("ckpt_stream", "ckpt_dcp", "eval", "upload")]
    hangs = [real_hang("hang:4", ["--on-hang", "restart", "--max-restarts", "1", *stalled], stall_limit),
             real_hang("onesided:4", ["--on-hang", "restart", "--max-restarts", "1", *stalled], stall_limit),
             real_hang("worker_sleep:100", ["--on-worker-hang", "fallback", *stalled], stall_limit)]
    times = [h["visible_to_restart_s"] for h in hangs if h.get("restarted")]
    print(json.dumps({
        "false_restarts": sum(x["restarted_or_killed"] for x in pauses),
        "healthy_pauses": len(pauses), "healthy_succeeded_first_attempt": sum(x["state"] == "succeeded" and x["attempts"] == 1
                                                                          for x in pauses),
        "alarm_polls": sum(x["alarm_polls"] for x in pauses), "polls": sum(x["polls"] for x in pauses),
        "real_hangs_restarted": sum(bool(h.get("restarted")) for h in hangs), "real_hangs": len(hangs),
        "visible_to_restart_s_max": max(times) if times else None, "visible_to_restart_s": times,
        "thresholds": "quick: --stalled-after 3" if args.quick else "default",
        "pauses": pauses, "hangs": hangs,
    }))


if __name__ == "__main__":
    main()
