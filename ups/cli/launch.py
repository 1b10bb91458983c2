"""``ups launch precompute|train|pipeline|torchrun|python|...``: write the run folder, start the job detached.

Inputs are checked before anything starts (config keys and values, data shards, fault
names): bad input is one line and exit 2, and leaves no run folder behind.
"""

from __future__ import annotations

import inspect
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
from ups.cli.launch_options import (
    PROGRAM_SETTINGS,
    BatchSizeOption,
    CacheDirOption,
    CacheDtypeOption,
    ConfigOption,
    DebugOption,
    DetachOption,
    DeviceOption,
    FirstProgressOption,
    InjectOption,
    LatentDimOption,
    LatentTokensOption,
    LegacyOption,
    MaxRestartsOption,
    MetricsPortOption,
    NameOption,
    NnodesOption,
    NodeRankOption,
    NotifyOption,
    NprocOption,
    NumWorkersOption,
    ObserveOption,
    OnHangOption,
    OnWorkerHangOption,
    OverwriteOption,
    PassThroughCommand,
    PipelineNprocOption,
    PipelineStepsOption,
    PipelineWorkersOption,
    RdzvEndpointOption,
    RestartWindowOption,
    ResumeOption,
    RootOption,
    RunIdOption,
    SkipBadShardsOption,
    StalledOption,
    StepsOption,
    TotalStepsOption,
    TrainCacheDirOption,
    UnresponsiveOption,
    WorkerTimeoutOption,
    metrics_fields,
    notify_fields,
    unattended_fields,
)
from ups.errors import UpsError
from ups.launch.plan import (
    check_precompute_data,
    precompute_command,
    prepare_train,
    validate_launch_faults,
)

launch_app = typer.Typer(
    help="Start a job detached from this terminal and follow it (Ctrl-C stops following only).",
    no_args_is_help=True,
)

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


@launch_app.command("precompute")
def launch_precompute(
    root: RootOption = None,
    tasks: Annotated[list[str] | None, tasks_option("Task(s): advection1d, burgers1d, darcy2d.")] = None,
    splits: Annotated[list[str] | None, splits_option()] = None,
    cache_dir: CacheDirOption = None,
    config: ConfigOption = None,
    num_workers: NumWorkersOption = None,
    legacy: LegacyOption = False,
    batch_size: BatchSizeOption = None,
    latent_dim: LatentDimOption = None,
    latent_tokens: LatentTokensOption = None,
    cache_dtype: CacheDtypeOption = None,
    device: DeviceOption = None,
    overwrite: OverwriteOption = False,
    worker_timeout: WorkerTimeoutOption = None,
    skip_bad_shards: SkipBadShardsOption = False,
    inject: InjectOption = None,
    observe_only: ObserveOption = False,
    notify: NotifyOption = None,
    metrics_port: MetricsPortOption = None,
    detach: DetachOption = False,
    runs_dir: RunsDirOption = default_runs_dir(),
    json: JsonOption = False,
) -> None:
    """Encode HDF5 fields into a latent cache, with workers watched for hangs.

    A worker that hangs (stalled or unresponsive past --worker-timeout) gets its stacks
    dumped and is killed; its sample is retried, and quarantined after two failures. After
    repeated worker failures the job falls back to num_workers=0. A rerun resumes: cached
    samples are skipped.

    Before anything starts, every shard of every task and split is opened in a separate
    process that is killed if it hangs (config key shard_open_timeout, default 5 s each; all
    shards at once). A missing, corrupt or unreadable shard, a FIFO, or a file on a hung
    network mount refuses the launch (exit 2, every bad shard named, no run folder).
    --skip-bad-shards leaves them out instead: the rest is cached and the run ends partial
    (exit 3) naming them. A cache made without some shards gets its own hash: a later run
    with every shard refuses to mix with it (--overwrite rebuilds it).

    Faults (--inject): worker_hang[:worker=W,after=N|sample=I,mode=sleep|gil|stop],
    worker_crash[:worker=W,after=N,signal=SEGV], slow_read[:delay=S], write_enospc[:after=N],
    write_hang[:after=N] (with writer processes the job fails after write_timeout),
    shard_probe_hang:file=NAME (the launch check's open of NAME never returns, as on a hung mount).

    Exit codes (when following): 0 succeeded, 3 partial (quarantined samples or skipped
    shards), 1 failed or killed, 2 bad input.
    """
    from ups.faults import PRECOMPUTE_FAULTS as KNOWN_FAULTS
    from ups.launch.config import PrecomputeConfig, load_config
    from ups.launch.spawn import launch_run

    overrides = {
        "root": root, "tasks": tasks, "splits": splits, "cache_dir": cache_dir,
        "num_workers": 0 if legacy else num_workers, "batch_size": batch_size, "latent_dim": latent_dim,
        "latent_tokens": latent_tokens, "cache_dtype": cache_dtype, "device": device,
        "overwrite": overwrite or None, "worker_timeout": worker_timeout,
    }
    cfg = load_config(PrecomputeConfig, config, overrides)
    faults, launch_faults = validate_launch_faults(inject, KNOWN_FAULTS)
    total = check_precompute_data(cfg, skip_bad=skip_bad_shards, faults=launch_faults)
    from dataclasses import asdict

    resolved = asdict(cfg)
    run = launch_run(
        runs_dir, "precompute", precompute_command(cfg, config),
        argv=["ups", *sys.argv[1:]], config=resolved, env={"UPS_FAULTS": faults} if faults else {},
        thresholds=cfg.thresholds(), extra={"mode": "legacy" if cfg.num_workers == 0 else "parallel", "samples": total,
                                            **notify_fields(notify), **metrics_fields(metrics_port)},
        files={"config.json": jsonlib.dumps(resolved, indent=1).encode()}, observe_only=observe_only,
    )
    start_and_follow(run, detach=detach, json_out=json)


