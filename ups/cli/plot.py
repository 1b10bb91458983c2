"""``ups plot``: a run's metrics series as a chart in the terminal, for people without the console."""

from __future__ import annotations

from typing import Annotated

import typer

from ups.cli.common import RunArgument, RunsDirOption, default_runs_dir
from ups.errors import UpsError

commands = typer.Typer()  # registered by ups.cli.app, the root


@commands.command("plot")
def plot_cmd(
    run: RunArgument = None,
    metric: Annotated[str, typer.Option("--metric", help="loss, lr, grad_norm, rate (steps/s), sps (samples/s), "
                                                         "tps (tokens/s), mem (GPU memory) or step_time (the median "
                                                         "step of the rank's last ~10 s, in seconds).")] = "loss",
    rank: Annotated[list[int] | None, typer.Option("--rank", help="Only this rank (repeatable); default every rank.")] = None,
    width: Annotated[int, typer.Option("--width", help="Columns (default: the terminal's, at most 80).")] = 0,
    height: Annotated[int, typer.Option("--height", help="Lines.")] = 18,
    plain: Annotated[bool, typer.Option("--plain", help="Plain characters even when plotext is installed.")] = False,
    runs_dir: RunsDirOption = default_runs_dir(),
) -> None:
    """Chart one metric of every rank over the steps (the run's metrics series: the whole
    run, with full detail at its end). Drawn with plotext when it is installed, else with
    plain characters; it fits 80 columns.

    \b
        ups plot exp7                  # loss of every rank
        ups plot exp7 --metric rate --rank 1
        ups plot exp7 --metric step_time     # from when the steps grew slower
    """
    import shutil

    from ups.plot import METRICS, first_nonfinite, plotext_chart, text_chart
    from ups.runs.rundir import resolve_run
    from ups.status.series import metric_values, read_run_series

    if metric not in METRICS:
        raise UpsError(f"--metric {metric}: not one of {', '.join(METRICS)}")
    if height < 6 or width < 0:
        raise UpsError("--height must be >= 6 and --width >= 0")
    rd = resolve_run(runs_dir, run)
    rd.read_manifest()  # a corrupt run.json is bad input: one line, exit 2
    found, problems = read_run_series(rd.path)
    wanted = {f"rank-{r}" for r in rank} if rank else None
    chosen = [(name, data) for name, data in sorted(found.items(), key=_rank_order) if wanted is None or name in wanted]
    series = {name.replace("-", " "): pairs for name, data in chosen if (pairs := metric_values(data, metric))}
    # The exact first non-finite loss (every loss is checked; the series may have missed one under load).
    exact = {name.replace("-", " "): (data.get("first_nonfinite") or {}).get("step") for name, data in chosen}
    for file, problem in problems.items():
        typer.echo(f"ups: metrics/{file}: {problem}", err=True)
    if not series:
        raise UpsError(f"run {rd.run_id} has no {metric} series yet" + (" for that rank" if wanted else "")
                       + " (a rank's series starts with its first steps)")
    cols = width or min(80, shutil.get_terminal_size((80, 24)).columns)
    bad = [f"{k} from step {exact.get(k) if metric == 'loss' and exact.get(k) is not None else s}"
           for k, v in series.items() if (s := first_nonfinite(v)) is not None]
    title = f"{rd.run_id}: {METRICS[metric]}" + (f"\nnot finite: {', '.join(bad)}" if bad else "")
    chart = None if plain else plotext_chart(series, width=cols, height=height, title=title)
    typer.echo(chart if chart is not None else text_chart(series, width=cols, height=height, title=title))


def _rank_order(item: tuple[str, dict]) -> tuple[int, str]:
    name = item[0]
    try:
        return int(name.split("-")[1]), name
    except (IndexError, ValueError):
        return 1 << 30, name
