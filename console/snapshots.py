"""What the console shows, gathered off the UI thread into immutable snapshots.

Widgets never read files, call NVML or look at processes: the poller builds these once per
tick and posts them as messages.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ups.runs import (
    FINAL_RUN_STATES,
    AttributedGpu,
    BadFile,
    GpuProvider,
    RunView,
    StaticProcessTable,
    attribute,
    last_stack_dump,
    list_runs,
    open_run,
    read_tail,
    records_for_attribution,
)


@dataclass(frozen=True)
class RunRow:
    run_id: str
    path: Path
    kind: str
    state: str
    created_at: float | None
    step: int
    total: int | None
    rate: float | None
    unit: str
    health: str
    reason: str
    problem: str | None = None


@dataclass(frozen=True)
class RankSeries:
    """One rank's metrics over time, as the run screen draws them (finite values only)."""

    name: str
    label: str
    loss: tuple[float, ...]
    rate: tuple[float, ...]
    mem: tuple[float, ...]
    loss_pairs: tuple[tuple[float, float], ...]  # (step, loss) for the run-level chart: the whole series (bounded)
    last_loss: Any = None
    nonfinite_step: int | None = None


@dataclass(frozen=True)
class RunDetail:
    view: RunView
    events: tuple[dict[str, Any], ...]
    log_tail: tuple[str, ...]
    log_name: str
    stack: str | None
    selected: str | None  # record name the log/stack/workers belong to
    verdict: Any = None  # ups.why's verdict on the run (heads the run screen)
    series: tuple[RankSeries, ...] = ()  # the ranks' metrics series (ups.status.series), at most SERIES_SHOWN


@dataclass(frozen=True)
class Snapshot:
    taken_at: float
    runs: tuple[RunRow, ...]
    detail: RunDetail | None
    gpu: AttributedGpu | None
    read_ms: float = 0.0
    notes: tuple[str, ...] = field(default_factory=tuple)
    unwatched: tuple[dict[str, Any], ...] = ()  # jobs ups does not watch (ups.attach.find.scan's), when scanned


def _tail(path: Path, lines: int = 40, max_bytes: int = 32_000) -> tuple[str, ...]:
    try:
        text = read_tail(path, max_bytes)
    except FileNotFoundError:
        return ()
    except (OSError, BadFile) as exc:
        return (f"unreadable: {path.name}: {exc}",)
    return tuple(text.splitlines()[-lines:])


def run_row(view: RunView) -> RunRow:
    m = view.manifest or {}
    step, total = view.progress
    worst = view.worst
    return RunRow(
        run_id=view.run_id, path=view.run.path, kind=m.get("kind", "?"), state=view.state or "unreadable",
        created_at=m.get("created_at"), step=step, total=total, rate=view.rate, unit=view.unit,
        health=worst.health.value if worst else "-", reason=worst.reason if worst else "",
        problem=(view.manifest_problem.replace(f"{view.run.path}/", "") if view.manifest_problem else None)
        or (f"{len(view.problems)} unreadable status file(s)" if view.problems else None),
    )


SERIES_SHOWN = 16  # ranks whose series the run screen reads each tick (a 2,048-rank run stays cheap)


def rank_series(view: RunView, cache: dict[str, tuple[int, RankSeries | None]] | None = None) -> tuple[RankSeries, ...]:
    """The first :data:`SERIES_SHOWN` ranks' series; a file not changed since the last tick
    (same mtime) is not parsed again."""
    import os

    from ups.plot import first_nonfinite, spark_values
    from ups.runs import metric_values, read_series, series_path

    out = []
    for p in view.ranks()[:SERIES_SHOWN]:
        r = p.record
        path = series_path(view.run.path, r.name)
        try:
            mtime = os.stat(path).st_mtime_ns
        except OSError:
            continue
        hit = (cache or {}).get(path)
        if hit is not None and hit[0] == mtime:
            item = hit[1]
        else:
            data, _problem = read_series(path)
            item = None
            if data is not None:
                loss = metric_values(data, "loss")
                item = RankSeries(r.name, r.label, tuple(spark_values(loss)), tuple(spark_values(metric_values(data, "rate"))),
                                  tuple(spark_values(metric_values(data, "mem"))), tuple(loss),
                                  nonfinite_step=(data.get("first_nonfinite") or {}).get("step") or first_nonfinite(loss))
            if cache is not None:
                cache[path] = (mtime, item)
        if item is not None:
            out.append(dataclasses.replace(item, last_loss=r.metrics.get("loss")))
    return tuple(out)


