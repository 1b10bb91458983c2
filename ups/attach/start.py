"""An attached run's folder and its observer: ``ups attach PID``.

The folder is an ordinary run folder (:class:`ups.runs.rundir.RunDir`) of kind ``attached``:
its manifest names the job's top process (``job``: pid, start time, command; the anchor of
the ownership proofs every action takes, :class:`ups.runs.ownership.JobScope`), and under
``attached`` the processes found with their start times, who attached it and when, the log
read (``log_file``: the file as the job holds it, :func:`ups.attach.joblog.held_log`) and its
copy's cap (``log_cap``), and whether the folder is private (another user's job: mode 0700,
unless ``--share``). One observer process (:mod:`ups.attach.observe`) is its only writer from then on.
"""

from __future__ import annotations

import getpass
import os
import subprocess
import sys
import time
from pathlib import Path

from ups.attach.find import Job, node_names, session_led, uid_of, watched_pids
from ups.attach.joblog import LOG_CAP, held_log
from ups.errors import UpsError
from ups.runs.rundir import RunDir

KIND = "attached"
OBSERVER_MODULE = "ups.attach.observe"
START_WAIT_S = 20.0
PRIVATE_MODE = 0o700  # the run folder of another user's job, unless --share
THRESHOLDS = {"stalled_after": 15.0, "startup_grace": 0.0}
"""Seen from outside, a process makes progress when it is seen working (a busy window, or a
different stack than the last dump); 15 s without (three idle windows and a stack read twice
the same) is stalled. Nothing is known of start-up: no grace."""


def who() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())


def check_attachable(job: Job, runs_root: str | os.PathLike[str]) -> None:
    if job.launched_by_ups:
        raise UpsError(f"pid {job.given} belongs to a job started by ups launch (run folder {job.launched_by_ups}): "
                       "ups already watches it (`ups status`)")
    taken = watched_pids(runs_root) & {p.pid for p in job.procs}
    if taken:
        raise UpsError(f"pid {job.given}'s job is already attached (an observer under {runs_root} watches pid "
                       f"{min(taken)}): `ups runs` lists it")


def multinode_of(job: Job, run_id: str | None) -> dict[str, int | None] | None:
    """A job of several nodes attached with ``--run-id``: this node joins that run (each node's
    ``ups attach`` with the same id makes one run, as ``ups launch`` does); None otherwise."""
    if run_id is None or (job.nnodes or 1) < 2:
        return None
    return {"nnodes": job.nnodes, "node_rank": job.node_rank}


def create_run(job: Job, runs_root: str | os.PathLike[str], *, run_id: str | None = None,
               fields: dict | None = None, share: bool = False, log_cap: int = LOG_CAP) -> RunDir:
    top = job.top_proc
    job_entry = {"pid": top.pid, "pid_start": top.start, "command": top.argv}
    if session_led(top.pid) is not None:
        job_entry["sid"] = top.pid  # the top leads its session: the session proves its members
    if len(job.root_pids) > 1:
        # Orphaned ranks share no parent: each is a root of the job (and leads its session).
        starts = {p.pid: p.start for p in job.procs}
        job_entry["roots"] = [{"pid": pid, "pid_start": starts.get(pid), "sid": session_led(pid)}
                              for pid in job.root_pids]
    multinode = multinode_of(job, run_id)
    if multinode is not None:
        from ups.status.host import hostname

        node_names(job.procs, hostname())
    name = "attached-" + (os.path.basename(next((a for a in top.argv[1:] if a.endswith(".py")), top.argv[0] if top.argv else "job"))
                          .removesuffix(".py"))
    extra = {
        "job": job_entry,
        "automatic": "observe",
        "instrument": False,
        "world_size": job.world_size,
        "thresholds": THRESHOLDS,
        "attached": {"by": who(), "at": time.time(), "given_pid": job.given, "log": job.log,
                     "log_file": held_log(job), "log_cap": log_cap, "log_pane": job.log_pane,
                     "processes": [{"pid": p.pid, "start": p.start, "role": p.role, "name": p.name, "rank": p.rank,
                                    "local_rank": p.local_rank}
                                   for p in job.procs]},
        **(fields or {}),  # --notify's targets, --inject (ups.cli.attach)
    }
    if job.orphan:
        extra["attached"]["orphan"] = True
    if job.slurm is not None:
        extra["attached"]["slurm"] = job.slurm.to_dict()  # job id, step, node, user: shown by status and the console
    private = not share and others_job(job)
    extra["attached"]["private"] = private
    run = RunDir.create(runs_root, KIND, argv=list(top.argv), extra=extra, name=name, run_id=run_id,
                        multinode=multinode)
    if private:
        # Its stacks (and a worker's locals) and log come from a process others cannot read:
        # the run folder is this user's alone (docs/safety.md), unless --share.
        with run.folder() as fd:
            os.fchmod(fd, PRIVATE_MODE)
    return run


