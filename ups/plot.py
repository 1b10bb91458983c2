"""Charts of a run's metrics series in the terminal (``ups plot``, the console's run chart).

:func:`text_chart` draws with plain characters and needs nothing; :func:`plotext_chart` uses
plotext when it is installed (imported here, lazily: never on the CLI's start-up path). Both
fit the width they are given (80 columns by default). NaN and infinite values are not drawn;
the chart's title says from which step a series has them.
"""

from __future__ import annotations

import math

MARKERS = "●o+x*#@%"
METRICS = {"loss": "loss", "lr": "learning rate", "grad_norm": "grad norm", "rate": "steps/s", "sps": "samples/s",
           "tps": "tokens/s", "mem": "GPU memory (bytes)", "step_time": "median step time (s)"}


def finite(pairs: list[tuple[float, float]]) -> list[tuple[float, float]]:
    return [(x, y) for x, y in pairs if isinstance(y, int | float) and math.isfinite(y)]


def first_nonfinite(pairs: list[tuple[float, float]]) -> float | None:
    return next((x for x, y in pairs if isinstance(y, int | float) and not math.isfinite(y)), None)


def _fmt(v: float) -> str:
    if v != 0 and (abs(v) < 1e-2 or abs(v) >= 1e5):
        return f"{v:.2e}"
    return f"{v:.4g}"


def text_chart(series: dict[str, list[tuple[float, float]]], *, width: int = 80, height: int = 16, title: str = "") -> str:
    """Series (label -> [(step, value)]) as a character chart ``width`` columns wide."""
    clean = {k: finite(v) for k, v in series.items()}
    everything = [p for pts in clean.values() for p in pts]
    lines = [t[:width] for t in title.splitlines()]
    if not everything:
        return "\n".join(lines + ["(no points to draw yet)"])
    xs = [x for x, _ in everything]
    ys = [y for _, y in everything]
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    if y1 == y0:
        y0, y1 = y0 - (abs(y0) or 1) * 0.05, y1 + (abs(y1) or 1) * 0.05
    labels = [_fmt(y1), _fmt((y0 + y1) / 2), _fmt(y0)]
    gutter = max(len(s) for s in labels) + 1
    cols = max(10, width - gutter - 1)
    rows = max(4, height - 3 - len(lines))
    grid = [[" "] * cols for _ in range(rows)]
    for i, pts in enumerate(clean.values()):
        mark = MARKERS[i % len(MARKERS)]
        for x, y in pts:
            c = 0 if x1 == x0 else round((x - x0) / (x1 - x0) * (cols - 1))
            r = rows - 1 - round((y - y0) / (y1 - y0) * (rows - 1))
            grid[r][c] = mark
    for r, row in enumerate(grid):
        label = labels[0] if r == 0 else labels[2] if r == rows - 1 else labels[1] if r == rows // 2 else ""
        lines.append(f"{label:>{gutter - 1}} |" + "".join(row).rstrip())
    lines.append(" " * gutter + "+" + "-" * cols)
    left, right = f"step {int(x0)}", f"{int(x1)}"
    lines.append(" " * gutter + left + " " * max(1, cols - len(left) - len(right) + 1) + right)
    legend = "  ".join(f"{MARKERS[i % len(MARKERS)]} {k}" for i, k in enumerate(clean))
    if len(clean) > 1:
        lines.append(legend[:width])
    return "\n".join(line[:width] for line in lines)


def plotext_chart(series: dict[str, list[tuple[float, float]]], *, width: int = 80, height: int = 20, title: str = "",
                  color: bool = False) -> str | None:
    """The same chart drawn by plotext; None when plotext is not installed, or is a version
    without its classic functions (``plot``, ``plotsize``, ``build``: plotext 6 reorganised
    them), where the caller draws :func:`text_chart` instead."""
    try:
        import plotext as plt
    except ImportError:
        return None
    if not all(hasattr(plt, name) for name in ("clear_figure", "plotsize", "plot", "build", "theme", "title", "xlabel")):
        return None
    plt.clear_figure()
    plt.plotsize(width, height)
    if not color:
        plt.theme("clear")
    for label, pts in series.items():
        pts = finite(pts)
        if pts:
            plt.plot([x for x, _ in pts], [y for _, y in pts], label=label, marker="braille")
    if title:
        plt.title(title)
    plt.xlabel("step")
    return plt.build()


def spark_values(pairs: list[tuple[float, float]], limit: int = 120) -> list[float]:
    """The last ``limit`` finite values of a series, for a sparkline."""
    return [y for _, y in finite(pairs)][-limit:]
