"""The run screen's Metrics tab: per-rank sparklines (loss, step rate, GPU memory) and a
run-level loss chart of every rank (drawn by ups.plot with plain characters)."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, VerticalScroll
from textual.widgets import Sparkline, Static

from ups.format import fmt_metric
from ups.plot import text_chart


class RankSparklines(Horizontal):
    """One rank: its label, three sparklines, its last loss."""

    DEFAULT_CSS = """
    RankSparklines { height: 1; }
    RankSparklines .spark-label { width: 8; }
    RankSparklines Sparkline { width: 1fr; height: 1; margin-right: 1; }
    RankSparklines .spark-last { width: 10; }
    """

    def __init__(self, name: str, label: str) -> None:
        super().__init__(id=f"spark-{name}")
        self.label = label

    def compose(self) -> ComposeResult:
        yield Static(self.label, classes="spark-label")
        yield Sparkline([], classes="spark-loss")
        yield Sparkline([], classes="spark-rate")
        yield Sparkline([], classes="spark-mem")
        yield Static("-", classes="spark-last")

    def show(self, series: Any) -> None:  # console.snapshots.RankSeries
        for cls, values in (("spark-loss", series.loss), ("spark-rate", series.rate), ("spark-mem", series.mem)):
            spark = self.query_one(f".{cls}", Sparkline)
            if list(spark.data or []) != list(values):
                spark.data = list(values)
        last = fmt_metric(series.last_loss)
        style = "bold red" if last in ("nan", "inf", "-inf") else ""
        self.query_one(".spark-last", Static).update(Text(last, style=style))


class MetricsPanel(VerticalScroll):
    DEFAULT_CSS = """
    MetricsPanel { padding: 0 1; }
    MetricsPanel #metrics-head { height: 1; color: $text-muted; }
    MetricsPanel #metrics-chart { height: auto; margin-top: 1; }
    """

    def compose(self) -> ComposeResult:
        yield Static(self._head(), id="metrics-head")
        yield Static("", id="metrics-chart")

    @staticmethod
    def _head() -> Text:
        return Text("rank    LOSS / STEPS/S / GPU MEM (sparklines, oldest left)           last loss")

    def show(self, series: tuple, width: int) -> None:
        if not series:
            self.query_one("#metrics-chart", Static).update(
                "no training metrics yet: a rank's series starts with its first steps "
                "(the loss backward() is called on, lr, step rate, GPU memory)")
            return
        shown = {row.id: row for row in self.query(RankSparklines)}
        wanted = [f"spark-{s.name}" for s in series]
        if list(shown) != wanted:
            for row in shown.values():
                row.remove()
            chart = self.query_one("#metrics-chart", Static)
            self.mount_all([RankSparklines(s.name, s.label) for s in series], before=chart)
            self.call_after_refresh(self.show, series, width)
            return
        for s in series:
            shown[f"spark-{s.name}"].show(s)
        bad = [f"{s.label} from step {s.nonfinite_step}" for s in series if s.nonfinite_step is not None]
        title = "loss of every rank" + (f"\nnot finite: {', '.join(bad)}" if bad else "")
        chart = text_chart({s.label: list(s.loss_pairs) for s in series}, width=max(30, width - 4), height=14, title=title)
        self.query_one("#metrics-chart", Static).update(Text(chart))
