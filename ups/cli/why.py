"""``ups why``: the verdict on a run in one paragraph."""

from __future__ import annotations

from typing import Annotated

import typer

from ups.cli.common import (
    JsonOption,
    RemoteOption,
    RunArgument,
    RunsDirOption,
    default_runs_dir,
    print_json,
    text_console,
)

commands = typer.Typer()  # registered by ups.cli.app, the root


@commands.command("why")
def why_cmd(
    run: RunArgument = None,
    runs_dir: RunsDirOption = default_runs_dir(),
    json: JsonOption = False,
    remote: RemoteOption = None,
    remote_timeout: Annotated[float, typer.Option("--remote-timeout", help="Seconds to wait for each --remote node's first "
                                                                           "snapshot; a node silent longer is unreachable.")] = 10.0,
) -> None:
    """What is wrong with a run (or "nothing: healthy"), in one paragraph: who (rank, worker,
    pid, host), where (phase and the Python frame that matters, file:line), since when, the
    evidence it rests on, and the next command to run. Works on live and ended runs.

    It reads what ups already collects: records, phases, collectives, the stack dumps the
    launcher takes when a process turns stalled or unresponsive, exit truth, torchrun's
    report, logs and events. It never signals a process.

    A run across nodes without a shared runs folder: --remote NODE for each other node, read
    over SSH as `ups status --remote` reads it; a node that cannot be reached (or was never
    heard from) is named first.

    Exit codes: 0 nothing wrong, 1 a problem named, 2 bad input. --json prints
    {"run_id", "state", "verdict": {"mode", "ok", "headline", "who", "where", "since",
    "evidence", "next", "text"}}.
    """
    from ups.runs.read import open_run
    from ups.runs.rundir import resolve_run
    from ups.why import diagnose_view

    if remote:
        view = _remote_view(runs_dir, run, remote, remote_timeout)
        rd = view.run
        run_id = view.run_id
    else:
        rd = resolve_run(runs_dir, run)
        rd.read_manifest()  # a corrupt run.json is bad input: one line, exit 2
        view = open_run(rd)
        run_id = rd.run_id
    verdict = diagnose_view(view)
    attempts = [a for a in (view.manifest or {}).get("attempts") or [] if isinstance(a, dict)]  # --on-hang restart
    if json:
        print_json({"run_id": run_id, "run_dir": str(rd.path), "state": view.state, "verdict": verdict.to_dict(),
                    "attempts": attempts})
    else:
        from rich.text import Text

        console = text_console(soft_wrap=True)  # no newlines inside a command to copy
        console.print(Text.assemble((f"{run_id} ({view.state}): ", "bold"),
                                    (verdict.headline, "green" if verdict.ok else "bold red")))
        rest = verdict.text()[len(verdict.headline.rstrip(".")) + 1 :].strip()
        if rest:
            console.print(Text(rest))  # plain text: gloo's messages contain [brackets]
        for a in attempts:  # each earlier attempt's own verdict (a run restarted on hang)
            console.print(Text(f"attempt {a.get('attempt')} ({a.get('ended', '?')}): "
                               f"{(a.get('verdict') or {}).get('headline', '?')}", style="dim"))
    raise typer.Exit(0 if verdict.ok else 1)


def _remote_view(runs_dir, run: str | None, remote: list[str], timeout: float):  # noqa: ANN001, ANN202
    """This node's records (if it has the run) and every --remote node's, read over SSH."""
    from ups.errors import RunNotFound, UpsError
    from ups.runs.read import open_run
    from ups.runs.remote import RemoteSpec, open_sources, stop_sources
    from ups.runs.rundir import resolve_run

    specs = [RemoteSpec.parse(r) for r in remote]
    try:
        rd = resolve_run(runs_dir, run)
        rd.read_manifest()
    except (RunNotFound, UpsError):
        if not run:
            raise
        rd = None  # none of the run's nodes is this host: every node is read remotely
    run_id = run if rd is None else rd.run_id
    sources = open_sources(specs, run_id, silent_after=timeout)
    try:
        import time

        deadline = time.monotonic() + timeout
        for src in sources:
            src.wait_first(max(0.0, deadline - time.monotonic()))
        return open_run(rd, remotes=sources, run_id=run_id)
    finally:
        stop_sources(sources)
