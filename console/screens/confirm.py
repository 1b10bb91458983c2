"""The confirmations shown before acting on a process: kill (pid, user, command; TERM or KILL), relaunch, attach."""

from __future__ import annotations

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Label


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
