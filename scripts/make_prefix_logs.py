"""Record torchrun's line prefixes for real: one small gloo job in which one rank raises, run
under torchrun in each way a log gets its prefixes (issue 47).

    python scripts/make_prefix_logs.py OUT

writes OUT/<form>.log, the agents' stdout and stderr as one file (as ``srun`` or ``| tee``
collects them), and OUT/manifest.json (the torch version, each form's command and which global
rank raised). Forms:

* ``tee_1node``: one node, ``--nproc-per-node 2 --tee 3``: ``[default1]:`` on every line;
* ``plain_1node``: the same without ``--tee``: only torch's ``[rank1]:`` on the traceback;
* ``tee_2nodes``: two agents on this box (``--nnodes 2 --nproc-per-node 2``, c10d rendezvous on
  127.0.0.1, each node its own ``--local-addr`` 127.0.0.2/127.0.0.3), ``--tee 3``: both nodes'
  ``[default0]:`` and ``[default1]:``; global rank 3 (local rank 1 of node 1) raises;
* ``plain_2nodes``: the same without ``--tee``;
* ``template_2nodes``: ``--tee 3`` with ``TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE='[rank${rank}]:'``
  (torchrun's way to prefix the global rank; it has no command-line option for it).

tests/data/torchrun_prefixes/ holds what this wrote; the 2-node ``--tee 3`` log is also a
record of the reproduction corpus (tests/data/repro_corpus/nodes.jsonl).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROGRAM = '''
import datetime, os, sys, time
import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=20))
rank = dist.get_rank()
print(f"rank {rank} of {dist.get_world_size()} (local {os.environ['LOCAL_RANK']}) ready", flush=True)
t = torch.ones(4)
dist.all_reduce(t)
print(f"step 1 sum {t[0].item():.0f}", flush=True)


def load_shard(index):
    if index == int(os.environ["FAILING_RANK"]):
        raise ValueError(f"shard {index} has 0 rows: /data/shards/part-{index:05d}.h5 is empty")
    return torch.ones(4)


t = load_shard(rank)
dist.all_reduce(t)
print("done", flush=True)
dist.destroy_process_group()
'''

FORMS = {
    "tee_1node": (1, ["--tee", "3"], 1),
    "plain_1node": (1, [], 1),
    "tee_2nodes": (2, ["--tee", "3"], 3),
    "plain_2nodes": (2, [], 3),
    "template_2nodes": (2, ["--tee", "3"], 3),
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def record(form: str, folder: Path, out: Path) -> dict:
    nnodes, flags, failing = FORMS[form]
    program = folder / "shard_job.py"
    program.write_text(PROGRAM)
    port = _free_port()
    env = {**os.environ, "FAILING_RANK": str(failing), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    if form.startswith("template"):
        env["TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"] = "[rank${rank}]:"
    log = out / f"{form}.log"
    commands = []
    with open(log, "wb") as fh:
        agents = []
        for node in range(nnodes):
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", *flags]
            if nnodes > 1:
                cmd += ["--nnodes", str(nnodes), "--node-rank", str(node), "--rdzv-backend", "c10d",
                        "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"prefix-{form}",
                        "--local-addr", f"127.0.0.{node + 2}", "--max-restarts", "0"]
            else:
                cmd += ["--master-port", str(port)]
            cmd.append(str(program))
            commands.append(cmd)
            agents.append(subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=folder))
        deadline = time.monotonic() + 180
        codes = []
        for a in agents:
            try:
                codes.append(a.wait(max(1.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                a.kill()
                codes.append(a.wait())
    shown = [" ".join(["torchrun", *c[3:-1], "shard_job.py"]) for c in commands]  # c: python -m torch.distributed.run ...
    entry = {"form": form, "log": log.name, "nodes": nnodes, "failing_rank": failing, "exit_codes": codes,
             "commands": shown}
    if "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE" in env:
        entry["env"] = {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": env["TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"]}
    return entry


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    import torch

    entries = []
    with tempfile.TemporaryDirectory(prefix="prefix-logs-") as tmp:
        for form in sys.argv[2:] or FORMS:
            entries.append(record(form, Path(tmp), out))
            print(form, entries[-1]["exit_codes"], flush=True)
    (out / "manifest.json").write_text(json.dumps({"torch": torch.__version__, "logs": entries}, indent=1) + "\n")


if __name__ == "__main__":
    main()