def others_job(job: Job) -> bool:
    """Some process of the job runs as another user than ups (root attaching a user's job)."""
    me = os.geteuid()
    return any(uid not in (None, me) for uid in (uid_of(p.pid) for p in job.procs))


def start_observer(run: RunDir) -> subprocess.Popen[bytes]:
    """The observer, detached (a session of its own), its output in ``logs/launcher.log``."""
    log = os.fdopen(run.open_log("launcher"), "ab")  # never through a link; handed to the child
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("UPS_")
               or k in ("UPS_RUNS_DIR", "UPS_HOSTNAME", "UPS_NO_TASKSTATS")
               or k.startswith("UPS_NOTIFY_")}  # the notifier's time limit and rate, as a launcher has them
        here = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = here + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        return subprocess.Popen([sys.executable, "-m", OBSERVER_MODULE, str(run.path.resolve())],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, env=env, cwd="/")
    finally:
        log.close()


def wait_started(run: RunDir, proc: subprocess.Popen[bytes], timeout: float = START_WAIT_S) -> None:
    from ups.status.host import hostname
    from ups.status.schema import process_name

    record = process_name("launcher", host=hostname() if run.is_multinode else None)  # launcher@<host> on a node
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (run.status_dir / f"{record}.json").exists():
            return
        if proc.poll() is not None:
            raise UpsError(f"the observer of run {run.run_id} ended at once (exit {proc.returncode}): "
                           f"see {run.log_path('launcher')}")
        time.sleep(0.05)
    raise UpsError(f"the observer of run {run.run_id} wrote nothing within {timeout:g} s: see {run.log_path('launcher')}")


def attach_job(job: Job, runs_root: str | os.PathLike[str], *, actor: str, run_id: str | None = None,
               fields: dict | None = None, share: bool = False,
               log_cap: int = LOG_CAP) -> tuple[RunDir, subprocess.Popen[bytes]]:
    """Make ``job`` an attached run and start its observer (``ups attach`` and the console's
    attach key): refused in one line (UpsError) when ups already watches it; the ``attach``
    event names who attached it and what was found. ``fields``: more of run.json (``notify``,
    ``inject``). ``share``: another user's job's run folder readable by all (else private);
    ``log_cap``: the log copy's cap in bytes."""
    check_attachable(job, runs_root)
    run = create_run(job, runs_root, run_id=run_id, fields=fields, share=share, log_cap=log_cap)
    proc = start_observer(run)
    wait_started(run, proc)
    more: dict[str, object] = {}
    if job.orphan:
        more["orphan"] = "its torchrun agent is gone; its ranks left on this host are watched as one job"
    if run.is_multinode:
        from ups.status.host import hostname

        more["node"] = hostname()
    run.append_event("attach", actor=actor, pid=job.given, top=job.top,
                     processes=[{"pid": p.pid, "name": p.name} for p in job.procs], log=job.log, **more)
    return run, proc
