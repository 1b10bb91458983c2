"""``ups doctor``: know before launching whether this box can run the job."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ups.cli.common import JsonOption, RunsDirOption, default_runs_dir, print_json, text_console
from ups.format import HEALTH_STYLES

commands = typer.Typer()  # registered by ups.cli.app, the root

STATUS_STYLES = {"ok": HEALTH_STYLES["ok"], "warn": "yellow", "fail": "bold red", "skip": "dim"}


@commands.command("doctor")
def doctor_cmd(
    config: Annotated[Path | None, typer.Option("--config", help="Job config (YAML) whose data, cache and workers to check.")] = None,
    root: Annotated[Path | None, typer.Option("--root", help="Data folder with the HDF5 shards.")] = None,
    cache_dir: Annotated[Path | None, typer.Option("--cache-dir", help="Latent cache folder.")] = None,
    quick: Annotated[bool, typer.Option("--quick", help="Skip the subprocess probes (torch, HDF5, cache, DataLoader, DDP).")] = False,
    only: Annotated[list[str] | None, typer.Option("--only", help="Run only this check id (repeatable).")] = None,
    skip: Annotated[list[str] | None, typer.Option("--skip", help="Skip this check id (repeatable).")] = None,
    timeout_scale: Annotated[float, typer.Option("--timeout-scale", help="Multiply every check's timeout.")] = 1.0,
    runs_dir: RunsDirOption = default_runs_dir(),
    json: JsonOption = False,
) -> None:
    """Diagnose this box before a run: packages, torch/CUDA/NCCL, GPUs and memory held
    outside runs, torchrun and ports, /dev/shm, ulimit -n, disk, RAM, file systems, the
    HDF5 shards, the cache, DataLoader workers, a 2-rank DDP smoke test, W&B. Checks run
    concurrently, each bounded; hang-prone probes run in subprocesses that are killed at
    their timeout and reported as failures naming what hung.

    HDF5: every shard of every task and split found under --root (with --config, of the
    config's tasks and splits) is opened and one sample read, each within 5 s (times
    --timeout-scale); the check fails naming every shard that cannot be opened.

    Exit 0 when nothing failed (warnings allowed), 1 otherwise, 2 for bad input.

    --json: {"schema": 1, "ok", "summary": {"ok","warn","fail","skip"}, "duration_s",
    "checks": [{"id", "title", "status", "detail", "hint", "duration_s"}]}.
    """
    from ups.doctor.runner import options_from, run_doctor, select

    checks = select(only, skip)
    options = options_from(config, root, cache_dir, runs_dir, timeout_scale)
    report = run_doctor(options, checks, quick=quick)
    if json:
        print_json(report.to_dict())
    else:
        from rich.table import Table
        from rich.text import Text

        table = Table(box=None, header_style="bold", pad_edge=False, show_lines=False)
        for col in ("CHECK", "STATUS", "DETAIL", "TIME"):
            table.add_column(col, no_wrap=col in ("CHECK", "STATUS", "TIME"))
        for r in report.results:
            detail = Text(r.detail)
            if r.hint and r.status in ("warn", "fail"):
                detail.append(f"\n→ {r.hint}", style="cyan")
            table.add_row(r.id, Text(r.status, STATUS_STYLES[r.status]), detail, f"{r.duration_s:.1f}s")
        console = text_console()
        console.print(table)
        s = report.summary()
        console.print(f"{s['ok']} ok, {s['warn']} warn, {s['fail']} fail, {s['skip']} skip in {report.duration_s:.1f} s")
    if not report.ok:
        raise typer.Exit(1)
