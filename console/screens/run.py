"""The Run screen: header, ranks, the selected rank's workers, and GPU/log/stack/events tabs."""

from __future__ import annotations

from rich.markup import escape
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import Footer, Static, TabbedContent, TabPane

from console.render import (
    age,
    attempts_text,
    bar,
    events_text,
    gpu_cell,
    gpu_panel,
    health_cell,
    reason_cell,
    run_header,
    step_bar,
    step_line,
    verdict_line,
)
from console.snapshots import Snapshot
from console.widgets.live_table import LiveTable
from console.widgets.metrics_panel import MetricsPanel
from ups.format import fmt_rate

# The health word comes right after the name, so it is on screen even at 80 columns; the
# reason comes last, where it may be cut.
RANK_COLUMNS = [("proc", "PROCESS"), ("health", "HEALTH"), ("phase", "PHASE"), ("progress", "PROGRESS"), ("rate", "RATE"),
                ("hb", "HB"), ("pid", "PID"), ("gpu", "GPU"), ("host", "HOST"), ("why", "WHY")]
# A run whose ranks have a step window (their records' metrics.step_parts) gets a bar of where
# each one's step goes, with its straggler score, after its health.
STEP_COLUMN = ("steptime", "STEP TIME")
STEP_COLUMNS = [*RANK_COLUMNS[:2], STEP_COLUMN, *RANK_COLUMNS[2:]]
WORKER_COLUMNS = [("worker", "W"), ("health", "HEALTH"), ("item", "ITEM"), ("items", "READ"), ("hb", "HB"), ("pid", "PID"),
                  ("why", "WHY")]


def rank_cells(p, step_times: tuple | None = None) -> tuple:
    """A process's row; with ``step_times`` (the view's: by name, and the straggler) the bar
    of where its step goes after its health."""
    r = p.record
    cells = (
        r.label, health_cell(p.verdict.health.value, width=0), r.phase, bar(r.step, r.total), fmt_rate(r.rate, r.unit),
        age(p.heartbeat_age) if r.state == "running" else "-", str(r.pid), gpu_cell(r.gpu), r.host,
        reason_cell(p.verdict.health.value, p.verdict.reason),
    )
    if step_times is None:
        return cells
    times, found = step_times
    t = times.get(r.name)
    named = t is not None and found is not None and (t.name == found.rank.name or t.rank in found.node_ranks)
    return (*cells[:2], "-" if t is None else step_bar(t, named=named), *cells[2:])


def node_cells(n, step_times: tuple | None = None) -> tuple:  # a NodeView
    """A node's heading row: its name, health, its launcher's state and pid."""
    cells = (
        Text(f"node {n.host}" + (" (here)" if n.local else ""), style="bold"), health_cell(n.health, width=0),
        n.state or "?", f"{n.processes} proc", "", "", str(n.launcher_pid or "-"), "", n.host, reason_cell(n.health, n.reason),
    )
    return cells if step_times is None else (*cells[:2], "", *cells[2:])