class Poller:
    """Builds a :class:`Snapshot` per tick. Worker records of runs and ranks that are not on
    screen are read only every ``full_every`` ticks: a 2,048-process run stays cheap."""

    def __init__(
        self,
        runs_dir: Path,
        *,
        gpu_provider: GpuProvider | None,
        clock: Callable[[], float] = time.time,
        process_table: Callable[[list[int]], Any] | None = None,
        full_every: int = 10,
        local_host: str | None = None,
        remotes: list[Any] | None = None,
        scan_every: float | None = None,
    ) -> None:
        self.scan_every = scan_every  # seconds between scans of this host for jobs ups does not watch; None: never
        self._scanned_at: float | None = None
        self._unwatched: tuple[dict[str, Any], ...] = ()
        self.local_host = local_host
        self.remotes = list(remotes or [])  # ups.runs.remote.RemoteSpec: other nodes, over SSH
        self._sources: dict[str, list[Any]] = {}  # run id -> RemoteStatusSource per remote
        self.runs_dir = Path(runs_dir)
        self.gpu_provider = gpu_provider
        self.clock = clock
        self.process_table = process_table or (lambda pids: StaticProcessTable.snapshot(pids))
        self.full_every = full_every
        self.tick = 0
        self._row_cache: dict[str, RunRow] = {}
        self._verdicts: dict[tuple[str, str | None], Any] = {}
        self._series_cache: dict[str, tuple[int, RankSeries | None]] = {}

    def _view(self, s: Any, include: Callable[[str], bool] | None = None) -> RunView:
        """The run of a listing entry, read as every reader reads it (ups.runs.read.open_run);
        the other nodes' streams merged in for a multi-node run when the console has remotes."""
        # The real clock is judged on CLOCK_MONOTONIC like every reader; a fixed test clock is wall time.
        mono = time.monotonic() if self.clock is time.time else None
        remotes = self.sources(s.run_id) if self.remotes and (s.manifest or {}).get("multinode") else ()
        return open_run(s.run, now=self.clock(), mono=mono, include=include, table_factory=self.process_table,
                        local_host=self.local_host, remotes=remotes, run_id=s.run_id)

    def sources(self, run_id: str) -> list[Any]:
        """The other nodes' streams of one run, started on first use; each is read by a
        thread of its own, so a slow or lost node never holds up a tick."""
        if run_id not in self._sources:
            from ups.runs import open_sources

            self._sources[run_id] = open_sources(self.remotes, run_id)
        return self._sources[run_id]

    def remote_for(self, run_id: str, host: str) -> Any:
        """The RemoteSpec through which a node of a run is reached (None: not a remote one)."""
        return next((s.spec for s in self._sources.get(run_id, []) if s.host == host), None)

    def close(self) -> None:
        from ups.runs import stop_sources

        for sources in self._sources.values():
            stop_sources(sources)
        self._sources.clear()

    def snapshot(self, selected_run: str | None, selected_process: str | None, *, with_gpu: bool = True) -> Snapshot:
        t0 = time.perf_counter()
        full = self.tick % self.full_every == 0
        self.tick += 1
        rows: list[RunRow] = []
        notes: list[str] = []
        detail = None
        try:
            summaries = list_runs(self.runs_dir, missing_ok=True)
        except Exception as exc:  # noqa: BLE001 - a bad runs folder is a note on screen
            summaries, notes = [], [str(exc)]
        for s in summaries:
            try:
                row, run_detail = self._row(s, selected_run, selected_process, full)
            except Exception as exc:  # noqa: BLE001 - one run that cannot be read is a row saying why
                row, run_detail = _broken_row(s, exc), None
                notes.append(f"{s.run_id}: {row.problem}")
            detail = run_detail or detail
            self._row_cache[s.run_id] = row
            rows.append(row)
        gpu = None
        if with_gpu and self.gpu_provider is not None:
            try:
                gpu = attribute(self.gpu_provider.snapshot(), records_for_attribution(self.runs_dir) if full or self.tick == 1
                                else [(detail.view.run_id, p.record) for p in detail.view.processes] if detail else [])
            except Exception as exc:  # noqa: BLE001
                notes.append(f"GPU panel: {type(exc).__name__}: {exc}")
        unwatched = self._scan(notes)
        return Snapshot(self.clock(), tuple(rows), detail, gpu, (time.perf_counter() - t0) * 1000, tuple(notes), unwatched)

    def _scan(self, notes: list[str]) -> tuple[dict[str, Any], ...]:
        """The PyTorch jobs of this host ups does not watch (``ups attach --scan``), read again
        every ``scan_every`` seconds (a scan reads every process's /proc entry)."""
        if self.scan_every is None:
            return ()
        now = time.monotonic()
        if self._scanned_at is None or now - self._scanned_at >= self.scan_every:
            from ups.actions import scan

            self._scanned_at = now
            try:
                self._unwatched = tuple(scan(self.runs_dir)["jobs"])
            except Exception as exc:  # noqa: BLE001 - a scan that fails is a note, not a dead console
                notes.append(f"scan for jobs not launched by ups: {type(exc).__name__}: {exc}")
        return self._unwatched

    def rescan(self) -> None:
        """Scan again at the next tick (a job just attached leaves the unwatched list)."""
        self._scanned_at = None

    def _row(self, s: Any, selected_run: str | None, selected_process: str | None,
             full: bool) -> tuple[RunRow, RunDetail | None]:
        """One run's row (and its detail when it is the selected run)."""
        detail = None
        cached = self._row_cache.get(s.run_id)
        if s.run_id == selected_run:
            rank = _rank_of(selected_process)
            view = self._view(s, None if full else (lambda n, r=rank: "worker" not in n or n.startswith(f"rank-{r}-worker-")))
            detail = self._detail(view, selected_process)
            row = run_row(view) if full or cached is None else _merge_row(cached, run_row(view))
        elif cached is not None and cached.state == s.state and s.state in FINAL_RUN_STATES:
            row = cached  # a finished run does not change
        else:
            view = self._view(s, None if full else (lambda n: "worker" not in n))
            row = run_row(view) if full or cached is None else _merge_row(cached, run_row(view))
        return row, detail

    def _detail(self, view: RunView, selected: str | None) -> RunDetail:
        names = [p.record.name for p in view.processes]
        if selected not in names:
            selected = next((n for n in names if n.startswith("rank-") and "worker" not in n), names[0] if names else None)
        proc = view.process(selected) if selected else None
        if proc is not None and proc.record.role == "rank":
            from ups.runs import find_logs

            try:
                paths = find_logs(view.run, proc.record.rank) if view.kind in ("train", "torchrun") else [view.run.log_path("job")]
            except Exception:  # noqa: BLE001
                paths = [view.run.log_path("job")]
        else:
            paths = [view.run.log_path("job")]
        stack = last_stack_dump(view.run, proc.record, max_bytes=12_000) if proc else None
        return RunDetail(view, tuple(view.run.read_events(limit=30)), _tail(paths[0]), paths[0].name, stack, selected,
                         self._verdict(view), rank_series(view, self._series_cache))

    def _verdict(self, view: RunView) -> Any:
        """The run's verdict; an ended run's is computed once (it cannot change)."""
        from ups.why import diagnose_view

        key = (view.run_id, view.manifest_state)
        if view.is_final and key in self._verdicts:
            return self._verdicts[key]
        try:
            verdict = diagnose_view(view)
        except Exception as exc:  # noqa: BLE001 - a verdict that cannot be made is a note, not a crash
            from ups.why import Verdict

            verdict = Verdict("failed", f"no verdict: {type(exc).__name__}: {exc}")
        if view.is_final:
            self._verdicts[key] = verdict
        return verdict


def _broken_row(s: Any, exc: Exception) -> RunRow:
    """The row of a run whose read failed: what failed, in its problem column."""
    return RunRow(s.run_id, s.path, s.kind or "?", "unreadable", s.created_at if isinstance(s.created_at, float) else None,
                  0, None, None, "items", "-", "", f"unreadable: {type(exc).__name__}: {str(exc)[:200]}")


def _rank_of(name: str | None) -> int:
    if name and name.startswith("rank-"):
        try:
            return int(name.split("-")[1])
        except ValueError:
            return 0
    return 0


def _merge_row(full: RunRow, partial: RunRow) -> RunRow:
    """Progress from the fresh partial read; the worst health of the two (workers unread)."""
    from ups.runs import Health

    sev = {h.value: h.severity for h in Health}
    worse = full if sev.get(full.health, 0) > sev.get(partial.health, 0) else partial
    return RunRow(partial.run_id, partial.path, partial.kind, partial.state, partial.created_at, partial.step, partial.total,
                  partial.rate, partial.unit, worse.health, worse.reason, partial.problem)
