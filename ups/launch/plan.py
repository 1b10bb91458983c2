"""Planning a launch of our own jobs: everything is checked and resolved before anything starts.

``ups launch precompute|train|pipeline`` and ``ups demo`` (and the pipeline job's train
stage) build their commands here: the data shards probed in a killable process, fault names
checked, the training device decided, torchrun's rendezvous chosen so that it never hangs.
Bad input raises UpsError (one line, exit 2) and leaves no run folder behind. Notes for the
operator go through ``say`` (stderr by default).
"""

from __future__ import annotations

import json as jsonlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

Say = Callable[[str], None]


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


# Faults the launch itself rehearses (not passed on to a job).
LAUNCH_FAULTS = ("shard_probe_hang",)


def precompute_command(cfg: Any, config_path: Path | None) -> list[str]:
    cmd = [sys.executable, "-m", "ups.jobs.precompute", "--config", "{RUN}/config.json"]
    return cmd


def check_precompute_data(cfg: Any, *, skip_bad: bool = False, faults: str = "", say: Say = _stderr) -> int:
    """Open every shard of every task/split now, in a probe process that is killed if it hangs
    (ups.data.probe): a missing, corrupt or unreadable file, a FIFO or a hung mount is named
    here, in seconds, before anything starts. Any bad shard refuses the launch; with
    ``skip_bad`` they go to ``cfg.skip_shards`` instead (the job leaves them out and ends
    partial). Returns the number of samples to cache."""
    from ups.data.probe import probe_shards
    from ups.errors import UpsError

    survey = probe_shards(
        cfg.root, [(t, s) for t in cfg.tasks for s in cfg.splits], timeout=cfg.shard_open_timeout,
        progress=say, env={"UPS_FAULTS": faults} if faults else None,
    )
    if len(survey.problems) == 1:
        raise UpsError(survey.problems[0])
    if survey.problems:
        raise UpsError(_lines(survey.problems, f"{len(survey.problems)} problems with the data under {cfg.root}; nothing started:"))
    bad = [survey.bad[p] for p in survey.files if p in survey.bad]
    if bad and not skip_bad:
        raise UpsError(_lines(bad, f"{len(bad)} bad shard(s) under {cfg.root}; nothing started (fix or move them, "
                                   "or pass --skip-bad-shards to cache the rest):"))
    empty = [key for key in survey.splits if not survey.samples.get(key)]
    if empty:
        raise UpsError(_lines(bad, f"nothing to cache for {', '.join(empty)} (every shard bad or empty); nothing started:"))
    if bad:
        found = {Path(p).name: survey.bad[p].removeprefix(f"{p}: ") for p in survey.files if p in survey.bad}
        cfg.skip_shards = {**cfg.skip_shards, **found}
        say(_lines(bad, f"ups: leaving out {len(bad)} bad shard(s) (--skip-bad-shards); the run will end partial:"))
    return sum(survey.samples.values())


def _lines(items: list[str], head: str) -> str:
    """A head line, then one indented line per item (each names its file)."""
    return head + "".join(f"\n  {item}" for item in items)


def validate_launch_faults(inject: list[str] | None, job_faults: tuple[str, ...]) -> tuple[str, str]:
    """(faults for the job, faults for the launch check), both validated against their names."""
    from ups.faults import parse_faults, validate_faults

    faults = parse_faults(validate_faults(inject or [], job_faults + LAUNCH_FAULTS))
    job = ";".join(str(f) for f in faults if f.name not in LAUNCH_FAULTS)
    launch = ";".join(str(f) for f in faults if f.name in LAUNCH_FAULTS)
    return job, launch


def torchrun_command(nproc: int, nnodes: int, node_rank: int | None, rdzv_endpoint: str | None,
                     rdzv_id: str | None = None) -> list[str]:
    """torchrun with a rendezvous that never collides: --standalone on one node (it picks a
    free port; never `--master-port 0` without it, which hangs), c10d across nodes."""
    cmd = [sys.executable, "-m", "torch.distributed.run"]
    if nnodes > 1:
        cmd += ["--nnodes", str(nnodes), "--node-rank", str(node_rank or 0), "--rdzv-backend", "c10d",
                "--rdzv-endpoint", str(rdzv_endpoint)]
        if rdzv_id:
            cmd += ["--rdzv-id", rdzv_id]
    else:
        cmd += ["--standalone"]
    cmd += ["--nproc-per-node", str(nproc), "--log-dir", "{RUN}/logs/torchrun", "--redirects", "3", "--tee", "3",
            "-m", "ups.jobs.train", "--config", "{RUN}/config.json"]
    return cmd


