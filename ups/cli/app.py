"""The ``ups`` command line: one Typer app per command group, combined here.

Each group lives in its own module and is thin: parse options, call the core library,
render. Heavy modules (torch, textual, wandb, h5py, pynvml) are imported inside the
commands that need them, never at module level, so ``ups --help`` stays fast.
"""

from __future__ import annotations

import sys

import typer
from typer.core import TyperGroup

from ups.cli.common import say_error
from ups.errors import UpsError


class UpsGroup(TyperGroup):
    """Turns an UpsError raised by any command into ``ups: <message>`` and its exit code."""

    def invoke(self, ctx):  # type: ignore[override]
        try:
            return super().invoke(ctx)
        except UpsError as exc:
            say_error(exc)
            raise typer.Exit(exc.exit_code) from None


app = typer.Typer(
    cls=UpsGroup,
    name="ups",
    help=(
        "Operations console for PyTorch physics-simulation jobs.\n\n"
        "Launch latent-cache precompute and torchrun training as detached jobs, watch every "
        "rank and DataLoader worker from the run's status folder, see where a hung process "
        "is stuck, and kill it or fall back to num_workers=0."
    ),
    no_args_is_help=True,
    add_completion=True,  # --install-completion / --show-completion (bash, zsh, fish, PowerShell)
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def version_text() -> str:
    """``ups X (python Y, torch Z)``: the versions a bug report needs, read from the installed
    packages' metadata (importing torch would cost seconds)."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    def of(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    return f"ups {of('ups')} (python {platform.python_version()}, torch {of('torch')})"


def _show_version(value: bool) -> None:
    if value:
        typer.echo(version_text())
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", "-V", help="Print the version of ups (and of python and torch) and exit.",
                                 callback=_show_version, is_eager=True),
) -> None:
    """Options of `ups` itself, before any command (its help text is the app's)."""


def _register() -> None:
    """Every command group, in the order `ups --help` lists them. The root knows the groups;
    no command module imports it (importing them is cheap: Typer only)."""
    from ups.cli import (
        attach,
        cache,
        console_cmd,
        control,
        data,
        demo,
        doctor,
        exporter,
        gpu,
        launch,
        plot,
        processes,
        runs,
        why,
    )

    for group in (console_cmd, control, demo, doctor, gpu, plot, runs, processes, why, exporter, attach):
        app.add_typer(group.commands)  # top-level commands: `ups runs`, `ups why` ...
    app.add_typer(launch.launch_app, name="launch")
    app.add_typer(data.data_app, name="data")
    app.add_typer(cache.cache_app, name="cache")


_register()


def main() -> None:
    """Console-script entry point: UpsError becomes one line on stderr and its exit code."""
    try:
        app()
    except UpsError as exc:  # raised outside a command's own handling
        say_error(exc)
        sys.exit(exc.exit_code)


if __name__ == "__main__":
    main()
