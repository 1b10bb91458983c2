"""Record what a real SLURM writes into a job's output when the scheduler ends it (issue 49).

    python scripts/make_slurm_logs.py OUT

starts a one-node SLURM of its own under OUT (tests/slurm.py: slurmctld, slurmd and munged from
Debian's slurm-wlm and munge, root only), runs tests/programs/slurm_train.py as a 2-task `sbatch`
job of gloo ranks (`srun python slurm_train.py`, ranks from SLURM_PROCID) once per scenario, and
writes each job's `slurm-<job>.out` as a record of OUT/slurm.jsonl, in the reproduction corpus's
format (tests/data/repro_corpus/README.md):

* ``scancel``: `scancel JOB` once the ranks train;
* ``time_limit``: `sbatch --time=1`: SLURM ends it at its time limit (a minute, checked every 30 s
  or so: about 90 s).

tests/data/repro_corpus/slurm.jsonl holds what this wrote.
"""

from __future__ import annotations

import json
import socket
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from slurm import Cluster  # noqa: E402 - tests/slurm.py, the test suite's cluster

PROGRAM = REPO / "tests" / "programs" / "slurm_train.py"


def wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.5)


def job(cluster: Cluster, folder: Path, sbatch: tuple[str, ...]) -> tuple[int, Path]:
    folder.mkdir(parents=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = folder / "train.sbatch"
    script.write_text(f"#!/bin/bash\n#SBATCH -n 2\nexport MASTER_ADDR=127.0.0.1 MASTER_PORT={port}\n"
                      f"srun {sys.executable} {PROGRAM}\n")
    jid = cluster.sbatch(script, *sbatch)
    out = folder / f"slurm-{jid}.out"
    wait(lambda: out.exists() and "step 5 " in out.read_text(errors="replace"), 180, f"job {jid} to train")
    return jid, out


def main() -> None:
    import torch

    root = Path(sys.argv[1])
    root.mkdir(parents=True, exist_ok=True)
    cluster = Cluster.start(root / "cluster")
    records = []
    try:
        for scenario, sbatch, note in (
            ("scancel", (), "a 2-task sbatch job of gloo ranks cancelled with `scancel JOB` while it trains"),
            ("time_limit", ("--time=1",), "a 2-task sbatch job of gloo ranks ended by SLURM at its time limit (1 min)"),
        ):
            jid, out = job(cluster, root / scenario, sbatch)
            if scenario == "scancel":
                cluster.client("scancel", str(jid))
            info = cluster.wait_state(jid, ("CANCELLED", "TIMEOUT"), timeout=150)
            time.sleep(2)  # srun's last lines after the job's state changed
            records.append({"class": "job_terminated", "negative": None, "expect": None, "thread": None,
                            "source": f"scripts/make_slurm_logs.py {scenario} (slurm-wlm 22.05, sbatch + srun)",
                            "text": out.read_text(errors="replace"), "note": note, "scenario": f"slurm_{scenario}",
                            "surrounding": "sbatch", "exit_code": info.get("ExitCode"), "torch": torch.__version__,
                            "job": str(jid), "job_state": info.get("JobState")})
            cluster.idle()
    finally:
        cluster.stop()
    (root / "slurm.jsonl").write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in records))
    print(f"{len(records)} records in {root / 'slurm.jsonl'}")


if __name__ == "__main__":
    main()
