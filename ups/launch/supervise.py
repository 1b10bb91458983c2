"""The launcher process: owns one job, reports on it, and records how it ended.

``ups launch`` creates the run directory and starts ``python -m ups.launch.supervise RUN``
in a new session (``start_new_session``): closing the terminal or losing SSH never stops it.
The supervisor starts the job command stored in run.json, forwards SIGTERM/SIGINT to it,
waits, and writes the final state, exit code and signal into run.json and the event log.
It is the job's child subreaper and leads the job's session: when the job's top process
ends, whatever the job left running is ended too, and a survivor is named in the run's end
(:mod:`ups.launch.leftovers`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any

from ups.launch import kinds as _kinds  # noqa: F401 - registers the per-kind finalizers
from ups.launch import leftovers
from ups.launch.autostacks import StackCollector
from ups.launch.exits import ExitWatcher
from ups.launch.finalize import End, Outcome, describe_returncode, finalize
from ups.runs.rundir import RunDir
from ups.runs.signals import signal_name
from ups.runs.view import load_run_view, node_view
from ups.status.health import Health
from ups.status.host import ENV_HOSTNAME, hostname
from ups.status.procs import process_start_time, same_start, this_process_start
from ups.status.reporter import ENV_RUN_DIR, ENV_RUN_ID, Reporter, append_opener
from ups.status.schema import process_name

ACTOR = "launcher"
TERM_GRACE_S = 10.0


def _own_process_group() -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        return {"process_group": 0}
    return {"preexec_fn": os.setpgrp}  # pragma: no cover - Python 3.10


class Supervisor:
    def __init__(self, run: RunDir) -> None:
        self.run = run
        self.manifest = run.read_manifest()
        self.child: subprocess.Popen[bytes] | None = None
        self.pgid: int | None = None  # the job's process group: every signal goes to all of it
        self.terminate_requested: str | None = None
        self.exits = ExitWatcher(run, actor=ACTOR)
        self.stacks = StackCollector(run, actor=ACTOR, observe_only=self.manifest.get("automatic") == "observe")

    def _on_signal(self, signum: int, _frame: Any) -> None:
        name = signal_name(signum) or str(signum)
        if self.terminate_requested is None:
            self.terminate_requested = name
        self.signal_job(signal.SIGTERM)

    def signal_job(self, signum: int) -> None:
        # The job runs in its own process group (see start): signal all of it, so torchrun's
        # ranks and DataLoader workers hear it even if a parent is stuck.
        if self.pgid is not None:
            try:
                os.killpg(self.pgid, signum)
            except (ProcessLookupError, PermissionError):
                pass

    def job_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update({k: str(v) for k, v in (self.manifest.get("env") or {}).items()})
        env[ENV_RUN_DIR] = str(self.run.path.resolve())
        env[ENV_RUN_ID] = self.run.run_id
        env["UPS_AUTOMATIC"] = self.manifest.get("automatic") or "act"  # jobs' own watchdogs obey it too
        env.setdefault("PYTHONUNBUFFERED", "1")
        if self.run.is_multinode:  # the agent's record is agent@<host>: nothing collides across nodes
            env["UPS_NODE"] = hostname()
            env[ENV_HOSTNAME] = hostname()
            if self.manifest.get("node_rank") is not None:
                env["UPS_NODE_RANK"] = str(self.manifest["node_rank"])
        top_role = self.manifest.get("top_role")
        if self.manifest.get("instrument") and top_role:
            # Every Python process of the job reports through ups.instrument (sitecustomize).
            from ups.instrument import job_environment

            env.update(job_environment(env.get("PYTHONPATH"), top_role=top_role))
        return env

    def start(self) -> None:
        command = [str(c) for c in self.manifest["command"]]
        log = open(self.run.log_path("job"), "ab", opener=append_opener)  # noqa: SIM115 - owned by the child
        self.child = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.job_env(),
            cwd=self.manifest.get("cwd") or None,
            **_own_process_group(),
        )
        log.close()
        self.pgid = self.child.pid
        self.run.update_manifest(
            state="running",
            job={"pid": self.child.pid, "pid_start": process_start_time(self.child.pid), "pgid": self.child.pid,
                 "command": command},
        )
        self.run.append_event("start", actor=ACTOR, pid=self.child.pid, command=command)
        self.exits.start()
        self.stacks.start()

    def describe(self) -> str:
        return f"job pid {self.child.pid if self.child else '?'}"

    def sweep(self) -> list[leftovers.Leftover]:
        """End what the job left running (its session, our descendants); the survivors."""
        try:
            return leftovers.sweep(self.run, actor=ACTOR, observe_only=self.manifest.get("automatic") == "observe",
                                   stopping=self.terminate_requested is not None)
        except Exception as exc:  # noqa: BLE001 - the run's end must be written whatever happens here
            print(f"ups: could not check for processes left behind: {exc!r}", flush=True)
            return []

    def wait(self, reporter: Reporter | Any) -> int | None:
        assert self.child is not None
        deadline: float | None = None
        while True:
            try:
                return self.child.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                pass
            deadline = self._escalate(reporter, deadline)

    def _escalate(self, reporter: Reporter | Any, deadline: float | None) -> float | None:
        """After a stop request: SIGKILL the job's group once the grace period is over."""
        if self.terminate_requested and deadline is None:
            deadline = time.monotonic() + self._grace()
            reporter.item(f"stopping job ({self.terminate_requested})")
        if deadline is not None and time.monotonic() > deadline:
            self.signal_job(signal.SIGKILL)
        return deadline

    def _grace(self) -> float:
        """Seconds between SIGTERM and SIGKILL for the job: ours, or less if ``ups kill --grace``
        asked for less (it waits that long plus a margin for us before it kills the launcher,
        and a launcher killed cannot end what the job left behind)."""
        try:
            kills = [e for e in self.run.read_events() if e.get("event") == "kill" and e.get("target") == "run"]
            asked = float(kills[-1]["grace"]) if kills and kills[-1].get("grace") is not None else TERM_GRACE_S
        except (OSError, ValueError, TypeError, KeyError):
            asked = TERM_GRACE_S
        return max(0.0, min(TERM_GRACE_S, asked))

    def finish(self, returncode: int | None) -> int:
        # Give the job's processes a moment to write their final records (no wait when they
        # already have: the run's end is on the critical path of every followed launch).
        deadline = time.monotonic() + 0.2
        while time.monotonic() < deadline and not _all_final(self.run):
            time.sleep(0.02)
        self.stacks.stop()
        self.exits.stop()  # the job's own ends; what the sweep ends below is the launcher's doing
        survivors = self.sweep()
        view = node_view(load_run_view(self.run))  # this node's processes: each node finishes its own
        outcome = finalize(view, End(returncode, self.terminate_requested is not None, dict(self.exits.exits)))
        if survivors:
            outcome = Outcome(outcome.state, f"{outcome.summary}; {leftovers.describe(survivors)}", outcome.failure,
                              {**outcome.extra, "leftovers": [s.__dict__ for s in survivors]})
        self.run.set_state(
            outcome.state,
            exit_code=returncode if returncode is None or returncode >= 0 else None,
            signal=signal_name(-returncode) if returncode is not None and returncode < 0 else None,
            summary=outcome.summary,
            failure=outcome.failure,
            **outcome.extra,
        )
        self.run.append_event(
            "exit",
            actor=ACTOR,
            state=outcome.state,
            returncode=returncode,
            detail=describe_returncode(returncode),
            summary=outcome.summary,
        )
        record_verdict(self.run)
        return {"succeeded": 0, "partial": 3}.get(outcome.state, 1)


