"""``ups why``: the verdict on a run in one paragraph."""

from __future__ import annotations

import typer

from ups.cli.app import app
from ups.cli.common import JsonOption, RunArgument, RunsDirOption, default_runs_dir, print_json


@app.command("why")
def why_cmd(
    run: RunArgument = None,
    runs_dir: RunsDirOption = default_runs_dir(),
    json: JsonOption = False,
) -> None:
    """What is wrong with a run (or "nothing: healthy"), in one paragraph: who (rank, worker,
    pid, host), where (phase and the Python frame that matters, file:line), since when, the
    evidence it rests on, and the next command to run. Works on live and ended runs.

    It reads what ups already collects: records, phases, collectives, the stack dumps the
    launcher takes when a process turns stalled or unresponsive, exit truth, torchrun's
    report, logs and events. It never signals a process.

    Exit codes: 0 nothing wrong, 1 a problem named, 2 bad input. --json prints
    {"run_id", "state", "verdict": {"mode", "ok", "headline", "who", "where", "since",
    "evidence", "next", "text"}}.
    """
    from ups.launch.reconcile import load_settled_view
    from ups.runs.rundir import resolve_run
    from ups.why import diagnose_view

    rd = resolve_run(runs_dir, run)
    rd.read_manifest()  # a corrupt run.json is bad input: one line, exit 2
    view = load_settled_view(rd)
    verdict = diagnose_view(view)
    attempts = [a for a in (view.manifest or {}).get("attempts") or [] if isinstance(a, dict)]  # --on-hang restart
    if json:
        print_json({"run_id": rd.run_id, "run_dir": str(rd.path), "state": view.state, "verdict": verdict.to_dict(),
                    "attempts": attempts})
    else:
        from rich.console import Console
        from rich.text import Text

        console = Console(highlight=False, soft_wrap=True)  # no newlines inside a command to copy
        console.print(Text.assemble((f"{rd.run_id} ({view.state}): ", "bold"),
                                    (verdict.headline, "green" if verdict.ok else "bold red")))
        rest = verdict.text()[len(verdict.headline.rstrip(".")) + 1 :].strip()
        if rest:
            console.print(Text(rest))  # plain text: gloo's messages contain [brackets]
        for a in attempts:  # each earlier attempt's own verdict (a run restarted on hang)
            console.print(Text(f"attempt {a.get('attempt')} ({a.get('ended', '?')}): "
                               f"{(a.get('verdict') or {}).get('headline', '?')}", style="dim"))
    raise typer.Exit(0 if verdict.ok else 1)