DEBUG_ENV = {"NCCL_DEBUG": "INFO", "TORCH_DISTRIBUTED_DEBUG": "DETAIL", "TORCH_SHOW_CPP_STACKTRACES": "1"}


def prepare_train(
    *, cache_dir, tasks, config, nproc, steps, nnodes, node_rank, rdzv_endpoint, debug, inject, resume, runs_dir,
    require_cache: bool = True, run_id: str | None = None, say: Say = _stderr,
) -> tuple[dict[str, Any], Any]:
    """Validate everything and return launch_run's arguments for a train run (and the config).

    ``require_cache`` False: a pipeline's precompute stage has yet to write the cache."""
    from dataclasses import asdict

    from ups.errors import UpsError
    from ups.faults import TRAIN_FAULTS as KNOWN_FAULTS
    from ups.faults import validate_faults
    from ups.launch.config import TrainConfig, load_config

    cfg = load_config(TrainConfig, config, {"cache_dir": cache_dir, "tasks": tasks, "steps": steps, "resume": resume or None})
    if nproc < 1 or nnodes < 1:
        raise UpsError("--nproc and --nnodes must be >= 1")
    if nnodes > 1 and not rdzv_endpoint:
        raise UpsError("--nnodes > 1 needs --rdzv-endpoint HOST:PORT (the same on every node) and --node-rank")
    if nnodes > 1 and not run_id:
        raise UpsError("--nnodes > 1 needs --run-id ID, the same on every node: the nodes join one run of that id")
    faults = validate_faults(inject or [], KNOWN_FAULTS)
    from ups.data.cache import METADATA_NAME, split_dir

    for t in cfg.tasks if require_cache else []:
        for s in cfg.splits:
            folder = split_dir(cfg.cache_dir, t, s)
            if not (folder / METADATA_NAME).is_file():
                raise UpsError(f"{folder}: no latent cache (run `ups launch precompute --tasks {t} --splits {s}` first)")
    resolve_train_device(cfg, nproc, say=say)
    env = dict(DEBUG_ENV) if debug else {}
    if faults:
        env["UPS_FAULTS"] = faults
    resolved = asdict(cfg)
    return dict(
        runs_root=runs_dir, kind="train", command=torchrun_command(nproc, nnodes, node_rank, rdzv_endpoint, run_id),
        argv=["ups", *sys.argv[1:]], config=resolved, env=env, thresholds=cfg.thresholds(),
        extra={"nproc": nproc, "nnodes": nnodes, "world_size": nproc * nnodes},
        files={"config.json": jsonlib.dumps(resolved, indent=1).encode()},
        instrument="agent",  # torchrun's agent, the ranks and any helper report as a user's program does
        run_id=run_id,
        multinode={"nnodes": nnodes, "node_rank": node_rank or 0, "rdzv_endpoint": rdzv_endpoint} if nnodes > 1 else None,
    ), cfg


def resolve_train_device(cfg: Any, nproc: int, *, say: Say = _stderr) -> None:
    """One GPU per rank, decided before anything starts: ``auto`` becomes cuda when this node
    has a GPU for every rank, else cpu (gloo) with a note; ``cuda`` with more ranks than
    GPUs is refused. Unknown GPU count (no NVML): left to the job."""
    from ups.errors import UpsError
    from ups.gpu import visible_device_count

    if not (cfg.device == "auto" or cfg.device.startswith("cuda")):
        return
    gpus = visible_device_count()
    if gpus is None:
        return
    if cfg.device == "auto":
        cfg.device = "cuda" if nproc <= gpus else "cpu"
        if 0 < gpus < nproc:
            say(f"device auto: {nproc} ranks but {gpus} GPU(s) on this node: training on CPU (gloo); "
                f"--nproc {gpus} trains on the GPU")
    elif nproc > gpus:
        raise UpsError(f"device: {cfg.device} with --nproc {nproc} needs {nproc} GPUs, this node has {gpus} "
                       f"(use --nproc {gpus}, or device: cpu)")
