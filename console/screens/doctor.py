"""`ups doctor` as a screen: each check, its status and its hint."""

from __future__ import annotations

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static


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
        from ups.actions import options_from, run_doctor, select

        report = run_doctor(options_from(None, None, None, self.app.runs_dir, 1.0), select(None, None), quick=quick)
        self.app.call_from_thread(self.show, report)

    def show(self, report) -> None:

        t = self.query_one(DataTable)
        t.clear()
        styles = {"ok": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}
        for r in report.results:
            t.add_row(r.id, Text(r.status, styles[r.status]), Text(r.detail + (f" → {r.hint}" if r.hint and r.status != "ok" else "")))
        s = report.summary()
        self.query_one("#doctor-title", Static).update(f"ups doctor: {s['ok']} ok, {s['warn']} warn, {s['fail']} fail, {s['skip']} skip")
