"""A job that SLURM started, seen from ``/proc``: the one place ups reads SLURM's environment
and its ``scontrol`` for an attach.

``srun`` starts each task of a step as a child of that step's ``slurmstepd: [JOB.STEP]``, with
the step in its environment: ``SLURM_JOB_ID``, ``SLURM_STEP_ID``, ``SLURM_PROCID`` (the task,
and the rank of a script that takes its rank from SLURM), ``SLURM_NTASKS``, ``SLURM_LOCALID``,
``SLURMD_NODENAME`` and ``SLURM_JOB_USER``. Those tasks, with no torchrun between them and
slurmstepd, are the step's ranks: the tasks of one step on this node are one job.

The tasks' output goes through pipes to slurmstepd, and on to ``srun``, which writes the job's
output file (``slurm-%j.out`` by default). That file is found as what the batch script or
``srun`` of the same job (its own environment names the job) writes its stdout or stderr to;
where neither runs on this node, as ``scontrol show job``'s ``StdOut``.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from dataclasses import asdict, dataclass

from ups.status.procfs import comm, environ
from ups.status.procfs import stat as proc_stat

STEPD = "slurmstepd"
KEYS = ("SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NODEID",
        "SLURMD_NODENAME", "SLURM_JOB_USER", "SLURM_JOB_NAME")
SCONTROL_S = 5.0


@dataclass
class Step:
    """The SLURM step a task belongs to, from its environment."""

    job_id: str
    step_id: str
    ntasks: int | None
    node: str | None
    user: str | None
    name: str | None

    def describe(self) -> str:
        who = ", ".join(x for x in (f"user {self.user}" if self.user else "", f"node {self.node}" if self.node else "") if x)
        return f"SLURM job {self.job_id} step {self.step_id}" + (f" ({who})" if who else "")

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def _int(v: str | None) -> int | None:
    return int(v) if v is not None and v.strip().isdigit() else None  # SLURM's ids and counts: never negative


def env_of(env: dict[str, str] | None) -> dict[str, str]:
    """The SLURM variables of a task's environment that name its step and place."""
    return {k: v for k, v in (env or {}).items() if k in KEYS}


def step_of(env: dict[str, str] | None) -> Step | None:
    """The step a process's environment names (a task of ``srun``); None outside a step (the
    batch script, srun itself and any process outside SLURM name no step)."""
    env = env or {}
    step = env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID")
    if not env.get("SLURM_JOB_ID") or step is None or env.get("SLURM_PROCID") is None:
        return None
    return Step(env["SLURM_JOB_ID"], step, _int(env.get("SLURM_NTASKS")), env.get("SLURMD_NODENAME"),
                env.get("SLURM_JOB_USER"), env.get("SLURM_JOB_NAME"))


def stepd_of(pid: int) -> int | None:
    """The pid of ``slurmstepd`` when it is ``pid``'s parent, else None."""
    st = proc_stat(pid)
    if st is None or st.gone or st.ppid <= 1:
        return None
    return st.ppid if comm(st.ppid) == STEPD else None


def task_rank(pid: int, env: dict[str, str] | None) -> tuple[int, int | None, int | None] | None:
    """(rank, world size, local rank) of a task ``srun`` started, straight under slurmstepd:
    its SLURM_PROCID, SLURM_NTASKS and SLURM_LOCALID; None for any other process."""
    if step_of(env) is None or stepd_of(pid) is None:
        return None
    assert env is not None
    rank = _int(env.get("SLURM_PROCID"))
    return None if rank is None else (rank, _int(env.get("SLURM_NTASKS")), _int(env.get("SLURM_LOCALID")))


def step_tasks(stepd: int, kids: dict[int, list[int]], job_id: str, step_id: str) -> list[int]:
    """The tasks of one step under its slurmstepd, by their environment."""
    out = []
    for pid in sorted(kids.get(stepd, [])):
        s = step_of(environ(pid))
        if s is not None and (s.job_id, s.step_id) == (job_id, step_id):
            out.append(pid)
    return out


def output_file(job_id: str, log_of: Callable[[int], str | None]) -> tuple[str | None, int | None]:
    """The job's output file and the process that holds it open: where a process of the job
    outside any step (its batch script, an ``srun``) writes on this node (``log_of``: a
    process's stdout or stderr when that is a regular file); else ``scontrol show job``'s
    StdOut, where that file exists here, held by no process ups can prove (it is then not
    read: :mod:`ups.attach.joblog` reads a log only through a process's open file); (None, None)
    where neither tells."""
    for name in sorted(os.listdir("/proc"), key=lambda n: int(n) if n.isdigit() else 0):
        if not name.isdigit() or comm(int(name)) == STEPD:
            continue
        env = environ(int(name))
        if not env or env.get("SLURM_JOB_ID") != job_id or step_of(env) is not None:
            continue
        found = log_of(int(name))
        if found:
            return found, int(name)
    try:
        out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True,
                             timeout=SCONTROL_S, stdin=subprocess.DEVNULL).stdout
    except (OSError, subprocess.SubprocessError):
        return None, None
    fields = dict(f.split("=", 1) for f in out.split() if "=" in f)
    path = fields.get("StdOut")
    return (path if path and os.path.isfile(path) else None), None
