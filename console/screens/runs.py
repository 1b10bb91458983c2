"""The runs list: every run in the runs folder, and the jobs ups did not launch (attach them with a)."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Footer, Static

from console.render import age, bar, health_cell, reason_cell, state_cell
from console.screens.doctor import DoctorScreen
from console.screens.launch import LaunchScreen
from console.snapshots import Snapshot
from console.widgets.live_table import LiveTable
from ups.format import fmt_rate

RUN_COLUMNS = [("run", "RUN"), ("state", "STATE"), ("health", "HEALTH"), ("progress", "PROGRESS"), ("age", "AGE"),
               ("rate", "RATE"), ("why", "WHY")]


class RunsScreen(Screen):
    BINDINGS = [
        Binding("enter", "open", "Open run", show=True, priority=True),
        Binding("l", "launch", "Launch"),
        Binding("d", "doctor", "Doctor"),
        Binding("a", "attach", "Attach"),
        Binding("q", "app.quit", "Quit"),
    ]

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return self.app.check_action(action, parameters)  # --readonly hides launching

    def compose(self) -> ComposeResult:
        yield Static("ups — runs (Enter opens, l launches, d runs the doctor; closing this never stops a job)", id="runs-title", classes="title")
        yield LiveTable(RUN_COLUMNS, id="runs")
        yield Static(id="runs-notes")
        yield Footer()

    def on_mount(self) -> None:
        self.watch(self.app, "snapshot", self.show, init=True)

    def on_screen_resume(self) -> None:
        self.app.selected_run = None

    def show(self, snap: Snapshot | None) -> None:
        if snap is None:
            return
        try:
            self._show(snap)
        except Exception as exc:  # noqa: BLE001 - a value that cannot be drawn is a note, not a dead console
            self.query_one("#runs-notes", Static).update(Text(f"cannot draw the runs list: {type(exc).__name__}: {exc}"))

    def _show(self, snap: Snapshot) -> None:
        self.query_one("#runs", LiveTable).sync([
            (r.run_id, (
                r.run_id, state_cell(r.state),
                health_cell("unreadable" if r.state == "unreadable" else r.health, width=0),
                bar(r.step, r.total), age(snap.taken_at - r.created_at) if r.created_at else "-",
                fmt_rate(r.rate, r.unit), reason_cell("problem" if r.problem else r.health, r.problem or r.reason),
            ))
            for r in snap.runs
        ] + [(UNWATCHED + str(j["top"]), unwatched_cells(j, snap.taken_at)) for j in snap.unwatched])
        notes = list(snap.notes) or ([] if snap.runs else [f"no runs under {self.app.runs_dir} yet: press l to launch one"])
        self.query_one("#runs-notes", Static).update(Text("\n".join(notes)))  # notes quote files: no markup

    def action_open(self) -> None:
        key = self.query_one("#runs", LiveTable).selected_key
        if key and key.startswith(UNWATCHED):
            self.notify("not launched by ups: press a to attach it (then it opens as a run)", markup=False)
        elif key:
            self.app.open_run(key)

    def action_attach(self) -> None:
        key = self.query_one("#runs", LiveTable).selected_key
        job = next((j for j in (self.app.snapshot.unwatched if self.app.snapshot else ())
                    if key == UNWATCHED + str(j["top"])), None)
        if job is None:
            self.notify("a attaches a job not launched by ups: select a row marked so", markup=False)
            return
        self.app.confirm_attach(job)

    def action_launch(self) -> None:
        self.app.push_screen(LaunchScreen())

    def action_doctor(self) -> None:
        self.app.push_screen(DoctorScreen())


UNWATCHED = "unwatched:"  # the row key of a job ups does not watch: its top pid follows


def unwatched_cells(job: dict, now: float) -> tuple:
    """A job ups does not watch, as a runs-list row (ups.attach.find.scan's entry)."""
    top = next((p for p in job["processes"] if p["pid"] == job["top"]), job["processes"][0])
    script = next((a.rsplit("/", 1)[-1] for a in top["argv"][1:] if a.endswith(".py")), " ".join(top["argv"][:1]))
    ranks = sum(p["role"] == "rank" for p in job["processes"])
    why = ("its agent died (an orphan); " if job["orphan"] else "") + "a attaches it"
    return (f"pid {job['top']} {script}", Text("not launched by ups", style="yellow"), Text("-"), Text(f"{ranks} rank(s)"),
            age(now - top["start"]) if top.get("start") else "-", "-", Text(why, style="dim"))
