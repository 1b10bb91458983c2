"""prometheus_client's custom collector over run folders: each scrape reads, nothing polls.

``collect()`` is called by the HTTP server on each scrape: it lists the runs folder, reads
each live run through :func:`ups.runs.read.open_run` (the one read function, which never
writes), asks ``ups why`` for its verdict, and yields the families of
:mod:`ups.exporter.families`. No thread runs between scrapes and nothing is kept from one to
the next. A run that cannot be read (a hostile or half-written folder) is counted in
``ups_exporter_unreadable_runs`` and the others are still exported: a scrape never fails
because of one run.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

from prometheus_client.core import GaugeMetricFamily, Metric

from ups.errors import UpsError
from ups.exporter.families import Families
from ups.runs.read import open_run
from ups.runs.rundir import FINAL_RUN_STATES, RunDir, list_runs
from ups.status.host import hostname
from ups.why import diagnose_view

ENDED_KEPT_S = 900.0
"""A run that ended is still exported this long after its end (by run.json's ``ended_at``),
so that a failed run's state is scraped and its alert fires; then it drops out."""


class RunsCollector:
    """Every live run of ``runs_root`` (or only ``run``, for ``ups launch --metrics-port``).

    Live: not ended, or ended less than ``ended_kept_s`` ago. One exporter per node: on a runs
    folder that nodes share, each exports the processes of its own node (their records' host)
    and the runs that have one there or were launched there, so that no series is exported
    twice; ``all_nodes`` exports every process the folder holds (one exporter for all)."""

    def __init__(self, runs_root: str | os.PathLike[str] | None = None, *, run: RunDir | None = None,
                 ended_kept_s: float = ENDED_KEPT_S, all_nodes: bool = False, host: str | None = None) -> None:
        if (runs_root is None) == (run is None):
            raise ValueError("RunsCollector needs a runs folder or one run")
        self.runs_root = None if runs_root is None else Path(runs_root)
        self.run = run
        self.ended_kept_s = ended_kept_s
        self.host = None if all_nodes else (host or hostname())

    def live_runs(self, now: float) -> tuple[list[RunDir], int]:
        """The runs to export, and how many run folders could not be read at all."""
        if self.run is not None:
            return [self.run], 0
        runs, unreadable = [], 0
        for s in list_runs(self.runs_root, missing_ok=True):
            if s.manifest is None:
                unreadable += 1
            elif s.state not in FINAL_RUN_STATES or (isinstance(s.ended_at, int | float)
                                                      and now - s.ended_at < self.ended_kept_s):
                runs.append(s.run)
        return runs, unreadable

    def collect(self) -> Iterator[Metric]:
        started = time.perf_counter()
        now = time.time()
        families = Families()
        try:
            runs, unreadable = self.live_runs(now)
        except (OSError, ValueError, UpsError):  # the runs folder itself is gone or not a folder: no runs
            runs, unreadable = [], 1
        exported = 0
        for run in runs:
            try:
                view = open_run(run)
                ended = (view.manifest or {}).get("ended_at")
                if (self.run is None and view.is_final and isinstance(ended, int | float)
                        and now - ended >= self.ended_kept_s):
                    continue  # settled in memory (its launcher is gone) and ended long ago
                processes = view.processes
                if self.host is not None:
                    processes = tuple(p for p in processes if p.record.host == self.host)
                    if not processes and (view.manifest or {}).get("host", self.host) != self.host:
                        continue  # another node's run: its own exporter has it
                families.add_run(view, diagnose_view(view), processes)
                exported += 1
            except Exception:  # noqa: BLE001 - one unreadable run never fails the scrape of the others
                unreadable += 1
        yield from families.families()
        yield _gauge("ups_exporter_runs", "Runs this scrape exported.", exported)
        yield _gauge("ups_exporter_unreadable_runs", "Run folders this scrape could not read (`ups runs` says why).",
                     unreadable)
        yield _gauge("ups_exporter_scrape_seconds", "Seconds this scrape took to read the runs (until its last run).",
                     round(time.perf_counter() - started, 6))


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)
