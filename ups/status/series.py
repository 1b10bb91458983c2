"""Training metrics over time: one bounded series per process in ``<run>/metrics/<name>.json``.

A status record says what a process does now; the series says how it got there (loss, lr,
step rate, GPU memory ...). Its size is fixed whatever the run's length, so a 30-day run
keeps a whole-run overview and recent detail in the same few tens of KB:

* ``recent``: the last :data:`RECENT` points: one per step whose loss the capture read
  (:mod:`ups.instrument.metrics` hands the heartbeat every loss since the last tick), else one
  per heartbeat in which the process moved;
* ``overview``: every ``stride``-th point since the process's first attempt; when it holds
  :data:`OVERVIEW` points every second one is dropped and ``stride`` doubles;
* ``first_loss``: the first point that carried a loss, for good: the overview's thinning
  keeps every ``stride``-th point counted from the series' first point, which may be a tick
  from before the first step (no loss yet), so without it a curve could begin a few steps in;
* ``around_nonfinite``: the points from :data:`BEFORE_NONFINITE` before the first non-finite
  loss to :data:`AFTER_NONFINITE` after it, in full and for good: the curve that led to a NaN
  survives however long the run goes on after it.

The points of one tick share its time ``t`` (when the heartbeat read them); within one, the
step orders them.

The writer is the Reporter's heartbeat thread (never the training thread): it adds a point
per tick at most and writes the file atomically every few seconds and at the end. A relaunch
of the same run (``--on-hang restart``, attempt N+1) loads the file and continues it, each
point tagged with its attempt.

Every reader goes through :func:`read_series` / :func:`read_run_series`: a missing, empty,
torn, oversized or foreign file becomes a problem string, never an exception. This module
imports only the standard library's light modules: every instrumented process loads it.
"""

from __future__ import annotations

import json
import math
import os
import time

from ups.status.confined import in_folder, make_dirs
from ups.status.files import write_atomic

SERIES_SCHEMA = 1
SERIES_DIR = "metrics"
RECENT = 240
OVERVIEW = 240
BEFORE_NONFINITE = 16
AFTER_NONFINITE = 8
WRITE_EVERY_S = 2.0
MAX_SERIES_BYTES = 1 << 20
# Columns of a point, in order. t: UNIX time; step: the record's step; attempt: 1, 2 ...;
# loss/lr/grad_norm: the program's own values; rate: steps/s; sps/tps: samples/s, tokens/s;
# mem: CUDA memory allocated (bytes); step_time: the median step (s) of the rank's recent steps
# (its record's metrics.step_parts, ups.status.steptime). A file stores its columns
# (``fields``): a column is only ever added at the end, and a file of fewer columns (written
# before it was added) is read with the missing ones empty.
FIELDS = ("t", "step", "attempt", "loss", "lr", "grad_norm", "rate", "sps", "tps", "mem", "step_time")
FIRST_FIELDS = 10  # the columns of the first files (up to ``mem``): the fewest a series file may have
NUMERIC = frozenset(("loss", "lr", "grad_norm", "rate", "sps", "tps", "step_time"))


def _round(value):  # any JSON scalar
    """Six significant digits; NaN and infinities as the strings JSON can carry."""
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return float(f"{value:.6g}")
    return value