def _all_final(run: RunDir) -> bool:
    """Every record of the job's processes says done or failed (the launcher's aside)."""
    try:
        records = [p.record for p in load_run_view(run).processes if p.record.role != "launcher"]
    except Exception:  # noqa: BLE001 - unreadable now: wait out the moment as before
        return False
    return bool(records) and all(r.is_final for r in records)


def record_verdict(run: RunDir) -> None:
    """The verdict of ``ups why`` on the ended run, kept in run.json beside the summary."""
    try:
        from ups.why import diagnose_view

        run.update_manifest(verdict=diagnose_view(load_run_view(run)).to_dict())
    except Exception as exc:  # noqa: BLE001 - the run's state is written; a verdict is a bonus
        print(f"ups: no verdict for the ended run: {exc!r}", flush=True)


class Adopter(Supervisor):
    """Takes over a run whose launcher died while its job runs on (``ups adopt``).

    The job is not our child: we cannot wait() for it. We watch it (every recorded process
    and the job's own pid) until all of it is gone, and take its exit code from its records."""

    def start(self) -> None:
        job = self.manifest.get("job") or {}
        self.job_pid, self.job_start = job.get("pid"), job.get("pid_start")
        self.pgid = job.get("pgid")
        previous = (self.manifest.get("previous_launchers") or [{}])[-1]
        self.run.append_event("adopt", actor=ACTOR, previous_launcher=previous.get("pid"), job_pid=self.job_pid)
        self.exits.start()
        self.stacks.start()

    def describe(self) -> str:
        return f"adopted job pid {self.job_pid}"

    def sweep(self) -> list[leftovers.Leftover]:
        return []  # the job is not in our session nor our descendant: nothing is provably ours

    def _job_alive(self) -> bool:
        if self.job_pid and (self.job_start is None or same_start(process_start_time(self.job_pid), self.job_start)):
            return process_start_time(self.job_pid) is not None
        view = node_view(load_run_view(self.run))
        return any(not p.record.is_final and p.verdict.health is not Health.DEAD
                   for p in view.processes if p.record.role != "launcher")

    def wait(self, reporter: Reporter | Any) -> int | None:
        deadline: float | None = None
        while self._job_alive():
            time.sleep(0.25)
            deadline = self._escalate(reporter, deadline)
        time.sleep(0.2)  # the last records
        from ups.launch.reconcile import derived_returncode

        return derived_returncode(node_view(load_run_view(self.run)))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    adopt = "--adopt" in args
    args = [a for a in args if a != "--adopt"]
    if len(args) != 1:
        print("usage: python -m ups.launch.supervise RUN_DIR [--adopt]", file=sys.stderr)
        return 2
    run = RunDir(args[0])
    sup = Adopter(run) if adopt else Supervisor(run)
    if not adopt:
        leftovers.become_subreaper()  # orphans of the job stay ours, to be ended with the run
    run.update_manifest(
        launcher={"pid": os.getpid(), "pid_start": this_process_start(), "pgid": os.getpgid(0), "adopted": adopt}
    )
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, sup._on_signal)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    name = process_name("launcher", host=hostname()) if run.is_multinode else None  # launcher@<host>
    with Reporter(run.path, role="launcher", phase="supervise", run_id=run.run_id, name=name) as reporter:
        try:
            sup.start()
        except OSError as exc:
            run.set_state("failed", summary=f"could not start the job: {exc}")
            run.append_event("exit", actor=ACTOR, state="failed", summary=str(exc))
            reporter.fail(f"could not start the job: {exc}")
            return 1
        reporter.item(sup.describe())
        rc = sup.wait(reporter)
        code = sup.finish(rc)
    return code


if __name__ == "__main__":
    sys.exit(main())
