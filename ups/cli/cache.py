"""``ups cache verify|fix``: check and repair a latent cache."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ups.cli.common import JsonOption, print_json

cache_app = typer.Typer(help="Check and repair latent caches.", no_args_is_help=True)
CacheDirArg = Annotated[Path, typer.Argument(help="Cache root (holding {task}_{split}/ folders) or one split folder.")]


@cache_app.command("verify")
def verify_cmd(cache_dir: CacheDirArg, json: JsonOption = False) -> None:
    """Completeness, unreadable or corrupt files, tensors saved on a CUDA device, hash
    mismatches, stray temp files: one line per problem, exit 1 if any."""
    from ups.data.cache import verify_cache

    problems, summary = verify_cache(cache_dir)
    if json:
        print_json({"ok": not problems, "problems": [p.__dict__ for p in problems], "splits": summary})
    else:
        for p in problems:
            typer.echo(str(p))
        for name, s in summary.items():
            typer.echo(f"{name}: {s['valid']} valid of {s['count']} ({s['present']} files"
                       + (f", {len(s['quarantined'])} quarantined" if s["quarantined"] else "") + ")", err=True)
        typer.echo(f"{len(problems)} problem(s)" if problems else "cache OK", err=True)
    if problems:
        raise typer.Exit(1)


@cache_app.command("fix")
def fix_cmd(cache_dir: CacheDirArg, json: JsonOption = False) -> None:
    """Rewrite CUDA-saved tensors to CPU and remove stray temp files (then verify again)."""
    from ups.data.cache import fix_cache

    done = fix_cache(cache_dir)
    if json:
        print_json({"fixed": done})
    else:
        for line in done:
            typer.echo(line)
        typer.echo(f"{len(done)} fix(es)", err=True)
