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
    fail,
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
    log: Annotated[str | None, typer.Option("--log", metavar="FILE",
                                            help="Read a log of a run ups did not launch (a SLURM .out, a torchrun or "
                                                 "kubectl log, a Lightning or HF Trainer capture; - for stdin) and say "
                                                 "what failed: the class, the line, the rank and the fix.")] = None,
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

    A log of a run ups did not launch: --log FILE (- for stdin) reads it as an engineer
    would (tracebacks and their causes, torchrun's report, NCCL, CUDA, kernel and SLURM lines;
    INFO lines, warnings and footers never decide) and names the root cause: a failure class
    with who, where and the fix, "your code raised X at file:line", or "no known class: the
    last error was ..." (never a guess).

    Exit codes: 0 nothing wrong, 1 a problem named, 2 bad input. --json prints
    {"run_id", "state", "verdict": {"mode", "ok", "headline", "who", "where", "since",
    "evidence", "next", "text"}}; with --log, {"log", "failed", "kind", "class", "summary",
    "line", "line_number", "rank", "site", "exception", "what", "who", "where", "fix"}.
    """
    if log is not None:
        if run or remote:
            raise fail("--log reads a log file, not a run: give one or the other")
        _why_log(log, json)
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


def _why_log(source: str, as_json: bool) -> None:
    """``ups why --log FILE``: the verdict on a log's text (ups.why.logread)."""
    import sys

    from ups.status.safeio import BadFile, read_log_file, read_log_stream
    from ups.why.logread import read_log

    try:
        text = read_log_stream(sys.stdin.buffer) if source == "-" else read_log_file(source)
    except FileNotFoundError:
        raise fail(f"--log {source}: no such file") from None
    except BadFile as exc:
        raise fail(f"--log {source}: {exc}") from None
    except OSError as exc:  # a folder on a platform where open() says so first, a permission
        raise fail(f"--log {source}: unreadable ({exc.strerror or exc})") from None
    reading = read_log(text)
    cls = reading.cls
    out = {"log": source, "failed": reading.failed, "kind": reading.kind, "class": reading.name,
           "summary": reading.summary, "line": reading.line or None,
           "line_number": None if reading.n is None else reading.n + 1, "rank": reading.rank, "site": reading.site,
           "exception": reading.exception, "what": cls.what if cls else None, "who": cls.who if cls else None,
           "where": cls.where if cls else None, "fix": reading.fix or None}
    if as_json:
        print_json(out)
    else:
        _print_log_reading(out)
    raise typer.Exit(1 if reading.failed else 0)


def _print_log_reading(out: dict) -> None:
    """The reading as a few lines of plain text: outside text (the log's line) is shown as
    text, its control characters made visible, never as markup."""
    from rich.text import Text

    from ups.status.printable import printable

    console = text_console(soft_wrap=True)
    head = f"{out['class']}: {out['summary']}" if out["class"] else out["summary"]
    console.print(Text(printable(head), style="bold red" if out["failed"] else "green"))
    if not out["failed"]:
        return
    rows = [("line", f"{out['line']}" + (f"  (line {out['line_number']} of the log)" if out["line_number"] else "")),
            ("rank", "" if out["rank"] is None else str(out["rank"])), ("site", out["site"] or ""),
            ("who", out["who"] or ""), ("look", out["where"] or ""), ("fix", out["fix"] or "")]
    for label, value in rows:
        if value:
            console.print(Text.assemble((f"  {label}: ", "bold"), printable(value)))


def _remote_view(runs_dir, run: str | None, remote: list[str], timeout: float):
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
