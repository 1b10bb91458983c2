"""The ups console: every run, rank and DataLoader worker, over SSH, keyboard only.

The App is thin: one poll worker thread builds a :class:`~console.snapshots.Snapshot` per
tick and posts it; screens watch ``snapshot`` and draw. Actions (kill, stacks, fallback,
relaunch, launch) run in worker threads through ups.runs with "console" as the actor.
``readonly`` removes every action.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from textual import work
from textual.app import App
from textual.message import Message
from textual.reactive import reactive
from textual.worker import get_current_worker

from console.screens.confirm import ConfirmAttach, ConfirmKill, ConfirmRelaunch
from console.screens.run import RunScreen
from console.screens.runs import RunsScreen
from console.snapshots import Poller, Snapshot

ACTIONS = {"kill_process", "kill_run", "stacks", "fallback", "relaunch", "launch", "adopt", "attach"}
SCAN_EVERY_S = 10.0  # run_console's scan for jobs not launched by ups


@dataclass
class RefreshStats:
    """How long drawing each snapshot took (read by tests and scripts/bench_console.py)."""

    count: int = 0
    max_ms: float = 0.0
    total_ms: float = 0.0
    max_read_ms: float = 0.0


class SnapshotReady(Message):
    def __init__(self, snapshot: Snapshot) -> None:
        super().__init__()
        self.snapshot = snapshot


class UpsConsole(App):
    CSS_PATH = "console.tcss"
    TITLE = "ups console"
    snapshot: reactive[Snapshot | None] = reactive(None, always_update=True)

    def __init__(
        self,
        runs_dir: str | Path,
        *,
        refresh: float = 1.0,
        readonly: bool = False,
        run_id: str | None = None,
        clock: Callable[[], float] = time.time,
        gpu_provider: Any = "auto",
        process_table: Any = None,
        poll: bool = True,
        local_host: str | None = None,
        remotes: list[Any] | None = None,
        scan_every: float | None = None,
    ) -> None:
        super().__init__()
        self.runs_dir = Path(runs_dir)
        self.refresh_s = refresh
        self.readonly = readonly
        self.initial_run = run_id
        self.clock = clock
        if gpu_provider == "auto":
            from ups.runs import get_provider

            gpu_provider = get_provider()
        self.poller = Poller(self.runs_dir, gpu_provider=gpu_provider, clock=clock, process_table=process_table,
                             local_host=local_host, remotes=remotes, scan_every=scan_every)
        self.selected_run: str | None = None
        self.selected_process: str | None = None
        self.stats = RefreshStats()
        self.poll_enabled = poll
        if readonly:
            self.sub_title = "read-only"

    def on_mount(self) -> None:
        self.push_screen(RunsScreen())
        if self.initial_run:
            self.open_run(self.initial_run)
        if self.poll_enabled:
            self.poll()
        else:
            self.poll_once()

    def on_unmount(self) -> None:
        self.poller.close()  # the ssh streams of other nodes

    # -- polling ------------------------------------------------------------------------
    @work(thread=True, exclusive=True, group="poll", exit_on_error=False)
    def poll(self) -> None:
        worker = get_current_worker()
        while not worker.is_cancelled:
            started = time.monotonic()
            self.post_message(SnapshotReady(self._snapshot()))
            worker_wait = max(0.05, self.refresh_s - (time.monotonic() - started))
            end = time.monotonic() + worker_wait
            while time.monotonic() < end and not worker.is_cancelled:
                time.sleep(min(0.05, worker_wait))

    def poll_once(self) -> None:
        """One synchronous snapshot (tests, snapshots): no thread, deterministic."""
        self.on_snapshot_ready(SnapshotReady(self._snapshot()))

    def _snapshot(self) -> Snapshot:
        """This tick's snapshot. A poll that fails never ends polling: the last good
        snapshot stays on screen with a note that says what failed, and the next tick
        tries afresh (a bad file removed, the screen recovers by itself)."""
        try:
            return self.poller.snapshot(self.selected_run, self.selected_process)
        except Exception as exc:  # noqa: BLE001 - the console must outlive any one bad read
            last = self.snapshot
            note = f"poll failed: {type(exc).__name__}: {str(exc)[:300]} (retrying every {self.refresh_s:g} s)"
            if last is None:
                return Snapshot(time.time(), (), None, None, notes=(note,))
            return dataclasses.replace(last, notes=(*last.notes, note))

    def on_snapshot_ready(self, message: SnapshotReady) -> None:
        t = time.perf_counter()
        self.snapshot = message.snapshot
        ms = (time.perf_counter() - t) * 1000
        s = self.stats
        s.count += 1
        s.total_ms += ms
        s.max_ms = max(s.max_ms, ms)
        s.max_read_ms = max(s.max_read_ms, message.snapshot.read_ms)

    # -- navigation ---------------------------------------------------------------------
    def open_run(self, run_id: str) -> None:
        self.selected_run = run_id
        self.selected_process = None
        self.push_screen(RunScreen(run_id))
        if not self.poll_enabled:
            self.poll_once()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if self.readonly and action in ACTIONS:
            return False  # hidden from the footer and refused
        return True

    # -- actions --------------------------------------------------------------------------
    def confirm_kill(self, run_id: str, record: Any) -> None:
        if self.readonly:
            return
        from console.actions import process_owner

        if record is None:
            lines = [f"every process of run {run_id}: launcher first, then ranks and workers"]
            title = f"Kill run {run_id}?"
        else:
            user, cmd = process_owner(record.pid)
            lines = [f"pid {record.pid}   user {user}", f"command: {cmd}", "TERM, then KILL after 5 s if it does not exit"]
            title = f"Kill {record.label} of {run_id}?"

        def done(choice: str | None) -> None:
            if choice:
                self.perform("kill", run_id, record, force=choice == "KILL")

        self.push_screen(ConfirmKill(title, lines), done)

    def confirm_relaunch(self, run_id: str) -> None:
        """Show the command a relaunch with num_workers=0 would run; run it on 'y'. A run that
        is not provably this user's is refused here, before any question."""
        if self.readonly:
            return
        from ups.actions import plan_relaunch
        from ups.errors import UpsError
        from ups.runs import RunDir

        try:
            plan = plan_relaunch(RunDir(self.runs_dir / run_id), num_workers=0)
        except UpsError as exc:
            self.notify(str(exc), severity="error", timeout=8, markup=False)
            return

        def done(choice: str | None) -> None:
            if choice:
                self.perform("relaunch", run_id, None)

        self.push_screen(ConfirmRelaunch(f"Relaunch {run_id} as a new run with num_workers=0?",
                                         [f"command: {plan.shown()}", "the run is stopped first if it is still alive"]), done)

    def confirm_attach(self, job: dict[str, Any]) -> None:
        """Show a job ups does not watch (``ups attach --scan``'s entry) and what attaching
        does; attach on 'y'."""
        if self.readonly:
            return
        lines = [job["describe"] + (f"; log {job['log']}" if job.get("log") else "; no log file")]
        lines += [f"pid {p['pid']:>7}  {p['label']:<22} {' '.join(p['argv'])[:70]}" for p in job["processes"][:12]]
        if job["orphan"] and sum(p["role"] == "rank" for p in job["processes"]) > 1:
            lines.append("its torchrun agent is gone: its ranks here, and their workers, are attached as one run")
        lines += ["nothing goes into the job and nothing signals it: one observer process watches it from outside",
                  "(/proc, py-spy, its log) as a run; it is never acted on automatically"]
        top = next(p for p in job["processes"] if p["pid"] == job["top"])

        def done(choice: str | None) -> None:
            if choice:
                self._attach(job["top"], top["start"])

        self.push_screen(ConfirmAttach(f"Attach to pid {job['top']}, not launched by ups?", lines), done)

    @work(thread=True, group="actions", exit_on_error=False)
    def _attach(self, pid: int, start: float | None) -> None:
        from console import actions

        result = actions.attach(self.runs_dir, pid, start)
        self.poller.rescan()
        self.call_from_thread(self.notify, result.message if not result.ok else f"attached as run {result.message}",
                              severity="information" if result.ok else "error", timeout=6, markup=False)
        if result.ok:
            self.call_from_thread(self.open_run, result.message)

    def perform(self, what: str, run_id: str, record: Any, force: bool = False) -> None:
        if self.readonly:
            self.notify("read-only console", severity="warning")
            return
        self._act(what, run_id, record, force)

    @work(thread=True, group="actions", exit_on_error=False)
    def _act(self, what: str, run_id: str, record: Any, force: bool) -> None:
        from console import actions
        from ups.runs import RunDir

        run = RunDir(self.runs_dir / run_id)
        spec = self.poller.remote_for(run_id, record.host) if record is not None else None
        if spec is not None:  # a process of another node: that node's ups does it, over ssh
            result = actions.remote_action(spec, what, run_id, record, force=force)
            self.call_from_thread(self.notify, result.message, severity="information" if result.ok else "error", timeout=6, markup=False)
            return
        if what == "kill":
            result = actions.kill_run(run, force=force) if record is None else actions.kill_process(run, record, force=force)
        elif what == "stacks":
            result = actions.stacks(run, record)
        elif what == "fallback":
            result = actions.fallback(run)
        elif what == "adopt":
            result = actions.adopt(run)
        elif what == "relaunch":
            result = actions.relaunch(run, self.runs_dir)
            if result.ok:
                self.call_from_thread(self.open_run, result.message)
        else:  # pragma: no cover
            return
        message = result.message if what != "stacks" or not result.ok else f"stacks of {record.label} dumped"
        self.call_from_thread(self.notify, message, severity="information" if result.ok else "error", timeout=6, markup=False)


def run_console(runs_dir: str | Path, run_id: str | None = None, readonly: bool = False, refresh: float = 1.0,
                remotes: list[Any] | None = None) -> None:
    UpsConsole(runs_dir, run_id=run_id, readonly=readonly, refresh=refresh, remotes=remotes, scan_every=SCAN_EVERY_S).run()
