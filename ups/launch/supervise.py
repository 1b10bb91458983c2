"""The launcher process: owns one job, reports on it, and records how it ended.

``ups launch`` creates the run directory and starts ``python -m ups.launch.supervise RUN``
in a new session (``start_new_session``): closing the terminal or losing SSH never stops it.
The supervisor starts the job command stored in run.json, forwards SIGTERM/SIGINT to it,
waits, and writes the final state, exit code and signal into run.json and the event log.
It is the job's child subreaper and leads the job's session: when the job's top process
ends, whatever the job left running is ended too, and a survivor is named in the run's end
(:mod:`ups.launch.leftovers`). What it does about a proven hang (kill, restart, each attempt's
record) is :mod:`ups.launch.restarts`; how it writes the run's end, :mod:`ups.launch.ending`.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from ups.errors import Refused
from ups.launch import leftovers
from ups.launch.autostacks import StackCollector
from ups.launch.ending import all_final, notify_end, say_gone, write_end
from ups.launch.exits import ExitWatcher
from ups.launch.metrics_port import start_metrics_endpoint
from ups.launch.pending import LauncherRun
from ups.launch.restarts import Restarts
from ups.runs.outcome import describe_returncode
from ups.runs.rundir import RunDir
from ups.runs.signals import signal_name
from ups.runs.view import load_run_view, node_view
from ups.status.health import Health
from ups.status.host import ENV_HOSTNAME, hostname
from ups.status.procs import process_start_time, same_start, this_process_start
from ups.status.reporter import ENV_RUN_DIR, ENV_RUN_ID, Reporter
from ups.status.schema import process_name

ACTOR = "launcher"
TERM_GRACE_S = 10.0
PIPE_BYTES = 1 << 20  # the job's output pipe: a burst of output never waits on the relay
RELAY_END_S = 3.0  # after the job: how long its output may still drain (a daemon it left may hold the pipe)


def _own_process_group() -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        return {"process_group": 0}
    return {"preexec_fn": os.setpgrp}  # pragma: no cover - Python 3.10


class Supervisor:
    """The launcher of one run: its job's processes, their signals, their ends and the run's end.

    ``job`` says how it holds the job: :class:`ChildJob` (``ups launch``: our child, started
    here) or :class:`AdoptedJob` (``ups adopt``: a job whose launcher died, taken over)."""

    def __init__(self, run: RunDir, job: ChildJob | AdoptedJob | None = None) -> None:
        from ups.runs.ownership import OwnRun

        self.run = run
        self.job = job if job is not None else ChildJob()
        # What the job runs (its command, env, cwd, notification commands) is read through the
        # proof that the run is this user's: a launcher never runs what someone else wrote.
        with OwnRun(run.path, nothing="nothing started") as own:
            self.exec = own.launch_fields()
        self.manifest = run.read_manifest()
        self.child: subprocess.Popen[bytes] | None = None
        self.pgid: int | None = None  # the job's process group: every signal goes to all of it
        self.terminate_requested: str | None = None
        self.exits = ExitWatcher(run, actor=ACTOR)
        self.stacks = StackCollector(run, actor=ACTOR, observe_only=self.manifest.get("automatic") == "observe")
        self.attempt = int(self.manifest.get("attempt") or 1)
        self.restarts = Restarts(self)  # --on-hang: the decisions carried out on this job (ups.launch.restarts)
        self.extra_env: dict[str, str] = {}  # for the next attempt (UPS_FORCE_NUM_WORKERS on a worker fallback)
        self.attempt_started_at = time.time()  # this attempt's start (start() sets it again)
        from ups.notify import Notifier

        self.notifier = Notifier.for_run(run, self.exec)  # --notify, or the user's config; None: nobody to tell
        self.relay: subprocess.Popen[bytes] | None = None
        self.relay_thread: threading.Thread | None = None
        self.relay_report: dict[str, Any] | None = None
        self.folder_gone: str | None = None  # the run folder was deleted or replaced (see check_folder)
        self.output_progress: dict[str, Any] | None = None  # ups.launch.lineprogress, from the relay

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
        env.update(self.exec.get("env") or {})
        env[ENV_RUN_DIR] = str(self.run.path.resolve())
        env[ENV_RUN_ID] = self.run.run_id
        env["UPS_AUTOMATIC"] = self.manifest.get("automatic") or "act"  # jobs' own watchdogs obey it too
        # A restart after a hang continues the metrics series as attempt N+1 (a run made by
        # `ups relaunch` starts from the attempt after its predecessor's: its env says which).
        first = int((self.exec.get("env") or {}).get("UPS_ATTEMPT") or 1)
        env["UPS_ATTEMPT"] = str(first + self.attempt - 1)
        env.update(self.extra_env)
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
        self.job.start(self)

    def start_relay(self, read_end: int) -> None:
        log_fd = self.run.open_log("job")
        try:
            self.relay = subprocess.Popen([sys.executable, "-m", "ups.launch.logrelay", str(log_fd)], stdin=read_end,
                                          stdout=subprocess.PIPE, pass_fds=(log_fd,), env=_relay_env())
        finally:
            os.close(log_fd)
        self.relay_thread = threading.Thread(target=self._read_relay, name="ups-log-relay", daemon=True)
        self.relay_thread.start()

    def _read_relay(self) -> None:
        assert self.relay is not None and self.relay.stdout is not None
        for line in self.relay.stdout:
            try:
                report = json.loads(line)
            except ValueError:
                continue
            if isinstance(report, dict) and isinstance(report.get("progress"), dict):
                self.output_progress = report["progress"]  # the counter the program prints
                continue
            if isinstance(report, dict):
                self.relay_report = report
                if "since" in report and report.get("error") and not report.get("end") and "resumed" not in report:
                    self.run.append_event("log.dropping", actor=ACTOR, error=report["error"], since=report["since"])

    def output_dropped(self) -> dict[str, Any] | None:
        """What the relay could not write to the job's log (None: nothing was dropped)."""
        if self.relay is not None:
            try:
                self.relay.wait(timeout=RELAY_END_S)
            except subprocess.TimeoutExpired:
                pass  # a process the job left holds the pipe: the count so far
            if self.relay_thread is not None:
                self.relay_thread.join(timeout=1.0)
        report = self.relay_report or {}
        if not report.get("dropped"):
            return None
        return {k: report.get(k) for k in ("dropped", "total", "error", "episodes") if report.get(k) is not None}

    def describe(self) -> str:
        return self.job.describe(self)

    def sweep(self) -> list[leftovers.Leftover]:
        """End what the job left running (its session, our descendants); the survivors."""
        return self.job.sweep(self)

    def wait(self, reporter: Reporter | Any) -> int | None:
        """Until the job has ended: its exit code, None when nobody can know it."""
        return self.job.wait(self, reporter)

    def check_folder(self) -> bool:
        """True once the run folder is gone (deleted, or replaced by another folder): the job
        is the user's and goes on; this launcher writes nothing more, acts on nothing, and
        ends with the job. Said once on stderr and to syslog (its own log went with the folder)."""
        if self.folder_gone is None and isinstance(self.run, LauncherRun):
            self.folder_gone = self.run.gone()
            if self.folder_gone:
                say_gone(f"ups launcher (pid {os.getpid()}): run folder {self.run.path} was {self.folder_gone}; "
                         f"the job ({self.describe()}) goes on, and this launcher ends when it does")
        return self.folder_gone is not None

    def escalate(self, reporter: Reporter | Any, deadline: float | None) -> float | None:
        """After a stop request: SIGKILL the job's group once the grace period is over."""
        if self.terminate_requested and deadline is None:
            deadline = time.monotonic() + self._grace()
            reporter.item(f"stopping job ({self.terminate_requested})")
        if deadline is not None and time.monotonic() > deadline:
            self.signal_job(signal.SIGKILL)
        return deadline

    def retry_pending(self) -> None:
        if isinstance(self.run, LauncherRun) and self.run.pending:
            self.run.flush_pending()

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
        if self.check_folder():
            # Nothing to record the end in: end what the job left behind, say so, and go.
            self.stacks.stop()
            self.exits.stop()
            survivors = self.sweep()
            say_gone(f"ups launcher (pid {os.getpid()}): the job ended ({describe_returncode(returncode)}); "
                     f"its run folder {self.run.path} was {self.folder_gone}, so nothing was recorded"
                     + (f"; {leftovers.describe(survivors)}" if survivors else ""))
            return 0 if returncode == 0 else 1
        # Give the job's processes a moment to write their final records (no wait when they
        # already have: the run's end is on the critical path of every followed launch).
        deadline = time.monotonic() + 0.2
        while time.monotonic() < deadline and not all_final(self.run):
            time.sleep(0.02)
        self.stacks.stop()
        self.exits.stop()  # the job's own ends; what the sweep ends below is the launcher's doing
        survivors = self.sweep()  # first: a process the job left may hold its output pipe open
        dropped = self.output_dropped()
        return write_end(self.run, returncode, exits=dict(self.exits.exits), survivors=survivors, dropped=dropped,
                         restarts=self.restarts, asked_to_stop=lambda: self.terminate_requested is not None)


