"""The options of ``ups launch``, defined once: each command names the ones it takes.

Only light imports here: this module is on the path of ``ups --help``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperCommand

# The program commands (torchrun, python ...): the program's own options pass through untouched.
PROGRAM_SETTINGS = {"ignore_unknown_options": True, "allow_extra_args": True, "allow_interspersed_args": False}

InjectOption = Annotated[
    list[str] | None,
    typer.Option("--inject", help="Fault to rehearse, e.g. worker_hang:worker=0,after=3 (repeatable; see the job's help)."),
]
DetachOption = Annotated[bool, typer.Option("--detach", help="Start the job and return at once.")]
ObserveOption = Annotated[bool, typer.Option("--observe-only", help="Automatic actions on processes (stack dumps of a hung process, a watchdog's kills) are logged as events, never done.")]
SkipBadShardsOption = Annotated[
    bool,
    typer.Option("--skip-bad-shards", help="Leave out shards that fail the launch check, cache the rest; the run ends "
                                           "partial (exit 3) naming them. Without it, any bad shard refuses the launch."),
]
ConfigOption = Annotated[Path | None, typer.Option("--config", help="YAML config; options given here override it.")]
RunIdOption = Annotated[str | None, typer.Option(
    "--run-id", help="The run's id (its folder's name). Across nodes: the same on every node, so that they join one "
                     "run (default there: torchrun's --rdzv-id).")]
MetricsPortOption = Annotated[str | None, typer.Option(
    "--metrics-port", metavar="[ADDRESS:]PORT",
    help="Serve this run's metrics for Prometheus (those of `ups exporter`) from the launcher on PORT, at "
         "127.0.0.1 unless ADDRESS is given, while the run lasts.")]
NameOption = Annotated[str | None, typer.Option("--name", help="Readable part of the run id (default: the script's name).")]
TotalStepsOption = Annotated[int | None, typer.Option("--total-steps", help="Optimizer steps the program will make: gives progress a total and an ETA.")]
StalledOption = Annotated[float | None, typer.Option("--stalled-after", help="Seconds without progress (heartbeat alive) before a process counts as stalled [default: 60].")]
OnHangOption = Annotated[str | None, typer.Option(
    "--on-hang", metavar="observe|dump|kill|restart",
    help="When `ups why` names a hang: observe (an event only), dump (save every stuck process's stacks; the default), "
         "kill (stacks first, then end the job), restart (stacks first, end it, run the same command again as the same "
         "run, attempt N+1, up to --max-restarts times, then end it).")]
MaxRestartsOption = Annotated[int | None, typer.Option(
    "--max-restarts", help="With --on-hang restart: restarts before giving up [default: 3]. Give it before the "
                           "torchrun options (after them it is torchrun's own, for failures).")]
RestartWindowOption = Annotated[str | None, typer.Option(
    "--restart-window", metavar="DURATION",
    help="With --on-hang restart: count --max-restarts within this window (600, 30m, 2h, 1d) rather than over the "
         "whole run. Either way a hang that comes back at the same place is not restarted, and restarts after the "
         "first wait 10 s, then 20 s, 40 s ... (back-off).")]
OnWorkerHangOption = Annotated[str | None, typer.Option(
    "--on-worker-hang", metavar="same|fallback",
    help="A hang of a DataLoader worker: same (as --on-hang), or fallback (restart with every DataLoader at "
         "num_workers=0, as `ups relaunch --num-workers 0`).")]
NotifyOption = Annotated[list[str] | None, typer.Option(
    "--notify", metavar="cmd:COMMAND|URL|mailto:ADDRESS",
    help="Tell someone when the run turns to a problem (stalled, unresponsive, dead, NaN loss ...), restarts or ends "
         "(repeatable): a shell command (message as JSON on stdin, UPS_NOTIFY_* variables), a webhook URL (JSON POST, "
         "Slack/Discord fields; ntfy), or mailto: through the SMTP server of ~/.config/ups/config.toml. Default: that "
         "file's [notify] targets.")]
UnresponsiveOption = Annotated[float | None, typer.Option("--unresponsive-after", help="Seconds without a heartbeat (pid alive) before a process counts as unresponsive [default: 10].")]
FirstProgressOption = Annotated[float | None, typer.Option(
    "--first-progress-after", help="Seconds a process may take to show its first progress (a step, a batch, a progress bar, "
                                   "a pool task, a printed k/n) before it counts as having no progress signal [default: 600]. "
                                   "Only a proven hang is acted on either way.")]


# The jobs' own options: ups launch precompute, train and pipeline (a pipeline's stages take
# theirs under the pipeline's words).
RootOption = Annotated[str | None, typer.Option("--root", help="Folder with the HDF5 shards.")]
CacheDirOption = Annotated[str | None, typer.Option("--cache-dir", help="Where the latent cache goes.")]
NumWorkersOption = Annotated[int | None, typer.Option("--num-workers", help="DataLoader workers; 0 = no worker processes.")]
LegacyOption = Annotated[bool, typer.Option("--legacy", help="Same as --num-workers 0.")]
BatchSizeOption = Annotated[int | None, typer.Option("--batch-size")]
LatentDimOption = Annotated[int | None, typer.Option("--latent-dim")]
LatentTokensOption = Annotated[int | None, typer.Option("--latent-tokens")]
CacheDtypeOption = Annotated[str | None, typer.Option("--cache-dtype", help="float16 or float32.")]
DeviceOption = Annotated[str | None, typer.Option("--device", help="cpu, cuda or auto.")]
OverwriteOption = Annotated[bool, typer.Option("--overwrite", help="Replace a cache written with another hash.")]
WorkerTimeoutOption = Annotated[float | None, typer.Option("--worker-timeout", help="Seconds before a hung worker is killed.")]
TrainCacheDirOption = Annotated[str | None, typer.Option("--cache-dir", help="Latent cache root from the precompute.")]
NprocOption = Annotated[int, typer.Option("--nproc", help="Ranks on this node.")]
StepsOption = Annotated[int | None, typer.Option("--steps", help="Optimizer steps.")]
NnodesOption = Annotated[int, typer.Option("--nnodes", help="Nodes (each runs this command with its --node-rank).")]
NodeRankOption = Annotated[int | None, typer.Option("--node-rank")]
RdzvEndpointOption = Annotated[str | None, typer.Option("--rdzv-endpoint", help="HOST:PORT of the c10d rendezvous (multi-node).")]
DebugOption = Annotated[bool, typer.Option("--debug", help="NCCL_DEBUG=INFO, TORCH_DISTRIBUTED_DEBUG=DETAIL, C++ stack traces.")]
ResumeOption = Annotated[bool, typer.Option("--resume", help="Continue from the last checkpoint.")]
PipelineWorkersOption = Annotated[int | None, typer.Option("--num-workers", help="Precompute DataLoader workers.")]
PipelineNprocOption = Annotated[int, typer.Option("--nproc", help="Training ranks.")]
PipelineStepsOption = Annotated[int | None, typer.Option("--steps", help="Training steps.")]

class PassThroughCommand(TyperCommand):
    """``ups``'s own options first; from the first token that is not one of them, everything
    passes through untouched (the user's torchrun or python line, ``--`` included)."""

    def parse_args(self, ctx, args):  # type: ignore[override]
        flags, valued = set(ctx.help_option_names), set()
        for param in self.get_params(ctx):
            if getattr(param, "param_type_name", "") == "option":  # typer vendors its own click
                (flags if param.is_flag else valued).update(param.opts)
        ours: list[str] = []
        i = 0
        while i < len(args):
            tok = args[i]
            name = tok.split("=", 1)[0]
            if tok in flags:
                ours.append(tok)
                i += 1
            elif name in valued:
                take = 1 if "=" in tok else 2
                ours.extend(args[i : i + take])
                i += take
            else:
                break
        super().parse_args(ctx, ours)
        ctx.args = list(args[i:])
        return ctx.args


def metrics_fields(metrics_port: str | None) -> dict[str, Any]:
    """run.json's ``metrics`` (checked here: a bad or taken port refuses the launch)."""
    if metrics_port is None:
        return {}
    from ups.exporter.address import check_free, parse_address

    bind, port = parse_address(metrics_port)
    check_free(bind, port)
    return {"metrics": {"bind": bind, "port": port}}


def notify_fields(notify: list[str] | None) -> dict[str, Any]:
    """run.json's ``notify`` (validated here: a bad target refuses the launch)."""
    from ups.notify import check_targets

    targets = check_targets(notify)
    return {"notify": targets} if targets else {}


def unattended_fields(*, notify: list[str] | None, metrics_port: str | None, on_hang: str | None = None,
                      max_restarts: int | None = None, on_worker_hang: str | None = None,
                      restart_window: str | None = None) -> dict[str, Any]:
    """run.json's fields for a run left alone: the on-hang policy, who is told, the metrics port
    (each checked here: a bad value refuses the launch)."""
    from ups.launch.onhang import check_options

    return {**check_options(on_hang, max_restarts, on_worker_hang, restart_window), **notify_fields(notify),
            **metrics_fields(metrics_port)}