def as_float(value) -> float | None:
    """A series cell as a float (``"nan"`` → nan); None for a missing or foreign cell."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if value in ("nan", "inf", "-inf"):
        return float(value)
    return None


def series_path(run_dir: str | os.PathLike[str], name: str) -> str:
    return os.path.join(os.fspath(run_dir), SERIES_DIR, f"{name}.json")


class SeriesWriter:
    """The bounded series of one process, kept by its Reporter's heartbeat thread."""

    def __init__(self, run_dir: str | os.PathLike[str], name: str, *, attempt: int = 1) -> None:
        self.path = series_path(run_dir, name)
        self.name = name
        self.attempt = attempt
        self.recent: list[list] = []
        self.overview: list[list] = []
        self.stride = 1
        self.count = 0  # points ever added (all attempts)
        self.first_nonfinite: dict | None = None
        self.around_nonfinite: list[list] = []
        self.first_loss: list[list] = []  # [] or [the first row with a loss]
        self._after_left = 0  # points still to keep after the first non-finite loss
        self._stepped = False  # the heartbeat has handed over steps: one point per step from now on
        self._last_key: tuple | None = None
        self._written_mono = 0.0
        self._dirty = False
        self._load()

    def _load(self) -> None:
        """Continue the series of an earlier attempt of the same run (same process name)."""
        if not os.path.lexists(self.path):
            return  # a first attempt: nothing to continue
        data, _problem = read_series(self.path)
        if data is None:
            return
        self.recent = data["recent"][-RECENT:]
        self.overview = data["overview"][-OVERVIEW:]
        self.stride = max(1, int(data.get("stride") or 1))
        self.count = int(data.get("count") or len(self.recent))
        self.first_nonfinite = data.get("first_nonfinite")
        self.around_nonfinite = data.get("around_nonfinite") or []
        self.first_loss = data.get("first_loss") or []

    def add(self, point: dict, steps: list[tuple[int, float]] | tuple = ()) -> bool:
        """Add a point (a dict of :data:`FIELDS`) unless nothing moved since the last one.

        ``steps``: every (step, loss) the capture read since the last call, in order; then each
        is a point of its own, at the point's time, and the last one carries the point's other
        columns (lr, rate, memory ...). With none, the point stands for the tick as it is; once
        a series has had steps, a tick without any adds nothing (its step count would repeat
        the last loss at another step)."""
        if steps:
            self._stepped = True
            t = round(point.get("t") or 0.0, 2)
            blank = [None] * (len(FIELDS) - 4)
            for step, loss in steps[:-1]:  # ~1 µs each: the heartbeat thread may take thousands a tick
                self._add_row([t, step, self.attempt, _round(loss), *blank], step, loss)
            step, loss = steps[-1]
            point = dict(point, step=step, loss=loss)
        elif self._stepped:
            return False
        point = dict(point, attempt=self.attempt)
        row = [_round(point.get(f)) if f != "t" else round(point.get("t") or 0.0, 2) for f in FIELDS]
        return self._add_row(row, point.get("step"), point.get("loss"))

    def _add_row(self, row: list, step, loss) -> bool:
        key = (step, loss if loss == loss else "nan")
        if key == self._last_key:
            return False
        self._last_key = key
        recent = self.recent
        recent.append(row)
        if len(recent) > RECENT:
            del recent[0]
        if self.count % self.stride == 0:
            self.overview.append(row)
            if len(self.overview) >= OVERVIEW:
                self.overview = self.overview[::2]
                self.stride *= 2
        self.count += 1
        if not self.first_loss and isinstance(loss, int | float) and not isinstance(loss, bool):
            self.first_loss = [row]
        if self._after_left or (not self.around_nonfinite and isinstance(loss, float) and not math.isfinite(loss)):
            self._keep_around_nonfinite(row)
        self._dirty = True
        return True

    def _keep_around_nonfinite(self, row: list) -> None:
        if self._after_left:
            self.around_nonfinite.append(row)
            self._after_left -= 1
        else:  # the first non-finite loss: this row and those before it
            self.around_nonfinite = self.recent[-(BEFORE_NONFINITE + 1):]
            self._after_left = AFTER_NONFINITE

    def note_nonfinite(self, info: dict) -> None:
        """The first non-finite loss of this process (kept for good: later NaNs follow from it)."""
        if self.first_nonfinite is None:
            self.first_nonfinite = {k: _round(v) for k, v in info.items()} | {"attempt": self.attempt}
            self._dirty = True

    def to_dict(self) -> dict:
        return {"schema": SERIES_SCHEMA, "name": self.name, "fields": list(FIELDS), "stride": self.stride,
                "count": self.count, "attempt": self.attempt, "written_at": time.time(),
                "first_nonfinite": self.first_nonfinite, "around_nonfinite": self.around_nonfinite,
                "first_loss": self.first_loss,
                "overview": self.overview, "recent": self.recent}

    def maybe_write(self, *, force: bool = False) -> bool:
        """Write the file when something changed and the last write is old enough (or ``force``).
        Never raises: a full disk costs the history, never the job."""
        if not self._dirty or (not force and time.monotonic() - self._written_mono < WRITE_EVERY_S):
            return False
        self._written_mono = time.monotonic()
        data = json.dumps(self.to_dict(), separators=(",", ":")).encode()
        try:
            # metrics/ made when missing, and opened, never through a link; a vanished run is
            # never made again.
            folder = make_dirs(os.path.dirname(os.path.dirname(self.path)), SERIES_DIR)
            try:
                write_atomic(in_folder(folder, os.path.basename(self.path)), data)
            finally:
                os.close(folder)
        except OSError:
            return False
        self._dirty = False
        return True


