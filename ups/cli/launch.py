"""``ups launch precompute|train|pipeline``: write the run folder, start the job detached.

Inputs are checked before anything starts (config keys and values, data shards, fault
names): bad input is one line and exit 2, and leaves no run folder behind.
"""

from __future__ import annotations

import json as jsonlib
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from ups.cli.common import (
    JsonOption,
    RunsDirOption,
    default_runs_dir,
    print_json,
    splits_option,
    tasks_option,
)

launch_app = typer.Typer(
    help="Start a job detached from this terminal and follow it (Ctrl-C stops following only).",
    no_args_is_help=True,
)

InjectOption = Annotated[
    list[str] | None,
    typer.Option("--inject", help="Fault to rehearse, e.g. worker_hang:worker=0,after=3 (repeatable; see the job's help)."),
]
DetachOption = Annotated[bool, typer.Option("--detach", help="Start the job and return at once.")]
ConfigOption = Annotated[Path | None, typer.Option("--config", help="YAML config; options given here override it.")]


def start_and_follow(run: Any, *, detach: bool, json_out: bool) -> None:
    """Shared tail of every launch: print the run, follow it unless detached."""
    from ups.cli.follow import follow_run

    if json_out:
        print_json({"run_id": run.run_id, "run_dir": str(run.path)})
    if detach:
        if not json_out:
            typer.echo(f"started {run.run_id} ({run.path}); `ups status {run.run_id}` to watch it")
        return
    code = follow_run(run, live=None if not json_out else False)
    raise typer.Exit(code)


def precompute_command(cfg: Any, config_path: Path | None) -> list[str]:
    cmd = [sys.executable, "-m", "ups.jobs.precompute", "--config", "{RUN}/config.json"]
    return cmd


def check_precompute_data(cfg: Any) -> int:
    """Open the shard index of every task/split now: a missing or broken file is named here."""
    from ups.data.shards import ShardIndex

    total = 0
    for task in cfg.tasks:
        for split in cfg.splits:
            total += len(ShardIndex.discover(cfg.root, task, split))
    return total


@launch_app.command("precompute")
def launch_precompute(
    root: Annotated[str | None, typer.Option("--root", help="Folder with the HDF5 shards.")] = None,
    tasks: Annotated[list[str] | None, tasks_option("Task(s): advection1d, burgers1d, darcy2d.")] = None,
    splits: Annotated[list[str] | None, splits_option()] = None,
    cache_dir: Annotated[str | None, typer.Option("--cache-dir", help="Where the latent cache goes.")] = None,
    config: ConfigOption = None,
    num_workers: Annotated[int | None, typer.Option("--num-workers", help="DataLoader workers; 0 = no worker processes.")] = None,
    legacy: Annotated[bool, typer.Option("--legacy", help="Same as --num-workers 0.")] = False,
    batch_size: Annotated[int | None, typer.Option("--batch-size")] = None,
    latent_dim: Annotated[int | None, typer.Option("--latent-dim")] = None,
    latent_tokens: Annotated[int | None, typer.Option("--latent-tokens")] = None,
    cache_dtype: Annotated[str | None, typer.Option("--cache-dtype", help="float16 or float32.")] = None,
    device: Annotated[str | None, typer.Option("--device", help="cpu, cuda or auto.")] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace a cache written with another hash.")] = False,
    worker_timeout: Annotated[float | None, typer.Option("--worker-timeout", help="Seconds before a hung worker is killed.")] = None,
    inject: InjectOption = None,
    detach: DetachOption = False,
    runs_dir: RunsDirOption = default_runs_dir(),
    json: JsonOption = False,
) -> None:
    """Encode HDF5 fields into a latent cache, with workers watched for hangs.

    A worker that hangs (stalled or unresponsive past --worker-timeout) gets its stacks
    dumped and is killed; its sample is retried, and quarantined after two failures. After
    repeated worker failures the job falls back to num_workers=0. A rerun resumes: cached
    samples are skipped.

    Faults (--inject): worker_hang[:worker=W,after=N|sample=I,mode=sleep|gil|stop],
    worker_crash[:worker=W,after=N,signal=SEGV], slow_read[:delay=S], write_enospc[:after=N],
    write_hang[:after=N] (with writer processes the job fails after write_timeout).

    Exit codes (when following): 0 succeeded, 3 partial (quarantined samples), 1 failed or
    killed, 2 bad input.
    """
    from ups.faults import validate_faults
    from ups.jobs.config import PrecomputeConfig, load_config
    from ups.jobs.precompute import KNOWN_FAULTS
    from ups.launch.spawn import launch_run

    overrides = {
        "root": root, "tasks": tasks, "splits": splits, "cache_dir": cache_dir,
        "num_workers": 0 if legacy else num_workers, "batch_size": batch_size, "latent_dim": latent_dim,
        "latent_tokens": latent_tokens, "cache_dtype": cache_dtype, "device": device,
        "overwrite": overwrite or None, "worker_timeout": worker_timeout,
    }
    cfg = load_config(PrecomputeConfig, config, overrides)
    faults = validate_faults(inject or [], KNOWN_FAULTS)
    total = check_precompute_data(cfg)
    from dataclasses import asdict

    resolved = asdict(cfg)
    run = launch_run(
        runs_dir, "precompute", precompute_command(cfg, config),
        argv=["ups", *sys.argv[1:]], config=resolved, env={"UPS_FAULTS": faults} if faults else {},
        thresholds=cfg.thresholds(), extra={"mode": "legacy" if cfg.num_workers == 0 else "parallel", "samples": total},
        files={"config.json": jsonlib.dumps(resolved, indent=1).encode()},
    )
    start_and_follow(run, detach=detach, json_out=json)


