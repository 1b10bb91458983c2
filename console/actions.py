"""Operator actions from the console, with "console" as the actor; run in worker threads.

Every request goes through the one front :mod:`ups.actions` (identity-checked signals,
control requests, events, a new launcher or run), each result made an :class:`ActionResult`."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ups.actions import dump_stacks, terminate
from ups.errors import UpsError
from ups.runs import RunDir, StatusRecord

ACTOR = "console"


@dataclass(frozen=True)
class ActionResult:
    ok: bool
    message: str


def process_owner(pid: int) -> tuple[str, str]:
    """(user, command line) of a live pid, for the kill confirmation."""
    import psutil

    try:
        p = psutil.Process(pid)
        return p.username(), " ".join(p.cmdline())[:160]
    except (psutil.Error, OSError):
        return "?", "?"


def attach(runs_dir: Path, pid: int, start: float | None) -> ActionResult:
    """Attach the job whose top process is ``pid`` (the same process the scan saw: its start
    time); the message is the new run's id."""
    from ups.actions import attach_job, find_job
    from ups.runs import process_start_time, same_start

    if not same_start(process_start_time(pid), start):
        return ActionResult(False, f"pid {pid} ended (or is another process now): nothing attached")
    try:
        run, _observer = attach_job(find_job(pid), runs_dir, actor=ACTOR)
    except UpsError as exc:
        return ActionResult(False, str(exc))
    return ActionResult(True, run.run_id)


def kill_process(run: RunDir, record: StatusRecord, *, force: bool, grace: float = 5.0) -> ActionResult:
    try:
        results = terminate(run, [record], actor=ACTOR, reason=f"operator: kill {record.label} from the console", grace=grace, force=force)
    except UpsError as exc:
        return ActionResult(False, str(exc))
    r = results[0]
    return ActionResult(r.outcome in ("terminated", "killed", "already gone"), f"{record.label} (pid {r.pid}): {r.outcome}")


def kill_run(run: RunDir, *, force: bool) -> ActionResult:
    from ups.actions import kill_run as core_kill_run
    from ups.runs import open_run

    try:
        results = core_kill_run(run, open_run(run), actor=ACTOR, reason="operator: kill run from the console", grace=5.0, force=force)
    except UpsError as exc:
        return ActionResult(False, str(exc))
    return ActionResult(True, f"run {run.run_id}: " + ", ".join(f"{r.name} {r.outcome}" for r in results))


def stacks(run: RunDir, record: StatusRecord) -> ActionResult:
    try:
        return ActionResult(True, dump_stacks(run, record, actor=ACTOR, timeout=5.0))
    except UpsError as exc:
        return ActionResult(False, str(exc))


def fallback(run: RunDir) -> ActionResult:
    from ups.actions import request_fallback

    try:
        request_fallback(run, actor=ACTOR)
    except UpsError as exc:
        return ActionResult(False, str(exc))
    return ActionResult(True, f"asked {run.run_id} to fall back to num_workers=0")


def adopt(run: RunDir) -> ActionResult:
    """A new launcher for a run whose launcher died."""
    from ups.actions import adopt as core_adopt

    try:
        pid = core_adopt(run, actor=ACTOR)
    except UpsError as exc:
        return ActionResult(False, str(exc))
    return ActionResult(True, f"run {run.run_id} adopted by a new launcher (pid {pid})")


def relaunch(run: RunDir, runs_dir: Path) -> ActionResult:
    """The same command as a new run with every DataLoader at num_workers=0 (a precompute
    resumes from its cache); the message is the new run's id."""
    from ups.actions import relaunch as core_relaunch

    try:
        return ActionResult(True, core_relaunch(run, str(runs_dir), num_workers=0, actor=ACTOR).run_id)
    except UpsError as exc:
        return ActionResult(False, str(exc))


def launch(args: list[str]) -> ActionResult:
    """Run a `ups launch ... --detach --json` and return the new run id as the message."""
    res = subprocess.run(args, capture_output=True, text=True, timeout=120, env={**os.environ, "UPS_ACTOR": ACTOR})
    if res.returncode != 0:
        return ActionResult(False, (res.stderr.strip().splitlines() or ["launch failed"])[-1])
    try:
        return ActionResult(True, json.loads(res.stdout)["run_id"])
    except (ValueError, KeyError):
        return ActionResult(False, "launch printed no run id")


def remote_action(spec, what: str, run_id: str, record: StatusRecord, *, force: bool = False) -> ActionResult:
    """Kill or dump the stacks of a process of another node: that node's ``ups``, over ssh.
    What goes into the remote command from a node's stream is checked first: a run id, a
    rank and a worker number, never an option or a word of shell."""
    from ups.actions import remote_ups
    from ups.runs import check_run_id

    try:
        check_run_id(run_id)
    except UpsError as exc:
        return ActionResult(False, str(exc))

    if record.role in ("launcher", "agent"):
        target: list[str] = []  # that node's part of the run: its launcher stops its agent and ranks
    else:
        target = ["--rank", str(record.rank if record.rank is not None else 0)]
    if record.role == "worker":
        target += ["--worker", str(record.worker)]
    if what == "kill":
        args = ["kill", run_id, *target, *(["--force"] if force else []), "--reason", f"operator: kill {record.label} from the console"]
    elif what == "stacks":
        args = ["stacks", run_id, *target]
    else:
        return ActionResult(False, f"{what} acts on this node's runs; {record.label} runs on {record.host}")
    try:
        res = remote_ups(spec, *args)
    except UpsError as exc:
        return ActionResult(False, str(exc))
    if res.returncode == 255:
        return ActionResult(False, f"node {spec.host} unreachable over ssh: {res.stderr.strip()[-200:]}")
    lines = (res.stdout.strip() or res.stderr.strip()).splitlines()
    message = f"{spec.host}: " + (lines[-1] if what == "kill" and lines else f"stacks of {record.label} dumped there")
    return ActionResult(res.returncode == 0, message if res.returncode == 0 else f"{spec.host}: {res.stderr.strip()[-300:]}")