# --------------------------------------------------------------------------- reading
def _valid_rows(rows, width: int) -> list[list]:
    """The rows of ``width`` cells (the file's columns), each made as wide as :data:`FIELDS`
    (the columns added since the file was written are empty)."""
    if not isinstance(rows, list):
        raise ValueError("points are not a list")
    pad = [None] * (len(FIELDS) - width)
    return [r + pad if pad else r for r in rows if isinstance(r, list) and len(r) == width]


def read_series(path: str | os.PathLike[str]) -> tuple[dict | None, str | None]:
    """One series file as a dict (``fields``, ``overview``, ``recent`` ...), or (None, why not).

    Through the trust boundary (:mod:`ups.status.safeio`: a regular file opened without
    blocking or following links, at most :data:`MAX_SERIES_BYTES`, JSON of finite numbers),
    then its shape checked here."""
    from ups.status.safeio import BadFile, read_json  # here: a rank's first attempt never needs it

    try:
        data = read_json(path, MAX_SERIES_BYTES)
    except FileNotFoundError:
        return None, "no series yet"
    except BadFile as exc:
        return None, str(exc)
    except OSError as exc:
        return None, f"unreadable ({exc.strerror or exc})"
    if not isinstance(data, dict) or not isinstance(data.get("schema"), int):
        return None, "not a metrics series"
    if data["schema"] > SERIES_SCHEMA:
        return None, f"future schema {data['schema']}"
    fields = data.get("fields")
    # This version's columns, or an older file's: the same columns up to where it stops.
    if not isinstance(fields, list) or not FIRST_FIELDS <= len(fields) <= len(FIELDS) or fields != list(FIELDS[:len(fields)]):
        return None, "unknown columns"
    width = len(fields)
    try:
        data["overview"] = _valid_rows(data.get("overview", []), width)
        data["recent"] = _valid_rows(data.get("recent", []), width)
        data["around_nonfinite"] = _valid_rows(data.get("around_nonfinite") or [], width)
        data["first_loss"] = _valid_rows(data.get("first_loss") or [], width)[:1]
    except ValueError as exc:
        return None, str(exc)
    data["fields"] = list(FIELDS)  # its rows are this version's now
    if not isinstance(data.get("first_nonfinite"), dict | None):
        data["first_nonfinite"] = None
    return data, None


def _order(row: list) -> tuple[float, float]:
    step = row[1]
    return as_float(row[0]) or 0.0, step if isinstance(step, int | float) and not isinstance(step, bool) else -1


def merged_rows(data: dict) -> list[list]:
    """The series' rows in time order: the overview up to where recent detail starts, the
    first point with a loss and the points around the first non-finite loss, then the recent
    rows (a whole-run chart from its first loss, with full detail at its end and where the
    loss went bad)."""
    recent = data.get("recent") or []
    start = _order(recent[0]) if recent else None
    rows = [r for r in data.get("overview") or [] if start is None or _order(r) < start]
    around = [*(data.get("first_loss") or []), *(data.get("around_nonfinite") or [])]
    if around:
        seen = {(r[0], r[1], r[2]) for r in rows}
        seen.update((r[0], r[1], r[2]) for r in recent)
        for r in around:
            if (r[0], r[1], r[2]) not in seen:
                seen.add((r[0], r[1], r[2]))
                rows.append(r)
        rows.sort(key=_order)
    return rows + recent


def raw_points(data: dict) -> list[dict]:
    """Points as stored (NaN as "nan"): for JSON output."""
    return [dict(zip(FIELDS, row, strict=False)) for row in merged_rows(data)]


def points(data: dict) -> list[dict]:
    """Points in time order, numbers as floats (NaN as float nan)."""
    out = []
    for row in merged_rows(data):
        p = dict(zip(FIELDS, row, strict=False))
        for key in NUMERIC | {"t", "mem"}:
            p[key] = as_float(p.get(key))
        out.append(p)
    return out


def read_run_series(run_dir: str | os.PathLike[str]) -> tuple[dict[str, dict], dict[str, str]]:
    """Every process's series of a run: ({name: series}, {file: problem})."""
    folder = os.path.join(os.fspath(run_dir), SERIES_DIR)
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return {}, {}
    found, problems = {}, {}
    for file in names:
        if file.startswith(".") or not file.endswith(".json"):
            continue
        data, problem = read_series(os.path.join(folder, file))
        if data is None:
            problems[file] = problem or "unreadable"
        else:
            found[file[:-5]] = data
    return found, problems


def metric_values(data: dict, metric: str) -> list[tuple[int, float]]:
    """(step, value) pairs of one metric, finite or not, in time order."""
    out = []
    for p in points(data):
        v = p.get(metric)
        if v is not None and isinstance(p.get("step"), int):
            out.append((p["step"], v))
    return out
