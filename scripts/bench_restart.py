"""Seconds from a hang becoming visible to the restarted job's first step (`--on-hang restart`).
Prints one JSON line.

The drill is real: tests/programs/hang_train.py under `ups launch python --on-hang restart`
hangs once at a step (stuck in its own loop), ups names it stalled after --stalled-after,
saves its stacks, ends it and starts the same command again as attempt 2, which resumes from
the program's own checkpoint. Figures, per round (median over rounds):

- visible_to_first_step_s: from the moment the hang is visible (the hung rank's last
  progress + the stalled threshold) to attempt 2's first optimizer step. Target <= 30 s plus
  the program's own start-up;
- program_startup_s: attempt 2's process start to its first step (interpreter, import torch,
  loading the checkpoint): the program's own share;
- ups_share_s: the difference: judging, stacks, ending the hung job, starting the new one.

    python scripts/bench_restart.py [--rounds 3] [--stalled-after 3]
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
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROGRAM = REPO / "tests" / "programs" / "hang_train.py"


def one_round(tmp: Path, stalled_after: float) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO), UPS_HEARTBEAT_INTERVAL="0.3")
    res = subprocess.run([sys.executable, "-m", "ups", "launch", "python", "--runs-dir", str(tmp / "runs"), "--detach",
                          "--json", "--stalled-after", str(stalled_after), "--on-hang", "restart", "--max-restarts", "1",
                          str(PROGRAM), "--steps", "100000", "--hang-step", "20", "--hang-once", str(tmp / "hung-once"),
                          "--ckpt", str(tmp / "ckpt.pt")], env=env, capture_output=True, text=True, check=True, cwd=tmp)
    run = Path(json.loads(res.stdout)["run_dir"])
    sys.path.insert(0, str(REPO))
    from ups.status.reader import read_record_file

    rec_path = run / "status" / "rank-0.json"
    deadline = time.monotonic() + 180
    first_step_at = None
    while time.monotonic() < deadline:
        manifest = json.loads((run / "run.json").read_text())
        if manifest.get("attempt") == 2:
            try:
                rec = read_record_file(rec_path)
            except Exception:  # noqa: BLE001 - not written yet
                rec = None
            if rec is not None and rec.step > 0:
                first_step_at = time.time()  # polled every 20 ms
                break
        time.sleep(0.02)
    subprocess.run([sys.executable, "-m", "ups", "kill", str(run), "--grace", "2"], env=env, capture_output=True)
    if first_step_at is None:
        raise SystemExit(f"attempt 2 never made a step: {run}")
    hung = read_record_file(run / "attempts" / "1" / "status" / "rank-0.json")
    visible_at = hung.progress_at + stalled_after
    return {"visible_to_first_step_s": first_step_at - visible_at,
            "program_startup_s": first_step_at - rec.started_at}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--stalled-after", type=float, default=3.0)
    args = p.parse_args()
    rounds = []
    for _ in range(args.rounds):
        with tempfile.TemporaryDirectory() as tmp:
            rounds.append(one_round(Path(tmp), args.stalled_after))
    med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    print(json.dumps({
        "visible_to_first_step_s": round(med["visible_to_first_step_s"], 2),
        "program_startup_s": round(med["program_startup_s"], 2),
        "ups_share_s": round(med["visible_to_first_step_s"] - med["program_startup_s"], 2),
        "worst_visible_to_first_step_s": round(max(r["visible_to_first_step_s"] for r in rounds), 2),
        "rounds": args.rounds, "stalled_after_s": args.stalled_after,
        "target": "visible_to_first_step_s <= 30 + program_startup_s",
    }))


if __name__ == "__main__":
    main()
