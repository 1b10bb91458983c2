"""Evidence captured automatically: the stacks of a process that turns stalled or unresponsive.

The supervisor runs this beside the job. When a process of the run turns stalled or
unresponsive, its stacks are dumped once per episode (the episode ends when it is healthy
again): with the stack-dump signal only to processes whose record registered the handler and
whose live caught-signal mask still shows it, else read from outside with py-spy, which
cannot kill (ups.runs.signals.dump_stacks: the one check that the CLI and the console go
through too; a program may have reset its handler), so by the time an
operator asks ``ups why`` the frames are there. Each dump is an automatic action on a
process: it is logged as a ``stacks.auto`` event with its evidence (health and reason). In
observe-only mode (``--observe-only``, run.json ``automatic: observe``) no signal is sent; the
event says what would have been done.
"""

from __future__ import annotations

import threading
import time

from ups.errors import RefusedSignal
from ups.runs.pyspy import OUTSIDE
from ups.runs.rundir import RunDir
from ups.runs.signals import dump_stacks
from ups.runs.view import load_run_view, node_view
from ups.status.health import Health

TICK_S = 1.0
SLOW_TICK_S = 3.0  # runs of many processes: reading every record each second is waste
LARGE = 256
TROUBLE = (Health.STALLED, Health.UNRESPONSIVE)


class StackCollector:
    def __init__(self, run: RunDir, *, actor: str = "launcher", observe_only: bool = False) -> None:
        self.run = run
        self.actor = actor
        self.observe_only = observe_only
        self.episodes: set[tuple[str, int]] = set()  # (name, pid) in trouble, already handled
        self._halt = threading.Event()
        self._tick_lock = threading.Lock()  # the supervisor also ticks it (--on-hang: stacks before a kill)
        self._thread = threading.Thread(target=self._loop, name="ups-autostacks", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._halt.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _loop(self) -> None:
        tick = TICK_S
        while not self._halt.wait(tick):
            try:
                tick = SLOW_TICK_S if self.tick() > LARGE else TICK_S
            except Exception as exc:  # noqa: BLE001 - evidence collection must never stop supervision
                print(f"ups: automatic stack dump failed: {exc!r}", flush=True)

    def tick(self) -> int:
        with self._tick_lock:
            return self._tick()

    def _tick(self) -> int:
        view = node_view(load_run_view(self.run))  # another node's processes are its launcher's
        troubled = {(p.record.name, p.record.pid): p for p in view.processes
                    if p.record.role != "launcher" and p.verdict.health in TROUBLE}
        self.episodes &= set(troubled)  # a process healthy again starts a new episode next time
        for key, p in troubled.items():
            if key in self.episodes:
                continue
            self.episodes.add(key)
            self.collect(p)
        return len(view.processes)

    def collect(self, p) -> None:
        rec = p.record
        evidence = {"target": rec.name, "pid": rec.pid, "health": p.verdict.health.value, "reason": p.verdict.reason,
                    "phase": rec.phase}
        if self.observe_only:
            self.run.append_event("stacks.auto", actor=self.actor, result="observe-only: not signalled", **evidence)
            return
        started = time.monotonic()
        try:
            text = dump_stacks(self.run, rec, actor=self.actor, timeout=3.0)
            result = f"dumped in {time.monotonic() - started:.1f} s"
            if OUTSIDE in text.partition("\n")[0]:  # no handler now: read with py-spy, never signalled
                result += " with py-spy (not signalled: the process handles no stack-dump signal now)"
        except RefusedSignal as exc:
            result = f"not dumped: {exc}"
        self.run.append_event("stacks.auto", actor=self.actor, result=result, stack_file=rec.stack_file, **evidence)
