"""The read commands' tables: one line per run or process at the terminal's width, every
reason kept (after the table when it does not fit, or in the row with --wide). Outside text
reaches the screen only as Rich ``Text`` through the CLI's text console (never markup).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ups.cli.common import (
    text_console,
)
from ups.format import (
    HEALTH_STYLES,
    STATE_STYLES,
    fmt_age,
    fmt_attempt,
    fmt_bytes,
    fmt_duration,
    fmt_metric,
    fmt_progress,
    fmt_rate,
    fmt_straggler,
    slurm_line,
)

if TYPE_CHECKING:  # the run/status modules load only when a command runs (fast --help)
    from rich.text import Text

    from ups.runs.view import NodeView, ProcessView, RunView
    from ups.status.record import StatusRecord


def one_line(text: Text) -> Text:
    """A cell that is cut short with an ellipsis instead of wrapping onto more lines."""
    text.no_wrap, text.overflow = True, "ellipsis"
    return text


def print_fitted(renderable, *, wide: bool) -> None:
    """Print at the terminal's width (80 in a pipe); --wide: as wide as the content needs,
    one line per row however long (a terminal folds it, a pipe or a file keeps it)."""
    console = text_console()
    if wide:
        console.width = max(console.width, _natural_width(console, renderable))
    console.print(renderable)


def _natural_width(console, renderable) -> int:
    from rich.measure import Measurement

    return Measurement.get(console, console.options.update(width=10_000), renderable).maximum


def _gpu_cell(p: ProcessView, nvml: dict[int, int]) -> str:
    g = p.record.gpu
    used = nvml.get(p.record.pid)
    parts = []
    if g is not None and g.allocated is not None:
        parts.append(f"{fmt_bytes(g.allocated)} alloc")
        if g.peak is not None:
            parts.append(f"{fmt_bytes(g.peak)} peak")
    if used is not None:
        parts.append(f"{fmt_bytes(used)} nvml")
    return ", ".join(parts) or "-"


def short_label(r: StatusRecord) -> str:
    """'launcher', 'rank 0', '  worker 3' (workers listed under their rank)."""
    return f"  worker {r.worker}" if r.role == "worker" else r.label


def _health_cell(p: ProcessView, *, reason: bool):
    from rich.text import Text

    h = p.verdict.health.value
    return one_line(Text.assemble((h, HEALTH_STYLES.get(h, "")), (f" {p.verdict.reason}" if reason else "", "dim")))


def _progress_cell(r: StatusRecord) -> str:
    """'-' for a process that has no progress to show (the launcher supervises, it counts nothing)."""
    return "-" if r.role == "launcher" else fmt_progress(r.step, r.total)


def _has_training_metrics(view: RunView) -> bool:
    return any("loss" in p.record.metrics for p in view.processes)


def process_table(view: RunView, nvml: dict[int, int], *, reasons: bool, wide: bool = False):
    """One row per process, every cell on one line. Without ``reasons`` (a narrow terminal)
    the HEALTH column holds the word alone and never gives way; rates drop their unit (the
    header line has it) and the other long cells are cut short first. A run whose ranks have
    a loss gets a LOSS column (and LR, GNORM with ``wide``)."""
    from rich.table import Table
    from rich.text import Text

    table = Table(box=None, header_style="bold", pad_edge=False)
    yielding = ("PHASE", "PROGRESS", "RATE", "GPU") if not reasons else ("GPU", "HEALTH")
    training = _has_training_metrics(view)
    extra = (("LOSS", "loss"), ("LR", "lr"), ("GNORM", "grad_norm")) if wide else (("LOSS", "loss"),)
    extra = extra if training else ()
    times, found = view.step_times
    score = ["SCORE"] if times else []  # the ranks' straggler scores (ups.status.straggler), once they have a step window
    columns = ["PROCESS", "PID", "PHASE", "PROGRESS", "RATE", *(c for c, _ in extra), *score, "HB/PROG", "GPU", "HEALTH"]
    for col in columns:
        table.add_column(col, no_wrap=col not in yielding)
    for p, node in grouped_processes(view):
        if node is not None:  # a multi-node run: a heading row per node, its processes under it
            h = node.health
            table.add_row(
                Text(f"node {node.host}" + (" (here)" if node.local else ""), "bold"),
                str(node.launcher_pid or "-"), Text(node.state or "?", STATE_STYLES.get(node.state or "", "")),
                "", "", *("" for _ in extra), *("" for _ in score), "", "",
                one_line(Text.assemble((h, HEALTH_STYLES.get(h, "")), (f" {node.reason}" if reasons and h != "ok" else "", "dim"))),
            )
            continue
        r = p.record
        table.add_row(
            ("  " if view.nodes else "") + short_label(r),
            str(r.pid),
            one_line(Text(r.phase)),
            one_line(Text(_progress_cell(r))),
            one_line(Text(fmt_rate(r.rate, r.unit if reasons else ""))),
            *(_metric_cell(r.metrics.get(key)) if r.role == "rank" else "" for _, key in extra),
            *(_score_cell(p, times, found) for _ in score),
            f"{fmt_age(p.heartbeat_age)}/{fmt_age(p.progress_age)}" if r.state == "running" else "-",
            one_line(Text(_gpu_cell(p, nvml))),
            _health_cell(p, reason=reasons),
        )
    return table


def _score_cell(p: ProcessView, times: dict, found) -> Text | str:
    """A rank's straggler score (1.00: the best rank's own time), the straggler's in its
    health's colour; '-' for a rank with no step window, nothing for the other processes."""
    from rich.text import Text

    if p.record.role != "rank":
        return ""
    t = times.get(p.record.name)
    if t is None:
        return "-"
    named = found is not None and (t.name == found.rank.name or t.rank in found.node_ranks)
    return Text(f"{t.score:.2f}", style=HEALTH_STYLES["straggler"] if named else "")