class RunScreen(Screen):
    BINDINGS = [
        Binding("escape", "app.pop_screen", "Runs"),
        Binding("k", "kill_process", "Kill process"),
        Binding("K", "kill_run", "Kill run"),
        Binding("s", "stacks", "Dump stacks"),
        Binding("f", "fallback", "Fallback w=0"),
        Binding("r", "relaunch", "Relaunch w=0"),
        Binding("a", "adopt", "Adopt", show=False),
    ]

    def __init__(self, run_id: str) -> None:
        super().__init__()
        self.run_id = run_id

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return self.app.check_action(action, parameters)  # --readonly hides every action

    def compose(self) -> ComposeResult:
        yield Static(id="run-header")
        yield Static(id="verdict")
        with Vertical(id="tables"):
            yield LiveTable(RANK_COLUMNS, id="ranks")
            yield Static(id="steptime")
            yield Static("DataLoader workers of the selected rank", id="workers-title", classes="title")
            yield LiveTable(WORKER_COLUMNS, id="workers")
        with TabbedContent(id="panels"):
            with TabPane("Stack", id="tab-stack"):
                yield Static(id="stack", classes="panel")
            with TabPane("Log", id="tab-log"):
                yield Static(id="log", classes="panel")
            with TabPane("Events", id="tab-events"):
                yield Static(id="events", classes="panel")
            with TabPane("Attempts", id="tab-attempts"):
                yield Static(id="attempts", classes="panel")
            with TabPane("GPU", id="tab-gpu"):
                yield Static(id="gpu", classes="panel")
            with TabPane("Metrics", id="tab-metrics"):
                yield MetricsPanel(id="metrics")
        yield Footer()

    def _set(self, selector: str, content) -> None:
        """Update a panel only when its content changed (re-rendering is the costly part)."""
        key = str(content) if isinstance(content, str) else getattr(content, "plain", None)
        if key is not None and self._last.get(selector) == key:
            return
        self._last[selector] = key
        self.query_one(selector, Static).update(content)

    def on_mount(self) -> None:
        self._last: dict[str, str | None] = {}
        self._metrics_opened = False  # a training run opens on its Metrics tab, once
        self.app.selected_run = self.run_id
        self.watch(self.app, "snapshot", self.show, init=True)

    def on_screen_resume(self) -> None:
        self.app.selected_run = self.run_id

    # -- selection --------------------------------------------------------------------
    def on_data_table_row_highlighted(self, event: LiveTable.RowHighlighted) -> None:
        key = event.row_key.value if event.row_key else None
        if key:
            self.app.selected_process = key

    def selected_record(self):
        snap: Snapshot | None = self.app.snapshot
        if snap is None or snap.detail is None or snap.detail.view.run_id != self.run_id:
            return None
        focused = self.focused if isinstance(self.focused, LiveTable) else self.query_one("#ranks", LiveTable)
        key = focused.selected_key or self.app.selected_process
        p = snap.detail.view.process(key) if key else None
        return None if p is None else p.record

    # -- drawing ----------------------------------------------------------------------
    def show(self, snap: Snapshot | None) -> None:
        if snap is None:
            return
        if snap.detail is None or snap.detail.view.run_id != self.run_id:
            if snap.notes:  # this run could not be read this tick: say why, keep the last screen
                self._set("#verdict", Text("\n".join(snap.notes), style="bold red"))
            return
        try:
            self._show(snap)
        except Exception as exc:  # noqa: BLE001 - a value that cannot be drawn is a note, not a dead console
            self._set("#verdict", Text(f"cannot draw this run: {type(exc).__name__}: {exc}", style="bold red"))

    def _show(self, snap: Snapshot) -> None:
        d = snap.detail
        assert d is not None
        view = d.view
        self._set("#run-header", run_header(view, snap.taken_at))
        verdict = verdict_line(d.verdict)
        if snap.notes:
            verdict = Text.assemble(verdict, "\n", Text("\n".join(snap.notes), style="bold red"))
        self._set("#verdict", verdict)
        ranks = view.ranks() + [p for p in view.processes if p.record.role in ("helper", "agent", "launcher")]
        steps = view.step_times if view.step_times[0] else None
        rows = [(p.record.name, lambda p=p: rank_cells(p, steps)) for p in ranks]
        if view.nodes:  # a multi-node run: each node heads its group of processes
            rows = []
            for node in view.nodes:
                rows.append((f"node:{node.host}", lambda n=node: node_cells(n, steps)))
                rows += [(p.record.name, lambda p=p: rank_cells(p, steps)) for p in ranks if p.record.host == node.host]
        table = self.query_one("#ranks", LiveTable)
        table.set_columns(RANK_COLUMNS if steps is None else STEP_COLUMNS)
        table.sync(rows)
        sel = view.process(d.selected) if d.selected else None
        rank = sel.record.rank if sel is not None else 0
        self._show_step(view, sel)
        workers = view.workers(rank)
        self._set("#workers-title",
            f"DataLoader workers of rank {rank}: {len(workers)}" if workers else "no DataLoader workers (num_workers=0 or not a precompute)")
        self.query_one("#workers", LiveTable).sync([
            (p.record.name, (
                str(p.record.worker), health_cell(p.verdict.health.value, width=0), p.record.item or "-", str(p.record.step),
                age(p.heartbeat_age) if p.record.state == "running" else "-", str(p.record.pid),
                reason_cell(p.verdict.health.value, p.verdict.reason),
            ))
            for p in workers
        ])
        label = sel.record.label if sel else "?"
        # Stack and log text is the program's (or anyone's) bytes: shown as text, never as markup.
        self._set("#stack", f"[b]last stack dump of {escape(label)}[/b] (s: dump now)\n" + escape(d.stack or "(none yet)"))
        self._set("#log", f"[b]{escape(d.log_name)}[/b]\n" + escape("\n".join(d.log_tail[-20:])) if d.log_tail else "(empty log)")
        self._set("#events", events_text(d.events))
        self._set("#attempts", attempts_text(view.manifest or {}))
        self.query_one("#gpu", Static).update(gpu_panel(snap.gpu))
        self.query_one("#metrics", MetricsPanel).show(d.series, self.size.width)
        if d.series and not self._metrics_opened:
            self._metrics_opened = True
            self.query_one(TabbedContent).active = "tab-metrics"

    def _show_step(self, view, sel) -> None:
        """The selected rank's step in words under the table (its rank's, for a worker); hidden
        while it has no step window."""
        times, found = view.step_times
        rank = next((p for p in view.ranks() if sel is not None and p.record.rank == sel.record.rank), None)
        t = times.get(rank.record.name) if rank is not None else None
        self.query_one("#steptime", Static).display = t is not None
        if t is not None:
            self._set("#steptime", step_line(t, rank.record.label, found))

    # -- actions ------------------------------------------------------------------------
    def action_kill_process(self) -> None:
        rec = self.selected_record()
        if rec is None:
            self.notify("select a rank or worker first", severity="warning")
            return
        self.app.confirm_kill(self.run_id, rec)

    def action_kill_run(self) -> None:
        self.app.confirm_kill(self.run_id, None)

    def action_stacks(self) -> None:
        rec = self.selected_record()
        if rec is not None:
            self.app.perform("stacks", self.run_id, rec)
            self.query_one(TabbedContent).active = "tab-stack"

    def action_fallback(self) -> None:
        self.app.perform("fallback", self.run_id, None)

    def action_adopt(self) -> None:
        self.app.perform("adopt", self.run_id, None)

    def action_relaunch(self) -> None:
        self.app.confirm_relaunch(self.run_id)
