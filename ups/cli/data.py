"""``ups data synth``: make PDEBench-layout HDF5 data with real PDE solutions."""

from __future__ import annotations

from typing import Annotated

import typer

from ups.cli.common import JsonOption, print_json
from ups.errors import UpsError

data_app = typer.Typer(help="Data in the stack's PDEBench layout.", no_args_is_help=True)


@data_app.command("synth")
def synth_cmd(
    task: Annotated[str, typer.Option("--task", help="advection1d, burgers1d or darcy2d.")],
    root: Annotated[str, typer.Option("--root", help="Folder to write the shards into.")],
    split: Annotated[str, typer.Option("--split", help="train, val or test.")] = "train",
    samples: Annotated[int, typer.Option("--samples", help="Number of samples.")] = 64,
    seed: Annotated[int, typer.Option("--seed", help="Same seed, same bytes.")] = 0,
    shards: Annotated[int, typer.Option("--shards", help="Split the samples over this many files.")] = 1,
    timesteps: Annotated[int, typer.Option("--timesteps", help="Time steps per sample (1D tasks).")] = 16,
    resolution: Annotated[int, typer.Option("--resolution", help="Grid points (2D tasks use half per side).")] = 64,
    json: JsonOption = False,
) -> None:
    """Write real solutions: advection (exact shifted profile), Burgers (pseudo-spectral,
    viscous), Darcy (elliptic solve). Files {task}_{split}[_NNN].h5 with datasets data,
    params, bc, plus a {task}_{split}.index.json manifest."""
    from ups.data.synth import synthesize

    if samples < 1 or shards < 1 or shards > samples:
        raise UpsError(f"--samples {samples} --shards {shards}: need samples >= shards >= 1")
    if timesteps < 2 or resolution < 8:
        raise UpsError("--timesteps must be >= 2 and --resolution >= 8")
    result = synthesize(root, task, split, samples, seed=seed, shards=shards, timesteps=timesteps,
                        resolution=resolution, progress=lambda m: typer.echo(m, err=True))
    if json:
        print_json({"task": result.task, "split": result.split, "samples": result.samples,
                    "files": list(result.files), "sample_shape": list(result.sample_shape), "manifest": result.manifest})
    else:
        typer.echo(f"{result.samples} {task}/{split} samples of shape {result.sample_shape} in {len(result.files)} file(s) under {root}")
