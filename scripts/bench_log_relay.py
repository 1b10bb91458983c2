"""The job's output relay must not slow the program: a loop printing 100k lines, with stdout
unbuffered as the launcher sets it (PYTHONUNBUFFERED=1, one write per line), timed with its
stdout a log file (the old way) and with its stdout the relay's pipe (ups.launch.logrelay
appending to the same kind of file). Rounds alternate; the median of each is kept. Prints one
JSON line:

- direct_s / relay_s: the program's own wall time (start to exit) printing to the file /
  through the relay
- relay_over_direct: relay_s / direct_s (1.0: no cost; below 1: the pipe is cheaper)
- lines_logged: lines that reached the log through the relay in the last round (all of them)
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROGRAM = "import sys\nfor i in range(int(sys.argv[1])):\n    print(f'step {i} loss 0.{i:06d} lr 3e-4')\n"


def run_direct(lines: int, log: Path) -> float:
    with open(log, "ab") as fh:
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", PROGRAM, str(lines)], stdout=fh, stderr=subprocess.STDOUT, check=True,
                       env=dict(os.environ, PYTHONUNBUFFERED="1"))
        return time.perf_counter() - t


def run_relayed(lines: int, log: Path) -> float:
    read_end, write_end = os.pipe()
    try:
        fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, 1 << 20)
    except OSError:
        pass
    log_fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    relay = subprocess.Popen([sys.executable, "-m", "ups.launch.logrelay", str(log_fd)], stdin=read_end,
                             stdout=subprocess.DEVNULL, pass_fds=(log_fd,),
                             env=dict(os.environ, PYTHONPATH=str(REPO)))
    os.close(read_end)
    os.close(log_fd)
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", PROGRAM, str(lines)], stdout=write_end, stderr=subprocess.STDOUT, check=True,
                   env=dict(os.environ, PYTHONUNBUFFERED="1"))
    took = time.perf_counter() - t
    os.close(write_end)
    relay.wait(timeout=60)
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    direct, relayed = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            a, b = Path(tmp) / f"direct-{i}.log", Path(tmp) / f"relay-{i}.log"
            direct.append(run_direct(args.lines, a))
            relayed.append(run_relayed(args.lines, b))
        logged = sum(1 for _ in open(b, "rb"))
    d, r = statistics.median(direct), statistics.median(relayed)
    print(json.dumps({"lines": args.lines, "rounds": args.rounds, "direct_s": round(d, 3), "relay_s": round(r, 3),
                      "relay_over_direct": round(r / d, 3), "lines_logged": logged}))


if __name__ == "__main__":
    main()
