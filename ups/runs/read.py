"""The one way to read a run: :func:`open_run`.

Every reader goes through it: ``ups runs``, ``ups status`` (and its ``--follow`` stream that
other nodes read), ``ups why``, the follow line of ``ups launch``, the console's poll, a
remote node's view. It reads the manifest and every record once, judges each process's
health, merges what other nodes stream (``remotes``), and settles in memory a run that
nobody is left to finish (:mod:`ups.runs.settle`). It never writes: a read-only, full or
foreign runs folder answers the same as a writable one, and only the launcher, ``ups adopt``
and ``ups runs --settle`` write a run's state.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ups.runs.exits import read_exits
from ups.runs.rundir import RunDir
from ups.runs.settle import settled
from ups.runs.view import RunView, load_run_view
from ups.status.procs import ProcessTable
from ups.status.reader import StatusSource


def open_run(
    run: RunDir | None,
    *,
    now: float | None = None,
    mono: float | None = None,
    remotes: Sequence[Any] = (),
    run_id: str | None = None,
    include: Callable[[str], bool] | None = None,
    source: StatusSource | None = None,
    table_factory: Callable[[list[int]], ProcessTable] | None = None,
    process_table: ProcessTable | None = None,
    local_host: str | None = None,
) -> RunView:
    """``run`` as every reader sees it now (see the module).

    ``remotes``: other nodes' streams of a multi-node run (ups.runs.remote.RemoteStatusSource),
    merged in; ``run`` may then be None (no node of the run is this host), and ``run_id`` names
    it. ``include`` reads only the records it names; ``source`` replaces the status folder;
    ``table_factory`` / ``process_table`` replace the /proc snapshot; ``now`` / ``mono`` fix the
    clocks (see :func:`ups.runs.view.load_run_view`)."""
    view = None
    if run is not None:
        view = load_run_view(run, now=now, mono=mono, include=include, source=source, table_factory=table_factory,
                             process_table=process_table, local_host=local_host)
        if view.supervision == "gone":  # nobody is left to finish it: settled from the ends its launcher logged
            logged = read_exits(run)
            view = settled(view, logged)
    if remotes:
        from ups.runs.remote import merge_remote

        view = merge_remote(view, list(remotes), run_id=run_id or (view.run_id if view is not None else ""))
    if view is None:
        raise ValueError("open_run needs a run folder or at least one remote node")
    return view
