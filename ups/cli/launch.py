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

from ups.cli.common import JsonOption, RunsDirOption, default_runs_dir, print_json

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
    tasks: Annotated[list[str] | None, typer.Option("--tasks", help="Task(s): advection1d, burgers1d, darcy2d.")] = None,
    splits: Annotated[list[str] | None, typer.Option("--splits", help="Split(s): train, val, test.")] = None,
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
    worker_crash[:worker=W,after=N,signal=SEGV], slow_read[:delay=S], write_enospc[:after=N].

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
