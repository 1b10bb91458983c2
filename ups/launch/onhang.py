"""What the supervisor does when ``ups why`` names a hang: ``--on-hang {observe,dump,kill,restart}``.

The supervisor asks :meth:`HangWatch.check` about once a second. A verdict whose mode is a
hang (:data:`HANG_MODES`) opens an episode; each episode is acted on once:

* ``observe``: a ``hang`` event with the verdict, nothing else (also what ``--observe-only``
  turns every action into: the event says what would have been done);
* ``dump`` (the default): the stacks of every process in trouble are saved (the automatic
  collector does this anyway), and the event is logged;
* ``kill``: stacks first, then the job is ended; the run ends killed, saying why;
* ``restart``: stacks first, then the job is ended and the same command started again as the
  same run, attempt N+1 (``UPS_ATTEMPT``), up to ``--max-restarts`` times; after that it is
  ended as for ``kill``. ``--on-worker-hang fallback`` makes a hang of a DataLoader worker
  restart with every DataLoader at ``num_workers=0`` (``UPS_FORCE_NUM_WORKERS``, the
  mechanism of ``ups relaunch --num-workers 0``).

Each attempt's verdict is kept in run.json (``attempts``), its records under
``attempts/<N>/status`` and a copy of its stack files under ``attempts/<N>/stacks``; the
metrics series go on in ``metrics/`` (each point carries its attempt).
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from typing import Any

from ups.runs.rundir import RunDir
from ups.runs.view import load_run_view, node_view

ON_HANG = ("observe", "dump", "kill", "restart")
ON_WORKER_HANG = ("same", "fallback")
HANG_MODES = frozenset(("stalled", "unresponsive", "rank_stuck_peers_wait", "one_sided_collective",
                        "worker_stuck_in_read", "worker_stuck", "dataloader_resources"))
CHECK_EVERY_S = 1.0


def check_options(on_hang: str | None, max_restarts: int | None, on_worker_hang: str | None) -> dict[str, Any]:
    """The manifest fields of the launch options (validated: bad input is one line, exit 2)."""
    from ups.errors import UpsError

    if on_hang is not None and on_hang not in ON_HANG:
        raise UpsError(f"--on-hang {on_hang}: one of {', '.join(ON_HANG)}")
    if on_worker_hang is not None and on_worker_hang not in ON_WORKER_HANG:
        raise UpsError(f"--on-worker-hang {on_worker_hang}: one of {', '.join(ON_WORKER_HANG)}")
    if max_restarts is not None and max_restarts < 0:
        raise UpsError("--max-restarts must be >= 0")
    if max_restarts and (on_hang or "dump") != "restart":
        raise UpsError("--max-restarts needs --on-hang restart")
    out: dict[str, Any] = {}
    if on_hang is not None:
        out["on_hang"] = on_hang
    if on_hang == "restart":
        out["max_restarts"] = 3 if max_restarts is None else max_restarts
    if on_worker_hang is not None:
        out["on_worker_hang"] = on_worker_hang
    return out


def is_worker_hang(verdict: Any) -> bool:  # noqa: ANN401 - a Verdict
    return verdict.mode == "worker_stuck_in_read" or (verdict.who or {}).get("role") == "worker"


@dataclass
class Decision:
    verdict: Any  # the Verdict
    action: str  # observe | dump | kill | restart | give_up
    fallback: bool = False  # restart with num_workers=0


class HangWatch:
    """Judges the live run once a second and decides, once per hang episode."""

    def __init__(self, run: RunDir, manifest: dict[str, Any]) -> None:
        self.run = run
        self.action = manifest.get("on_hang") or "dump"
        # Judging costs a `ups why` a second in the launcher: only when --on-hang was given
        # (the default, dump, is what the automatic stack collector does anyway).
        self.active = manifest.get("on_hang") is not None
        self.observe_only = manifest.get("automatic") == "observe"
        self.max_restarts = int(manifest.get("max_restarts") or 0)
        self.worker_fallback = manifest.get("on_worker_hang") == "fallback"
        self.restarts = int(manifest.get("restarts") or 0)
        self.episode: tuple | None = None
        self._next = time.monotonic() + CHECK_EVERY_S

    def check(self) -> tuple[Any, Decision | None]:
        """(the live run's verdict now, or None between checks; what to do about it, once per episode)."""
        now = time.monotonic()
        if now < self._next:
            return None, None
        self._next = now + CHECK_EVERY_S
        from ups.why import diagnose_view

        view = node_view(load_run_view(self.run))
        if view.is_final:
            return None, None
        verdict = diagnose_view(view)
        if verdict.mode not in HANG_MODES:
            self.episode = None
            return verdict, None
        key = (verdict.mode, (verdict.who or {}).get("name"), (verdict.who or {}).get("pid"))
        if key == self.episode:
            return verdict, None
        self.episode = key
        action = self.action
        if action == "restart" and self.restarts >= self.max_restarts:
            action = "give_up"
        return verdict, Decision(verdict, action, fallback=action == "restart" and self.worker_fallback and is_worker_hang(verdict))

    def new_attempt(self) -> None:
        self.restarts += 1
        self.episode = None
        self._next = time.monotonic() + CHECK_EVERY_S


def archive_attempt(run: RunDir, attempt: int) -> str:
    """Move the ended attempt's records under ``attempts/<N>/status`` (the next attempt's
    processes write the same names) and copy its stack files beside them. Returns the folder."""
    folder = run.path / "attempts" / str(attempt)
    (folder / "status").mkdir(parents=True, exist_ok=True)
    for rec in run.status_dir.glob("*.json"):
        if rec.name.startswith("launcher"):
            continue  # the supervisor's own record goes on
        try:
            rec.replace(folder / "status" / rec.name)
        except OSError:
            continue
    if run.stacks_dir.is_dir():
        try:
            shutil.copytree(run.stacks_dir, folder / "stacks", dirs_exist_ok=True)
        except OSError:
            pass
    return str(folder.relative_to(run.path))
