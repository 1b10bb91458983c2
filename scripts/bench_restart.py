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
ALARM = re.compile(r"\b(hang|hung|stalled|stuck)\b", re.I)
FINAL = ("succeeded", "partial", "failed", "killed", "lost")


def launch(tmp: Path, extra: list[str], env: dict[str, str]) -> Path:
    res = subprocess.run([sys.executable, "-m", "ups", "launch", "torchrun", "--runs-dir", str(tmp / "runs"), "--detach",
                          "--json", *extra, "--nproc-per-node", "2", str(PROGRAM)],
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


def healthy(kind: str, secs: float, stalled: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        run = launch(Path(tmp), ["--on-hang", "restart", *stalled],
                     {"EXAMPLE_PAUSE": f"{kind}:{secs:g}", "EXAMPLE_PAUSE_STEP": "4", "EXAMPLE_STEPS": "8",
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
    with tempfile.TemporaryDirectory() as tmp:
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pause-secs", type=float, default=45.0)
    p.add_argument("--eval-secs", type=float, default=60.0)
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
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
