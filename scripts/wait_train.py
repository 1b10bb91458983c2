"""Used by gpu_check.sh: watch a CUDA training run through `ups status --json`.

Waits (deadline 120 s) until every rank's record carries torch's GPU memory and writes that
status to OUT/train_status.json, then waits (deadline 300 s) for the run to end and writes
its final status to OUT/train_run.json. Exit 0 only when both happened and the run succeeded.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time


def status(run: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ups", "status", run, "--json"], capture_output=True, text=True)


def main() -> int:
    run, out = sys.argv[1], sys.argv[2]
    ok, res, deadline = False, None, time.time() + 120
    while time.time() < deadline and not ok:
        res = status(run)
        if res.returncode == 0:
            ranks = [p for p in json.loads(res.stdout)["processes"] if p.get("role") == "rank"]
            ok = bool(ranks) and all((p.get("gpu") or {}).get("allocated") for p in ranks)
        if not ok:
            time.sleep(0.5)
    with open(f"{out}/train_status.json", "w") as f:
        f.write(res.stdout + res.stderr)
    print("rank GPU memory in status:", ok)
    state, deadline = "?", time.time() + 300
    while time.time() < deadline:
        res = status(run)
        state = json.loads(res.stdout)["run"]["state"] if res.returncode == 0 else "?"
        if state not in ("?", "launching", "running"):
            break
        time.sleep(1)
    with open(f"{out}/train_run.json", "w") as f:
        f.write(res.stdout + res.stderr)
    print("training run:", state)
    return 0 if ok and state == "succeeded" else 1


if __name__ == "__main__":
    sys.exit(main())