# ------------------------------------------------------------------------------ train
def torchrun_command(nproc: int, nnodes: int, node_rank: int | None, rdzv_endpoint: str | None) -> list[str]:
    """torchrun with a rendezvous that never collides: --standalone on one node (it picks a
    free port; never `--master-port 0` without it, which hangs), c10d across nodes."""
    cmd = [sys.executable, "-m", "torch.distributed.run"]
    if nnodes > 1:
        cmd += ["--nnodes", str(nnodes), "--node-rank", str(node_rank or 0), "--rdzv-backend", "c10d",
                "--rdzv-endpoint", str(rdzv_endpoint)]
    else:
        cmd += ["--standalone"]
    cmd += ["--nproc-per-node", str(nproc), "--log-dir", "{RUN}/logs/torchrun", "--redirects", "3", "--tee", "3",
            "-m", "ups.jobs.train", "--config", "{RUN}/config.json"]
    return cmd


DEBUG_ENV = {"NCCL_DEBUG": "INFO", "TORCH_DISTRIBUTED_DEBUG": "DETAIL", "TORCH_SHOW_CPP_STACKTRACES": "1"}


def prepare_train(
    *, cache_dir, tasks, config, nproc, steps, nnodes, node_rank, rdzv_endpoint, debug, inject, resume, runs_dir,
    require_cache: bool = True,
) -> tuple[dict[str, Any], Any]:
    """Validate everything and return launch_run's arguments for a train run (and the config).

    ``require_cache`` False: a pipeline's precompute stage has yet to write the cache."""
    from dataclasses import asdict

    from ups.errors import UpsError
    from ups.faults import validate_faults
    from ups.jobs.config import TrainConfig, load_config
    from ups.jobs.train import KNOWN_FAULTS

    cfg = load_config(TrainConfig, config, {"cache_dir": cache_dir, "tasks": tasks, "steps": steps, "resume": resume or None})
    if nproc < 1 or nnodes < 1:
        raise UpsError("--nproc and --nnodes must be >= 1")
    if nnodes > 1 and not rdzv_endpoint:
        raise UpsError("--nnodes > 1 needs --rdzv-endpoint HOST:PORT (the same on every node) and --node-rank")
    faults = validate_faults(inject or [], KNOWN_FAULTS)
    from ups.data.cache import METADATA_NAME, split_dir

    for t in cfg.tasks if require_cache else []:
        for s in cfg.splits:
            folder = split_dir(cfg.cache_dir, t, s)
            if not (folder / METADATA_NAME).is_file():
                raise UpsError(f"{folder}: no latent cache (run `ups launch precompute --tasks {t} --splits {s}` first)")
    resolve_train_device(cfg, nproc)
    env = dict(DEBUG_ENV) if debug else {}
    if faults:
        env["UPS_FAULTS"] = faults
    resolved = asdict(cfg)
    return dict(
        runs_root=runs_dir, kind="train", command=torchrun_command(nproc, nnodes, node_rank, rdzv_endpoint),
        argv=["ups", *sys.argv[1:]], config=resolved, env=env, thresholds=cfg.thresholds(),
        extra={"nproc": nproc, "nnodes": nnodes, "world_size": nproc * nnodes},
        files={"config.json": jsonlib.dumps(resolved, indent=1).encode()},
    ), cfg


def resolve_train_device(cfg: Any, nproc: int) -> None:
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
            typer.echo(f"device auto: {nproc} ranks but {gpus} GPU(s) on this node: training on CPU (gloo); "
                       f"--nproc {gpus} trains on the GPU", err=True)
    elif nproc > gpus:
        raise UpsError(f"device: {cfg.device} with --nproc {nproc} needs {nproc} GPUs, this node has {gpus} "
                       f"(use --nproc {gpus}, or device: cpu)")


