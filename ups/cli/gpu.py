"""``ups gpu``: devices, memory, and which run/rank holds each GPU process."""

from __future__ import annotations

import time
from typing import Annotated

import typer

from ups.cli.common import JsonOption, RunsDirOption, default_runs_dir, print_json, text_console
from ups.format import fmt_bytes

commands = typer.Typer()  # registered by ups.cli.app, the root

EXIT_NO_GPU = 1


def gpu_view(runs_dir):
    from ups.gpu import attribute, get_provider, records_for_attribution

    return attribute(get_provider().snapshot(), records_for_attribution(runs_dir))


def render_gpu(view):
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    g = view.gpu
    if not g.available:
        return Text(f"No visible devices found: {g.reason}", style="yellow")
    head = Text(f"driver {g.driver_version or '?'}  CUDA {g.cuda_driver_version or '?'}  ({g.source})")
    devs = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("GPU", "NAME", "MEMORY", "UTIL", "TEMP", "POWER"):
        devs.add_column(col, no_wrap=True)
    for d in g.devices:
        mem = f"{fmt_bytes(d.memory_used)} / {fmt_bytes(d.memory_total)}"
        devs.add_row(str(d.index), d.name or "?", mem, f"{d.utilization_gpu}%" if d.utilization_gpu is not None else "-",
                     f"{d.temperature_c}C" if d.temperature_c is not None else "-", f"{d.power_w:.0f} W" if d.power_w is not None else "-")
    procs = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("GPU", "PID", "MEMORY", "RUN / PROCESS"):
        procs.add_column(col, no_wrap=col != "RUN / PROCESS")
    for p in view.processes:
        if p.status == "run":
            who = Text(f"{p.run_id} {p.label}")
        else:
            who = Text(f"{p.note}", style="bold red" if p.status in ("orphan", "reused") else "yellow")
            if p.user or p.command:
                who.append(f"  {p.user or '?'}: {p.command or '?'}", style="dim")
        procs.add_row(str(p.device), str(p.pid), fmt_bytes(p.used_memory), who)
    parts = [head, devs, procs if view.processes else Text("no GPU processes", style="dim")]
    parts += [Text(n, style="yellow") for n in view.notes]
    return Group(*parts)


@commands.command("gpu")
def gpu_cmd(
    runs_dir: RunsDirOption = default_runs_dir(),
    json: JsonOption = False,
    watch: Annotated[bool, typer.Option("--watch", help="Redraw every second until Ctrl-C.")] = False,
) -> None:
    """GPUs (memory, utilisation, temperature, power) and their processes, each mapped to
    the run and rank or worker that owns it; processes in no run are flagged.

    Exit 1 with "No visible devices found" when there is no usable GPU (--json still prints
    the snapshot, with "available": false and the reason). UPS_FAKE_GPU=<file.json> shows a
    described GPU instead, to rehearse on a box without one.
    """
    view = gpu_view(runs_dir)
    if json:
        print_json(view.to_dict())
    elif watch:
        from rich.live import Live

        with Live(render_gpu(view), auto_refresh=False) as live:
            try:
                while True:
                    time.sleep(1.0)
                    live.update(render_gpu(gpu_view(runs_dir)), refresh=True)
            except KeyboardInterrupt:
                pass
        return
    else:

        text_console().print(render_gpu(view))
        if not view.gpu.available:
            typer.echo("hint: install the NVIDIA driver, or check CUDA_VISIBLE_DEVICES / the container's --gpus flag", err=True)
    if not view.gpu.available:
        raise typer.Exit(EXIT_NO_GPU)
