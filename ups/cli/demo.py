"""``ups demo``: the whole stack on an embedded default, on this machine, in a minute.

Makes small synthetic PDEBench-layout data under ./data/demo on first use, runs the
latent-cache precompute on it (2 DataLoader workers, CPU when there is no GPU) with the live
view, then a short 2-rank training run (torchrun) on the new cache.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ups.cli.common import JsonOption, RunsDirOption, default_runs_dir

commands = typer.Typer()  # registered by ups.cli.app, the root

DEMO_TASKS = ("advection1d", "burgers1d")
DEMO_SAMPLES = 96
DEMO_TRAIN_TASK = "burgers1d"
DEMO_RANKS = 2
DEMO_STEPS = 40


def ensure_demo_data(root: Path) -> None:
    """Synthesize the demo shards unless they are already there."""
    from ups.data.shards import manifest_path
    from ups.data.synth import synthesize

    for task in DEMO_TASKS:
        if manifest_path(root, task, "train").exists():
            continue
        typer.echo(f"making demo data: {DEMO_SAMPLES} {task} samples under {root}", err=True)
        synthesize(root, task, "train", DEMO_SAMPLES, seed=0, shards=3, timesteps=16, resolution=64)


@commands.command("demo")
def demo_cmd(
    data_root: Annotated[Path, typer.Option("--data-root", help="Where the demo data lives.")] = Path("data/demo"),
    cache_dir: Annotated[Path, typer.Option("--cache-dir", help="Where the demo cache goes.")] = Path("cache/demo"),
    num_workers: Annotated[int, typer.Option("--num-workers", help="DataLoader workers for the precompute.")] = 2,
    train_steps: Annotated[int, typer.Option("--train-steps", help="Steps of the 2-rank training after the precompute (0: skip).")] = DEMO_STEPS,
    detach: Annotated[bool, typer.Option("--detach", help="Start both stages as one pipeline run and return at once.")] = False,
    console: Annotated[bool, typer.Option("--console/--no-console", help="End in `ups console` when run in a terminal.")] = True,
    runs_dir: RunsDirOption = default_runs_dir(),
    json: JsonOption = False,
) -> None:
    """Precompute on synthetic data made on first use, then a short 2-rank torchrun training
    on the new cache (CPU and gloo when there is no GPU). In a terminal it ends in the
    console; otherwise (CI, pipes) it prints plain progress lines."""
    import sys
    from dataclasses import asdict

    from ups.cli.follow import follow_run
    from ups.launch.config import CONFIG_DIR, PrecomputeConfig, load_config
    from ups.launch.plan import check_precompute_data, prepare_train
    from ups.launch.spawn import launch_run

    ensure_demo_data(data_root)
    demo_yaml = CONFIG_DIR / "demo.yaml"
    cfg = load_config(
        PrecomputeConfig,
        demo_yaml if demo_yaml.exists() else None,
        {"root": str(data_root), "cache_dir": str(cache_dir), "tasks": list(DEMO_TASKS), "num_workers": num_workers},
    )
    total = check_precompute_data(cfg)
    import json as jsonlib

    resolved = asdict(cfg)
    if detach:  # both stages in one detached pipeline run
        from ups.cli.launch import launch_pipeline

        launch_pipeline(root=str(data_root), tasks=[DEMO_TRAIN_TASK], cache_dir=str(cache_dir), splits=None,
                        num_workers=num_workers, nproc=DEMO_RANKS, steps=DEMO_STEPS, detach=True, runs_dir=runs_dir, json=json)
        return
    run = launch_run(
        runs_dir, "precompute",
        [sys.executable, "-m", "ups.jobs.precompute", "--config", "{RUN}/config.json"],
        argv=["ups", *sys.argv[1:]], config=resolved, thresholds=cfg.thresholds(),
        extra={"mode": "parallel" if cfg.num_workers else "legacy", "samples": total, "demo": True},
        files={"config.json": jsonlib.dumps(resolved, indent=1).encode()},
    )
    code = follow_run(run, live=False if json else None)
    if json:  # one JSON line per stage, for scripts
        typer.echo(jsonlib.dumps({"run_id": run.run_id, "run_dir": str(run.path), "kind": "precompute",
                                  "state": run.read_manifest().get("state")}))
    if code != 0 or train_steps == 0:
        raise typer.Exit(code)
    kwargs, train_cfg = prepare_train(cache_dir=str(cache_dir), tasks=[DEMO_TRAIN_TASK], config=None, nproc=DEMO_RANKS,
                              steps=train_steps, nnodes=1, node_rank=None, rdzv_endpoint=None, debug=False, inject=None,
                              resume=False, runs_dir=runs_dir)
    how = "NCCL on GPU" if train_cfg.device.startswith("cuda") else "gloo on CPU"
    typer.echo(f"\ntraining the latent operator on {cache_dir} with {DEMO_RANKS} ranks (torchrun, {how})", err=True)
    train_run = launch_run(**kwargs)
    code = follow_run(train_run, live=False if json else None)
    if json:
        typer.echo(jsonlib.dumps({"run_id": train_run.run_id, "run_dir": str(train_run.path), "kind": "train",
                                  "state": train_run.read_manifest().get("state")}))
        raise typer.Exit(code)
    if console and sys.stdin.isatty() and sys.stdout.isatty():
        from console.app import run_console

        typer.echo("opening the console on the training run (q quits; the runs stay under " f"{runs_dir})", err=True)
        run_console(runs_dir, run_id=train_run.run_id)
    raise typer.Exit(code)
