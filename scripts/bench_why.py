"""Seconds from fault to verdict for the failure modes of `ups why`. Prints one JSON line.

Each mode is built for real by the drills of tests/why_drills.py (the same ones the tests
run): our own drills and the DDP tutorial (an outside program, default thresholds, no flags).
For each: seconds from launch until the failure is visible under the run's thresholds (a
hang: stalled or unresponsive; a crash: the run ended), seconds from then to the right verdict
(target <= 15), whether the verdict named the right process and frame, and how many of the
verdicts asked for every 0.2 s on the way blamed another process (target 0). Totals: modes
right / tried, the worst seconds to verdict, the wrong verdicts ever shown.

    python scripts/bench_why.py [--only NAME ...]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]
os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
os.environ.setdefault("WANDB_MODE", "offline")

from helpers import run_ups  # noqa: E402
from why_drills import DRILLS, TUTORIAL_DRILLS, VERDICT_WITHIN_S, ended, run_drill  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="*", help="drill names (default: all)")
    args = p.parse_args()
    drills = [d for d in DRILLS + TUTORIAL_DRILLS if not args.only or d.name in args.only]
    modes: dict[str, dict] = {}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ups-bench-why-") as tmp:
        os.environ["UPS_RUNS_DIR"] = str(Path(tmp) / "runs")
        for k, drill in enumerate(drills):
            scratch = Path(tmp) / f"{k:02d}"
            scratch.mkdir()
            try:
                out = run_drill(drill, scratch)
            finally:
                if drill.cleanup:
                    drill.cleanup()
            v = out["verdict"] or {}
            modes[drill.name] = {
                "visible_s": out["visible_s"], "verdict_s": out["verdict_s"], "mode": v.get("mode"),
                "right": out["problem"] is None, "who": (v.get("who") or {}).get("label"),
                "polls": len(out["shown"]), "wrong_shown": len(out["wrong"]),
                **({"first_wrong": out["wrong"][0][3][:160]} if out["wrong"] else {}),
                "where": (v.get("where") or {}).get("site") or (v.get("where") or {}).get("frame"),
                **({"problem": out["problem"][:300]} if out["problem"] else {}),
            }
            if not ended(out["run"]):
                run_ups("kill", str(out["run"].path), "--force")
    times = [m["verdict_s"] for m in modes.values() if m["verdict_s"] is not None]
    print(json.dumps({
        "modes": modes, "right": sum(m["right"] for m in modes.values()), "of": len(modes),
        "max_verdict_s": max(times) if times else None, "target_s": VERDICT_WITHIN_S,
        "wrong_shown": sum(m["wrong_shown"] for m in modes.values()), "polls": sum(m["polls"] for m in modes.values()),
        "wall_s": round(time.monotonic() - started, 1),
    }))
    return 0 if all(m["right"] and not m["wrong_shown"] for m in modes.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