@launch_app.command("train")
def launch_train(
    cache_dir: TrainCacheDirOption = None,
    tasks: Annotated[list[str] | None, tasks_option("Task(s) whose caches to train on, one task per step.")] = None,
    config: ConfigOption = None,
    nproc: NprocOption = 2,
    steps: StepsOption = None,
    nnodes: NnodesOption = 1,
    node_rank: NodeRankOption = None,
    rdzv_endpoint: RdzvEndpointOption = None,
    run_id: RunIdOption = None,
    debug: DebugOption = False,
    resume: ResumeOption = False,
    inject: InjectOption = None,
    observe_only: ObserveOption = False,
    notify: NotifyOption = None,
    on_hang: OnHangOption = None,
    max_restarts: MaxRestartsOption = None,
    metrics_port: MetricsPortOption = None,
    restart_window: RestartWindowOption = None,
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

    \b
    Several nodes: the same command on each, with its own --node-rank:
        ups launch train --nnodes 2 --node-rank 0 --rdzv-endpoint HOST0:29400 --run-id exp7 ...
        ups launch train --nnodes 2 --node-rank 1 --rdzv-endpoint HOST0:29400 --run-id exp7 ...
    """
    from ups.launch.spawn import launch_run

    unattended = unattended_fields(notify=notify, metrics_port=metrics_port, on_hang=on_hang, max_restarts=max_restarts,
                                   restart_window=restart_window)
    kwargs, _ = prepare_train(cache_dir=cache_dir, tasks=tasks, config=config, nproc=nproc, steps=steps, nnodes=nnodes,
                              node_rank=node_rank, rdzv_endpoint=rdzv_endpoint, debug=debug, inject=inject, resume=resume,
                              runs_dir=runs_dir, run_id=run_id)
    kwargs["extra"].update(unattended)
    if unattended.get("on_hang") == "restart" and not resume:
        # A restarted attempt resumes from its own checkpoints, as under torchrun's --max-restarts.
        kwargs["config"]["resume"] = True
        kwargs["files"]["config.json"] = jsonlib.dumps(kwargs["config"], indent=1).encode()
    start_and_follow(launch_run(**kwargs, observe_only=observe_only), detach=detach, json_out=json)


@launch_app.command("pipeline")
def launch_pipeline(
    root: RootOption,
    tasks: Annotated[list[str], tasks_option("Task(s) to precompute and train on.")],
    cache_dir: CacheDirOption,
    splits: Annotated[list[str] | None, splits_option()] = None,
    num_workers: PipelineWorkersOption = None,
    nproc: PipelineNprocOption = 2,
    steps: PipelineStepsOption = None,
    skip_bad_shards: SkipBadShardsOption = False,
    notify: NotifyOption = None,
    detach: DetachOption = False,
    runs_dir: RunsDirOption = default_runs_dir(),
    json: JsonOption = False,
) -> None:
    """Precompute, then train on the new cache, stopping at the first failure.

    The pipeline is a run of its own ("pipeline") whose stages are runs too (`ups runs`
    lists all three, each stage naming its parent), so each stage keeps its own status,
    stacks and logs.

    Every shard is checked before anything starts, as `ups launch precompute` does: a bad
    shard refuses the launch (exit 2, every bad shard named), or with --skip-bad-shards is
    left out; the precompute stage then ends partial naming it, and training goes on with
    the rest of the cache.
    """
    from dataclasses import asdict

    from ups.launch.config import PrecomputeConfig, load_config
    from ups.launch.spawn import launch_run

    pre = load_config(PrecomputeConfig, None, {"root": root, "tasks": tasks, "splits": splits, "cache_dir": cache_dir,
                                               "num_workers": num_workers})
    check_precompute_data(pre, skip_bad=skip_bad_shards)
    _, train_cfg = prepare_train(cache_dir=cache_dir, tasks=tasks, config=None, nproc=nproc, steps=steps, nnodes=1,
                                 node_rank=None, rdzv_endpoint=None, debug=False, inject=None, resume=False, runs_dir=runs_dir,
                                 require_cache=False)
    plan = {"precompute": asdict(pre), "train": asdict(train_cfg), "nproc": nproc, "runs_dir": str(runs_dir)}
    run = launch_run(
        runs_dir, "pipeline", [sys.executable, "-m", "ups.jobs.pipeline", "{RUN}/pipeline.json"],
        argv=["ups", *sys.argv[1:]], config=plan, thresholds={"phase_stalled_after": {"precompute": None, "train": None}},
        files={"pipeline.json": jsonlib.dumps(plan, indent=1).encode()}, extra=notify_fields(notify),
    )
    start_and_follow(run, detach=detach, json_out=json)


def launch_program(ctx: typer.Context, launcher: str, *, name: str | None, total_steps: int | None, detach: bool,
                   runs_dir: Path, json_out: bool, stalled_after: float | None, unresponsive_after: float | None,
                   observe_only: bool = False, run_id: str | None = None, unattended: dict[str, Any] | None = None,
                   first_progress_after: float | None = None, inject: list[str] | None = None) -> None:
    from ups.launch import programs
    from ups.launch.spawn import launch_run

    line_args = list(ctx.args)
    if not line_args:
        raise UpsError(f"nothing to run: give your {launcher} line after `ups launch {launcher}` "
                       f"(e.g. `ups launch {launcher} {'--nproc-per-node 2 ' if launcher == 'torchrun' else ''}train.py`)")
    if total_steps is not None and total_steps < 1:
        raise UpsError("--total-steps must be >= 1")
    thresholds: dict[str, Any] = {"phase_stalled_after": {"agent": None, "helper": None}}
    for key, value in (("stalled_after", stalled_after), ("unresponsive_after", unresponsive_after),
                       ("first_progress_after", first_progress_after)):
        if value is not None:
            if value <= 0:
                raise UpsError(f"--{key.replace('_', '-')} must be > 0 seconds")
            thresholds[key] = value
    if launcher == "torchrun":
        line = programs.parse_torchrun(line_args)
        top_role = "agent"
        extra: dict[str, Any] = {"world_size": programs.world_size(line), "nproc": line.values.get("nproc_per_node"),
                                 "nnodes": line.values.get("nnodes") or 1}
        multinode = programs.multinode(line)
        if multinode is not None:
            run_id = run_id or line.values.get("rdzv_id")
            if not run_id:
                raise UpsError("a run across nodes needs the same run id on every node: give --run-id ID before the "
                               "torchrun options, or torchrun's --rdzv-id ID")
        command = programs.torchrun_command(line, rdzv_id=run_id if multinode is not None else None)
    elif launcher in programs.OTHER_LAUNCHERS:
        line = programs.parse_other(launcher, line_args)
        top_role = str(programs.OTHER_LAUNCHERS[launcher]["top_role"])
        extra = {"world_size": programs.other_world_size(line)}
        multinode = None
        try:
            nodes = int(line.values.get("nodes") or 1)
        except ValueError:
            nodes = 1
        if nodes > 1 and launcher != "srun":
            # One launcher per node, each started on its node: one run, a node manifest each.
            if not run_id:
                raise UpsError(f"a run across nodes needs the same run id on every node: give --run-id ID before "
                               f"the {launcher} options")
            node_rank = line.values.get("node_rank")
            multinode = {"nnodes": nodes, "node_rank": int(node_rank) if node_rank and node_rank.isdigit() else None,
                         "rdzv_endpoint": line.values.get("endpoint")}
        command = [*programs.launcher_executable(launcher), *line_args]
    else:
        multinode = None
        line = programs.parse_python(line_args)
        command = [programs.python_executable(), *line_args]
        top_role = "rank"
        extra = {"world_size": 1}
    programs.check_script(line)
    extra["program"] = {"launcher": launcher, "line": line_args, "target": line.target, "args": line.args}
    extra.update(unattended or {})
    env = {"UPS_TOTAL_STEPS": str(total_steps)} if total_steps else {}
    if inject:
        from ups.faults import PROGRAM_FAULTS, validate_faults

        env["UPS_FAULTS"] = validate_faults(inject, PROGRAM_FAULTS)
    run = launch_run(runs_dir, launcher, command, argv=["ups", *sys.argv[1:]], env=env, extra=extra,
                     name=name or line.name, instrument=top_role, thresholds=thresholds, observe_only=observe_only,
                     run_id=run_id, multinode=multinode)
    start_and_follow(run, detach=detach, json_out=json_out)


def _program_command(launcher: str, usage: str, doc: str, *, run_id_option: bool = True):
    """``ups launch torchrun|python|accelerate|deepspeed|srun``: ups's options (one signature for all),
    then the program's line as given. ``run_id_option=False`` leaves --run-id out (one process, one node)."""

    def command(
        ctx: typer.Context,
        name: NameOption = None,
        total_steps: TotalStepsOption = None,
        stalled_after: StalledOption = None,
        unresponsive_after: UnresponsiveOption = None,
        first_progress_after: FirstProgressOption = None,
        observe_only: ObserveOption = False,
        notify: NotifyOption = None,
        on_hang: OnHangOption = None,
        max_restarts: MaxRestartsOption = None,
        restart_window: RestartWindowOption = None,
        on_worker_hang: OnWorkerHangOption = None,
        metrics_port: MetricsPortOption = None,
        inject: InjectOption = None,
        run_id: RunIdOption = None,
        detach: DetachOption = False,
        runs_dir: RunsDirOption = default_runs_dir(),
        json: JsonOption = False,
    ) -> None:
        launch_program(ctx, launcher, name=name, total_steps=total_steps, detach=detach, runs_dir=runs_dir,
                       json_out=json, stalled_after=stalled_after, unresponsive_after=unresponsive_after,
                       first_progress_after=first_progress_after, observe_only=observe_only, run_id=run_id,
                       inject=inject, unattended=unattended_fields(notify=notify, metrics_port=metrics_port, on_hang=on_hang,
                                                    max_restarts=max_restarts, on_worker_hang=on_worker_hang,
                                                    restart_window=restart_window))

    command.__doc__ = doc
    command.__name__ = f"launch_{launcher}"
    if not run_id_option:  # typer reads the options from the signature: this command has no --run-id
        signature = inspect.signature(command, eval_str=True)
        command.__signature__ = signature.replace(  # type: ignore[attr-defined]
            parameters=[p for p in signature.parameters.values() if p.name != "run_id"])
    launch_app.command(launcher, cls=PassThroughCommand, context_settings=PROGRAM_SETTINGS,
                       options_metavar=f"[UPS OPTIONS] {usage}")(command)
    return command


launch_torchrun = _program_command("torchrun", "[TORCHRUN OPTIONS] SCRIPT|-m MODULE [ARGS]...", """\
Run your own torchrun line, unchanged, watched by ups: put `ups launch` in front of it.

\b
    torchrun --nproc-per-node 2 train.py --lr 3e-4
    ups launch torchrun --nproc-per-node 2 train.py --lr 3e-4

ups's options (below) go first; from the first torchrun option on, everything passes to
torchrun untouched, `--` included. torchrun gets --standalone when you gave no
rendezvous option (a busy port 29500 never matters), and its --log-dir, --redirects and
--tee inside the run when you gave none.

No code change: every Python process of the job (torchrun's agent, each rank, each
DataLoader worker, any helper) gets a status record, stack dumps (`ups stacks`), phases
(dist.init, ddp.wrap, data, train, checkpoint, collective:<op> ...), progress (optimizer
steps) and, on an uncaught exception, the error and file:line (also as torchrun's error
file). The run succeeds only when torchrun exits 0 and every rank ended normally; a rank
that leaves with os._exit or a signal while its peers run is named as the root cause.
UPS_INSTRUMENT=0 turns the instrumentation off.

Rehearse a straggler with no code change (--inject, repeatable): slow_step:rank=R,ms=M,after=S
(M ms more CPU work per step on rank R, from S s after its first step), slow_sample:rank=R,ms=M,after=S
(its DataLoader workers M ms slower per sample), pause:rank=R,s=S,after=A (once).

Several nodes (c10d rendezvous): the same line on every node, each with its
--node-rank, joins one run named by --run-id (or torchrun's --rdzv-id); each node
has its own launcher and node manifest. With a shared runs folder, `ups status
exp7` on any node shows every node; without one, `ups status exp7 --remote node1`
reads the other node over SSH.

\b
    ups launch torchrun --run-id exp7 --nnodes 2 --node-rank 0 --rdzv-backend c10d \\
        --rdzv-endpoint node0:29400 --nproc-per-node 8 train.py

Exit codes (when following): 0 succeeded, 1 failed or killed, 2 bad input.
""")

launch_python = _program_command("python", "[PYTHON OPTIONS] SCRIPT|-m MODULE [ARGS]...", """\
Run your own python line (a data script, a single-GPU training), watched by ups.

\b
    python prepare.py --split train
    ups launch python prepare.py --split train

The `python` your shell would run is used, in this folder, with your environment. Every
Python process of the job reports (the script, each DataLoader worker, any helper) with
no code change; see `ups launch torchrun --help`. `ups relaunch RUN --num-workers 0`
reruns it with every DataLoader loading in the main process.

Exit codes (when following): 0 succeeded, 1 failed or killed, 2 bad input.
""", run_id_option=False)

launch_accelerate = _program_command("accelerate", "launch [ACCELERATE OPTIONS] SCRIPT [ARGS]...", """\
Run your own `accelerate launch` line, watched by ups: put `ups launch` in front of it.

\b
    accelerate launch --multi_gpu --num_processes 2 train.py
    ups launch accelerate launch --multi_gpu --num_processes 2 train.py

accelerate's launcher (torch's elastic agent, in its own process) is shown as the agent,
each process it starts as its rank, with their DataLoader workers, steps, phases and
collectives, as under `ups launch torchrun`. Several machines: the same line on each
(--num_machines, --machine_rank, --main_process_ip), with the same --run-id.
A single-process `accelerate launch` is plainer as `ups launch python train.py`.

Exit codes (when following): 0 succeeded, 1 failed or killed, 2 bad input.
""")

launch_deepspeed = _program_command("deepspeed", "[DEEPSPEED OPTIONS] SCRIPT [ARGS]...", """\
Run your own `deepspeed` line, watched by ups: put `ups launch` in front of it.

\b
    ups launch deepspeed --num_gpus 2 train.py --deepspeed ds_config.json

DeepSpeed's runner is shown as the agent, its per-node launcher as a helper and each
process with RANK as its rank. Several nodes (a hostfile, pdsh): the other nodes' ranks
are started by pdsh outside ups; run each node's ranks with `ups launch torchrun` instead
(DeepSpeed takes torchrun's environment), the same --run-id on every node.

Exit codes (when following): 0 succeeded, 1 failed or killed, 2 bad input.
""")

launch_srun = _program_command("srun", "[SRUN OPTIONS] PROGRAM [ARGS]...", """\
Run your own `srun` line inside a SLURM allocation, watched by ups.

\b
    ups launch srun -n 4 python train.py

Each task srun starts is a rank by its SLURM_PROCID (world size SLURM_NTASKS), until its
process group says otherwise. Tasks on other nodes report into the same runs folder, so it
must be on a shared file system (--runs-dir or UPS_RUNS_DIR); this node's launcher decides
the run's end. A torchrun per node (`srun --ntasks-per-node 1 ups launch torchrun --run-id
$SLURM_JOB_ID --nnodes $SLURM_NNODES --node-rank $SLURM_NODEID --rdzv-backend c10d
--rdzv-endpoint HEAD:29400 ...`) gives each node a launcher of its own instead.

Exit codes (when following): 0 succeeded, 1 failed or killed, 2 bad input.
""")