def _metric_cell(value):
    from rich.text import Text

    text = fmt_metric(value)
    return Text(text, style="bold red" if text in ("nan", "inf", "-inf") else "")


def grouped_processes(view: RunView) -> list[tuple[ProcessView | None, NodeView | None]]:
    """The processes in order; a multi-node run's grouped by node, each group after its node."""
    if not view.nodes:
        return [(p, None) for p in view.processes]
    out: list[tuple[ProcessView | None, NodeView | None]] = []
    for node in view.nodes:
        out.append((None, node))
        out.extend((p, None) for p in view.processes if p.record.host == node.host)
    return out


def render_status(view: RunView, nvml: dict[int, int], *, width: int | None = None, wide: bool = False):
    """The run's header, one line per process, and unreadable files.

    The HEALTH column holds the word and its reason when the table fits in ``width``
    (or ``wide``); otherwise the word alone, and the reason of every process in trouble
    follows the table, one line each, whole."""
    from rich.console import Group
    from rich.text import Text

    m = view.manifest or {}
    now = view.read_at
    state = view.state or "unreadable"
    elapsed = fmt_duration((m.get("ended_at") or now) - m["created_at"]) if m.get("created_at") else "-"
    head = Text.assemble(
        (view.run_id, "bold"),
        f"  {m.get('kind', '?')}  ",
        (state, STATE_STYLES.get(state, "")),
        f"  elapsed {elapsed}",
        (fmt_attempt(m), "bold yellow"),
        f"\nprogress {fmt_progress(*view.progress)}"
        f"  {fmt_rate(view.rate, view.unit)}  eta {fmt_duration(view.eta_s)}",
    )
    parts: list = [head]
    if slurm_line(m):
        parts.append(Text(slurm_line(m)))
    if view.manifest_problem:
        parts.append(Text(view.manifest_problem, style="red"))
    if m.get("summary"):
        parts.append(Text(f"summary: {m['summary']}"))
    found = view.step_times[1]
    if found is not None:  # the rank the others wait for, and its cost (the rows say each rank's score)
        parts.append(Text(fmt_straggler(found), style=HEALTH_STYLES["straggler"]))
    verdict = m.get("verdict") or {}
    if verdict.get("text") and not verdict.get("ok"):  # an ended run's `ups why`, kept in run.json
        parts.append(Text(f"why: {verdict['text']}"))
    table = process_table(view, nvml, reasons=True, wide=wide)
    below: list = []
    if not wide and width is not None and _natural_width(text_console(), table) > width:
        table = process_table(view, nvml, reasons=False)
        for p in view.processes:
            if p.verdict.health.is_problem and p.verdict.health.value != "unreachable":  # said once per node below
                h = p.verdict.health.value
                below.append(Text.assemble(f"{p.record.label}: ", (h, HEALTH_STYLES.get(h, "")), f": {p.verdict.reason}"))
    parts.append(table)
    parts.extend(below)
    for prob in view.problems:
        parts.append(Text(f"unreadable status file {prob.file}: {prob.problem}", style="yellow"))
    for node in view.nodes:
        if not node.reachable:
            parts.append(Text(node.reason, style="bold magenta"))
    if not view.processes and not view.problems:
        parts.append(Text("no process has written a status record yet", style="dim"))
    return Group(*parts)