@launch_app.command("train")
def launch_train(
    cache_dir: Annotated[str | None, typer.Option("--cache-dir", help="Latent cache root from the precompute.")] = None,
    tasks: Annotated[list[str] | None, tasks_option("Task(s) whose caches to train on, one task per step.")] = None,
    config: ConfigOption = None,
    nproc: Annotated[int, typer.Option("--nproc", help="Ranks on this node.")] = 2,
    steps: Annotated[int | None, typer.Option("--steps", help="Optimizer steps.")] = None,
    nnodes: Annotated[int, typer.Option("--nnodes", help="Nodes (each runs this command with its --node-rank).")] = 1,
    node_rank: Annotated[int | None, typer.Option("--node-rank")] = None,
    rdzv_endpoint: Annotated[str | None, typer.Option("--rdzv-endpoint", help="HOST:PORT of the c10d rendezvous (multi-node).")] = None,
    debug: Annotated[bool, typer.Option("--debug", help="NCCL_DEBUG=INFO, TORCH_DISTRIBUTED_DEBUG=DETAIL, C++ stack traces.")] = False,
    resume: Annotated[bool, typer.Option("--resume", help="Continue from the last checkpoint.")] = False,
    inject: InjectOption = None,
    detach: DetachOption = False,
    runs_dir: RunsDirOption = default_runs_dir(),
    json: JsonOption = False,
) -> None:
    """Train the latent operator under torchrun (gloo on CPU, NCCL on GPU).

    One node uses --standalone (a free port: a busy 29500 does not matter). Each rank's log
    and error file land in the run folder; the run is succeeded only when torchrun exited 0
    and every rank's final record says done, otherwise failed naming the first failing
    rank, its signal or exception, and its last phase.

    Several tasks train one operator: each step takes a batch of one task, the same task
    on every rank; a time-dependent task (advection1d, burgers1d) learns one time step, a
    steady one (darcy2d) the map from its coefficient to its solution.

    Faults (--inject): segv:rank=R,phase=P  oom:rank=R,step=S  hang:rank=R,step=S
    skip_collective:rank=R,step=S.
    """
    from ups.launch.spawn import launch_run

    kwargs, _ = prepare_train(cache_dir=cache_dir, tasks=tasks, config=config, nproc=nproc, steps=steps, nnodes=nnodes,
                              node_rank=node_rank, rdzv_endpoint=rdzv_endpoint, debug=debug, inject=inject, resume=resume,
                              runs_dir=runs_dir)
    start_and_follow(launch_run(**kwargs), detach=detach, json_out=json)


@launch_app.command("pipeline")
def launch_pipeline(
    root: Annotated[str, typer.Option("--root", help="Folder with the HDF5 shards.")],
    tasks: Annotated[list[str], tasks_option("Task(s) to precompute and train on.")],
    cache_dir: Annotated[str, typer.Option("--cache-dir", help="Where the latent cache goes.")],
    splits: Annotated[list[str] | None, splits_option()] = None,
    num_workers: Annotated[int | None, typer.Option("--num-workers", help="Precompute DataLoader workers.")] = None,
    nproc: Annotated[int, typer.Option("--nproc", help="Training ranks.")] = 2,
    steps: Annotated[int | None, typer.Option("--steps", help="Training steps.")] = None,
    detach: DetachOption = False,
    runs_dir: RunsDirOption = default_runs_dir(),
    json: JsonOption = False,
) -> None:
    """Precompute, then train on the new cache, stopping at the first failure.

    The pipeline is a run of its own ("pipeline") whose stages are runs too (`ups runs`
    lists all three, each stage naming its parent), so each stage keeps its own status,
    stacks and logs.
    """
    from dataclasses import asdict

    from ups.jobs.config import PrecomputeConfig, load_config
    from ups.launch.spawn import launch_run

    pre = load_config(PrecomputeConfig, None, {"root": root, "tasks": tasks, "splits": splits, "cache_dir": cache_dir,
                                               "num_workers": num_workers})
    check_precompute_data(pre)
    _, train_cfg = prepare_train(cache_dir=cache_dir, tasks=tasks, config=None, nproc=nproc, steps=steps, nnodes=1,
                                 node_rank=None, rdzv_endpoint=None, debug=False, inject=None, resume=False, runs_dir=runs_dir,
                                 require_cache=False)
    plan = {"precompute": asdict(pre), "train": asdict(train_cfg), "nproc": nproc, "runs_dir": str(runs_dir)}
    run = launch_run(
        runs_dir, "pipeline", [sys.executable, "-m", "ups.jobs.pipeline", "{RUN}/pipeline.json"],
        argv=["ups", *sys.argv[1:]], config=plan, thresholds={"phase_stalled_after": {"precompute": None, "train": None}},
        files={"pipeline.json": jsonlib.dumps(plan, indent=1).encode()},
    )
    start_and_follow(run, detach=detach, json_out=json)