class ChildJob:
    """The job as the launcher's child (``ups launch``): started here, in its own process group
    and our session, waited for, and what it leaves behind is ours to end."""

    def start(self, sup: Supervisor) -> None:
        command = list(sup.exec.get("command") or [])
        if not command:
            raise OSError(f"{sup.run.path}/run.json names no command")
        # The job's stdout and stderr go to a pipe that the relay drains into logs/job.log
        # (see ups.launch.logrelay): a full disk drops output, never the program.
        read_end, write_end = os.pipe()
        try:
            fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        except OSError:
            pass  # the default 64 KiB (a lower pipe-max-size): still correct, only less slack
        try:
            sup.start_relay(read_end)
        finally:
            os.close(read_end)
        try:
            sup.child = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=write_end,
                stderr=subprocess.STDOUT,
                env=sup.job_env(),
                cwd=sup.exec.get("cwd") or None,
                **_own_process_group(),
            )
        finally:
            os.close(write_end)  # only the job holds it now: the relay sees the end when the job's is
        sup.pgid = sup.child.pid
        sup.attempt_started_at = time.time()
        sup.run.update_manifest(
            state="running",
            job={"pid": sup.child.pid, "pid_start": process_start_time(sup.child.pid), "pgid": sup.child.pid,
                 "sid": os.getsid(0), "command": command},  # sid: the proof that a pid is the job's (ups.runs.ownership)
        )
        sup.run.append_event("start", actor=ACTOR, pid=sup.child.pid, command=command)
        sup.exits.start()
        sup.stacks.start()

    def describe(self, sup: Supervisor) -> str:
        return f"job pid {sup.child.pid if sup.child else '?'}"

    def sweep(self, sup: Supervisor) -> list[leftovers.Leftover]:
        try:
            return leftovers.sweep(sup.run, actor=ACTOR, observe_only=sup.manifest.get("automatic") == "observe",
                                   stopping=sup.terminate_requested is not None,
                                   keep={sup.relay.pid} if sup.relay is not None else set())
        except Exception as exc:  # noqa: BLE001 - the run's end must be written whatever happens here
            print(f"ups: could not check for processes left behind: {exc!r}", flush=True)
            return []

    def wait(self, sup: Supervisor, reporter: Reporter | Any) -> int | None:
        assert sup.child is not None
        deadline: float | None = None
        while True:
            try:
                return sup.child.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                pass
            deadline = sup.escalate(reporter, deadline)
            if sup.check_folder():
                continue  # nothing to read or write: the job goes on, and we end with it
            sup.retry_pending()
            if sup.terminate_requested is None:
                sup.restarts.watch(reporter)


