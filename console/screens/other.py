"""Runs list, kill confirmation, launch form and doctor screens."""

from __future__ import annotations

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen, Screen
from textual.widgets import Button, DataTable, Footer, Input, Label, Static

from console.render import age, bar, health_cell, reason_cell, state_cell
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


class ConfirmKill(ModalScreen[str | None]):
    """Shows what would be signalled: pid, user, command. TERM (then KILL after the grace) or KILL."""

    BINDINGS = [Binding("t", "choose('TERM')", "TERM"), Binding("x", "choose('KILL')", "KILL"), Binding("escape", "choose(None)", "Cancel")]

    def __init__(self, title: str, lines: list[str]) -> None:
        super().__init__()
        self.title_text = title
        self.lines = lines

    CHOICES = (("TERM (t)", "TERM", "warning"), ("KILL (x)", "KILL", "error"))

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm"):
            yield Label(Text(self.title_text), id="confirm-title")  # run ids, labels, commands: text, never markup
            for line in self.lines:
                yield Label(Text(line))
            with Horizontal(id="confirm-buttons"):
                for label, choice, variant in self.CHOICES:
                    yield Button(label, id=choice, variant=variant)
                yield Button("Cancel (esc)", id="cancel")

    def action_choose(self, choice: str | None) -> None:
        self.dismiss(choice)

    @on(Button.Pressed)
    def pressed(self, event: Button.Pressed) -> None:
        self.dismiss(None if event.button.id == "cancel" else event.button.id)


class ConfirmRelaunch(ConfirmKill):
    """Shows the command a relaunch would run (and where) before anything starts."""

    BINDINGS = [Binding("y", "choose('relaunch')", "Relaunch"), Binding("escape", "choose(None)", "Cancel")]
    CHOICES = (("Relaunch (y)", "relaunch", "warning"),)


class ConfirmAttach(ConfirmKill):
    """Shows the job's processes and what attaching does before the observer starts."""

    BINDINGS = [Binding("y", "choose('attach')", "Attach"), Binding("escape", "choose(None)", "Cancel")]
    CHOICES = (("Attach (y)", "attach", "primary"),)


class LaunchScreen(Screen):
    BINDINGS = [Binding("escape", "app.pop_screen", "Back"), Binding("ctrl+s", "submit", "Launch", priority=True)]

    FIELDS = (
        ("kind", "kind", "precompute", "precompute, train or pipeline"),
        ("root", "data root", "data/demo", "folder with the HDF5 shards"),
        ("tasks", "tasks", "burgers1d", "advection1d burgers1d darcy2d"),
        ("cache", "cache dir", "cache/demo", "where the latent cache goes"),
        ("workers", "workers / ranks", "2", "DataLoader workers (precompute) or ranks (train)"),
        ("steps", "train steps", "40", "training steps"),
    )

    def compose(self) -> ComposeResult:
        yield Static("Launch a job (ctrl+s; spawns `ups launch ... --detach`, then opens the run)", classes="title")
        with Vertical(id="launch-form"):
            for wid, label, value, placeholder in self.FIELDS:
                with Horizontal(classes="field"):
                    yield Label(label)
                    yield Input(value, id=wid, placeholder=placeholder)
        yield Button("Launch (ctrl+s)", id="go", variant="primary")
        yield Static(id="launch-status")
        yield Footer()

    def argv(self) -> list[str] | None:
        import sys

        v = {w.id: w.value.strip() for w in self.query(Input)}
        kind = v["kind"]
        if kind not in ("precompute", "train", "pipeline"):
            self.query_one("#launch-status", Static).update(Text(f"kind must be precompute, train or pipeline, not {kind!r}", style="red"))
            return None
        args = [sys.executable, "-m", "ups", "launch", kind, "--cache-dir", v["cache"], "--detach", "--json",
                "--runs-dir", str(self.app.runs_dir)]
        for t in v["tasks"].replace(",", " ").split():
            args += ["--tasks", t]
        if kind in ("precompute", "pipeline"):
            args += ["--root", v["root"], "--num-workers", v["workers"]]
        if kind in ("train", "pipeline"):
            args += ["--nproc", v["workers"] if kind == "train" else "2", "--steps", v["steps"]]
        return args

    def action_submit(self) -> None:
        self.go()

    @on(Button.Pressed, "#go")
    def go(self) -> None:
        if self.app.readonly:
            self.notify("read-only console: launching is disabled", severity="warning")
            return
        argv = self.argv()
        if argv is not None:
            self.query_one("#launch-status", Static).update("launching ...")
            self.launch(argv)

    @work(thread=True, exclusive=True, group="launch", exit_on_error=False)
    def launch(self, argv: list[str]) -> None:
        from console.actions import launch

        result = launch(argv)
        self.app.call_from_thread(self.launched, result)

    def launched(self, result) -> None:
        if result.ok:
            self.app.pop_screen()
            self.app.open_run(result.message)
        else:
            self.query_one("#launch-status", Static).update(Text(result.message, style="red"))


class DoctorScreen(Screen):
    BINDINGS = [Binding("escape", "app.pop_screen", "Back"), Binding("F", "full", "Full run (probes)")]

    def compose(self) -> ComposeResult:
        yield Static("ups doctor (--quick; F runs the subprocess probes too)", classes="title", id="doctor-title")
        yield DataTable(id="doctor", cursor_type="row")
        yield Footer()

    def on_mount(self) -> None:
        t = self.query_one(DataTable)
        t.add_columns("CHECK", "STATUS", "DETAIL")
        self.run_doctor(quick=True)

    def action_full(self) -> None:
        self.query_one("#doctor-title", Static).update("ups doctor (full run, up to a minute) ...")
        self.run_doctor(quick=False)

    @work(thread=True, exclusive=True, group="doctor", exit_on_error=False)
    def run_doctor(self, quick: bool) -> None:
        from ups.doctor.runner import options_from, run_doctor, select

        report = run_doctor(options_from(None, None, None, self.app.runs_dir, 1.0), select(None, None), quick=quick)
        self.app.call_from_thread(self.show, report)

    def show(self, report) -> None:
        from rich.text import Text

        t = self.query_one(DataTable)
        t.clear()
        styles = {"ok": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}
        for r in report.results:
            t.add_row(r.id, Text(r.status, styles[r.status]), Text(r.detail + (f" → {r.hint}" if r.hint and r.status != "ok" else "")))
        s = report.summary()
        self.query_one("#doctor-title", Static).update(f"ups doctor: {s['ok']} ok, {s['warn']} warn, {s['fail']} fail, {s['skip']} skip")
