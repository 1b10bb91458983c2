"""Options and helpers shared by every command group.

Only light imports here: this module is on the path of ``ups --help``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

DEFAULT_RUNS_DIR = "runs"

RunsDirOption = Annotated[
    Path,
    typer.Option(
        "--runs-dir",
        envvar="UPS_RUNS_DIR",
        help="Root folder that holds one folder per run.",
        show_default=True,
    ),
]
JsonOption = Annotated[
    bool, typer.Option("--json", help="Print machine-readable JSON on stdout instead of a table.")
]
RunArgument = Annotated[
    str | None,
    typer.Argument(
        help="Run id, unique id prefix, or path to a run folder. Defaults to the newest run.",
        show_default=False,
    ),
]


def default_runs_dir() -> Path:
    return Path(os.environ.get("UPS_RUNS_DIR", DEFAULT_RUNS_DIR))


def print_json(obj: Any) -> None:
    """Write one JSON document to stdout (data goes to stdout, diagnostics to stderr)."""
    sys.stdout.write(json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")
    sys.stdout.flush()


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print ``ups: <message>`` on stderr and return an Exit to raise."""
    say_error(message)
    return typer.Exit(code)


def say_error(message: object) -> None:
    """``ups: <message>`` on stderr, one line: an error may quote a path or a value from a
    runs folder, so its control characters are shown, never sent."""
    from ups.status.printable import printable

    typer.echo(f"ups: {printable(str(message))}", err=True)


def text_console(stderr: bool = False, **kwargs: Any):  # rich is imported lazily
    """A Rich console for the CLI's tables and verdicts: strings are text, never markup or
    emoji codes (a run's name or a record's phase may hold ``[link=...]``), and no
    highlighting. Styles come only from ``Text`` objects that ups builds."""
    from rich.console import Console

    return Console(stderr=stderr, markup=False, emoji=False, highlight=False, **kwargs)


def cli_actor() -> str:
    """``cli:<user>``: who acted, for a run's event log."""
    import getpass

    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return f"cli:{user}"


def comma_list(values: list[str] | None) -> list[str] | None:
    """``--tasks a,b`` as well as ``--tasks a --tasks b`` (and both mixed)."""
    if values is None:
        return None
    items = [v.strip() for value in values for v in value.split(",") if v.strip()]
    if not items:
        raise typer.BadParameter("names nothing (give a name, or a comma list: a,b)")
    return items


def _complete(names: tuple[str, ...]):
    """Shell completion of a comma list: completes the name after the last comma."""

    def complete(incomplete: str) -> list[str]:
        head, _, last = incomplete.rpartition(",")
        done = set(head.split(",")) if head else set()
        return [f"{head},{n}" if head else n for n in names if n.startswith(last) and n not in done]

    return complete


def tasks_option(help: str, **kwargs: Any) -> Any:
    """``--tasks``: repeatable or a comma list, task names completed by the shell."""
    from ups.data.tasks import TASKS

    return typer.Option("--tasks", help=f"{help} Repeat it or give a comma list: advection1d,darcy2d.",
                        callback=comma_list, autocompletion=_complete(tuple(TASKS)), **kwargs)


def splits_option(help: str = "Split(s): train, val, test.", **kwargs: Any) -> Any:
    """``--splits``: repeatable or a comma list (train,val)."""
    from ups.data.tasks import SPLITS

    return typer.Option("--splits", help=f"{help} Repeat it or give a comma list: train,val.",
                        callback=comma_list, autocompletion=_complete(SPLITS), **kwargs)


def remote_option(help: str) -> Any:
    """``--remote HOST[:RUNS_DIR]`` (repeatable): another node of a multi-node run, over SSH; ``help`` says
    what the command does there."""
    return typer.Option("--remote", metavar="HOST[:RUNS_DIR]", help=help)


RemoteOption = Annotated[list[str] | None, remote_option("Another node of a multi-node run, read over SSH: HOST or HOST:RUNS_DIR (repeatable). "
                                  "Runs `ssh HOST ups status RUN --json --follow` there (UPS_SSH: the ssh command; "
                                  "UPS_REMOTE_UPS: the ups command there).")]

WideOption = Annotated[
    bool, typer.Option("--wide", help="Every column whole, one line per row however long (for a pipe or a wide terminal).")
]
RankOption = Annotated[int | None, typer.Option("--rank", "-r", help="Rank to target (default: see command).")]
WorkerOption = Annotated[
    int | None, typer.Option("--worker", "-w", help="DataLoader worker id of that rank (rank 0 if no --rank).")
]
