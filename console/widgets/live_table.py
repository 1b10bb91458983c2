"""A DataTable that is updated by diffing: only changed cells of rows on screen are touched.

Updating every cell of every row each second costs ~5% of a core and a 100 ms refresh at
256 rows (docs/design.md, "Traps"). Here a tick touches the cells that changed in the visible rows;
rows scrolled out of view catch up when they come back into view (next tick).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.text import Text
from textual.widgets import DataTable


def _cells(cells: Sequence[Any]) -> tuple[Any, ...]:
    return tuple(Text(c) if isinstance(c, str) else c for c in cells)


class LiveTable(DataTable):
    DEFAULT_CSS = """
    LiveTable { height: auto; max-height: 100%; scrollbar-size-horizontal: 0; }
    """

    def __init__(self, columns: Sequence[tuple[str, str]], **kwargs: Any) -> None:
        super().__init__(cursor_type="row", zebra_stripes=False, cell_padding=1, **kwargs)
        self._column_keys = [key for key, _ in columns]
        self._labels = [label for _, label in columns]
        self._shown: dict[str, tuple[Any, ...]] = {}
        self._order: list[str] = []
        self.cell_updates = 0

    def on_mount(self) -> None:
        if self.columns:  # set_columns came first
            return
        for key, label in zip(self._column_keys, self._labels, strict=True):
            self.add_column(label, key=key)

    def set_columns(self, columns: Sequence[tuple[str, str]]) -> None:
        """Show these columns (a column that only some runs have); the rows are drawn anew at
        the next :meth:`sync`. Nothing happens when they are the ones shown."""
        keys = [key for key, _ in columns]
        if keys == self._column_keys:
            return
        self.clear(columns=True)
        self._column_keys, self._labels = keys, [label for _, label in columns]
        for key, label in columns:
            self.add_column(label, key=key)
        self._shown, self._order = {}, []

    def sync(self, rows: Sequence[tuple[str, Any]]) -> None:
        """Show ``rows``: (key, cells) pairs, where cells is a tuple or a zero-argument
        callable making it. Callables are only called for rows that are drawn this tick.
        A cell that is a plain string is shown as text: DataTable would read it as markup,
        and a run's name or a record's phase may hold ``[link=...]``."""
        keys = [k for k, _ in rows]
        if keys != self._order:
            self._rebuild([(k, _cells(c() if callable(c) else c)) for k, c in rows])
            return
        first = max(0, int(self.scroll_offset.y) - 2)
        last = first + max(1, self.size.height) + 4
        for i in range(first, min(last + 1, len(rows))):
            key, cells = rows[i]
            cells = _cells(cells() if callable(cells) else cells)
            shown = self._shown.get(key)
            if shown == cells:
                continue
            for col, (old, new) in enumerate(zip(shown or (None,) * len(cells), cells, strict=True)):
                if old != new:
                    self.update_cell(key, self._column_keys[col], new, update_width=True)
                    self.cell_updates += 1
            self._shown[key] = cells

    def _rebuild(self, rows: Sequence[tuple[str, tuple[Any, ...]]]) -> None:
        selected = self.selected_key
        self.clear()
        self._shown = {}
        for key, cells in rows:
            self.add_row(*cells, key=key)
            self._shown[key] = cells
        self._order = [k for k, _ in rows]
        if selected in self._order:
            self.move_cursor(row=self._order.index(selected), animate=False)

    @property
    def row_keys(self) -> list[str]:
        """The keys of the rows, in the order shown."""
        return list(self._order)

    @property
    def selected_key(self) -> str | None:
        if not self._order or self.cursor_row is None or not 0 <= self.cursor_row < len(self._order):
            return None
        return self._order[self.cursor_row]