class AdoptedJob:
    """A job whose launcher died while it runs on (``ups adopt``), taken over.

    The job is not our child: we cannot wait() for it. We watch it (every recorded process
    and the job's own pid) until all of it is gone, and take its exit code from its records."""

    def __init__(self) -> None:
        self.pid: int | None = None
        self.pid_start: float | None = None

    def start(self, sup: Supervisor) -> None:
        job = sup.manifest.get("job") or {}
        self.pid, self.pid_start = job.get("pid"), job.get("pid_start")
        sup.pgid = job.get("pgid")
        previous = (sup.manifest.get("previous_launchers") or [{}])[-1]
        sup.run.append_event("adopt", actor=ACTOR, previous_launcher=previous.get("pid"), job_pid=self.pid)
        sup.exits.start()
        sup.stacks.start()

    def describe(self, sup: Supervisor) -> str:
        return f"adopted job pid {self.pid}"

    def sweep(self, sup: Supervisor) -> list[leftovers.Leftover]:
        return []  # the job is not in our session nor our descendant: nothing is provably ours

    def alive(self, sup: Supervisor) -> bool:
        if self.pid and (self.pid_start is None or same_start(process_start_time(self.pid), self.pid_start)):
            return process_start_time(self.pid) is not None
        if sup.folder_gone:
            return False  # no records left to tell: nothing left to supervise
        view = node_view(load_run_view(sup.run))
        return any(not p.record.is_final and p.verdict.health is not Health.DEAD
                   for p in view.processes if p.record.role != "launcher")

    def wait(self, sup: Supervisor, reporter: Reporter | Any) -> int | None:
        deadline: float | None = None
        while self.alive(sup):
            time.sleep(0.25)
            deadline = sup.escalate(reporter, deadline)
            sup.check_folder()
        time.sleep(0.2)  # the last records
        from ups.runs.settle import derived_returncode

        view = node_view(load_run_view(sup.run))
        return derived_returncode(view.kind, [p.record for p in view.processes])


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    adopt = "--adopt" in args
    args = [a for a in args if a != "--adopt"]
    if len(args) != 1:
        print("usage: python -m ups.launch.supervise RUN_DIR [--adopt]", file=sys.stderr)
        return 2
    _tolerant_streams()
    run = LauncherRun(args[0])
    try:
        sup = Supervisor(run, AdoptedJob() if adopt else ChildJob())
    except Refused as exc:  # not provably this user's run: nothing is started, nothing written
        print(f"ups: {exc}", file=sys.stderr, flush=True)
        return 2
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
        start_metrics_endpoint(run, sup.manifest, actor=ACTOR)  # --metrics-port: this run's /metrics
        try:
            sup.start()
        except OSError as exc:
            run.set_state("failed", summary=f"could not start the job: {exc}")
            run.flush_pending()
            run.append_event("exit", actor=ACTOR, state="failed", summary=str(exc))
            reporter.fail(f"could not start the job: {exc}")
            return 1
        reporter.item(sup.describe())
        rc = sup.wait(reporter)
        code = sup.finish(rc)
    if sup.folder_gone is None:
        notify_end(run, sup.notifier)
    return code


class _TolerantStream:
    """The launcher's stdout/stderr (logs/launcher.log): a write that fails (a full disk) is
    dropped; the launcher never dies of its own log."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except (OSError, ValueError):
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except (OSError, ValueError):
            pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _tolerant_streams() -> None:
    sys.stdout = _TolerantStream(sys.stdout)  # type: ignore[assignment]
    sys.stderr = _TolerantStream(sys.stderr)  # type: ignore[assignment]


def _relay_env() -> dict[str, str]:
    """The relay's environment: this one, without a job's instrumentation."""
    return {k: v for k, v in os.environ.items() if not k.startswith("UPS_")}


if __name__ == "__main__":
    sys.exit(main())
