"""The launch form: a job's options, started as `ups launch` would."""

from __future__ import annotations

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Button, Footer, Input, Label, Static


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
