"""Wall time of `ups doctor --quick` (target < 3 s) and of the full doctor (target < 30 s),
beside `python -m torch.utils.collect_env` on the same machine. Prints one JSON line."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def wall(args: list[str], env: dict[str, str], n: int) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        subprocess.run(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    with tempfile.TemporaryDirectory() as d:
        data = Path(d) / "data"
        subprocess.run([sys.executable, "-m", "ups", "data", "synth", "--task", "burgers1d", "--root", str(data),
                        "--samples", "32", "--shards", "4"], env=env, check=True, capture_output=True)
        doctor = [sys.executable, "-m", "ups", "doctor", "--root", str(data), "--runs-dir", str(Path(d) / "runs")]
        quick = wall([*doctor, "--quick"], env, 5)
        full = wall(doctor, env, 2)
    collect = wall([sys.executable, "-m", "torch.utils.collect_env"], env, 2)
    print(json.dumps({
        "doctor_quick_s": round(quick, 2), "doctor_quick_target_s": 3,
        "doctor_full_s": round(full, 2), "doctor_full_target_s": 30,
        "torch_collect_env_s": round(collect, 2),
    }))


if __name__ == "__main__":
    main()
