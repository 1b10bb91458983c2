"""``ups attach --inject``: the in-process Reporter started inside an attached job's ranks through
PEP 768's ``sys.remote_exec`` (Python >= 3.14), on request only.

For each rank of the job it checks, from ``/proc``, that injection can work, and otherwise says
why in one line (the run stays attached, watched from outside):

* the rank's interpreter is CPython >= 3.14 (its ``libpython`` mapping, else its executable
  asked for ``sys.version_info``): ``sys.remote_exec`` exists from 3.14, and the caller must run
  the same major.minor version, so the call is made by the job's own interpreter;
* the rank's environment does not set ``PYTHON_DISABLE_REMOTE_DEBUG`` and its command line has no
  ``-X disable_remote_debug`` (its owner turned remote execution off: honoured);
* ptrace is allowed (``sys.remote_exec`` writes into the process's memory with the permission a
  debugger needs): the same user (or ``CAP_SYS_PTRACE``), Yama's ``ptrace_scope`` 0 (1 allows
  only descendants, and the job is never ups's descendant), not 3.

Then it writes a one-line script into the run folder (``inject/<name>.py``: it must stay there
until the process reads it, and nothing tells when that is) and runs ``<the job's python> -I -S
-c 'sys.remote_exec(pid, script)'``. The script runs :mod:`ups.attach.inproc` inside the process.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ups.attach.find import Job, Proc, environ, uid_of
from ups.runs.rundir import RunDir
from ups.status import procfs
from ups.status.confined import user_name

MIN_VERSION = (3, 14)
CALL_TIMEOUT_S = 20.0
AFTER = "attached without injection, from outside only"
INPROC = Path(__file__).with_name("inproc.py")
CALL = ("import sys\n"
        "if not hasattr(sys, 'remote_exec'): sys.exit('this interpreter has no sys.remote_exec')\n"
        "sys.remote_exec(int(sys.argv[1]), sys.argv[2])\n")
CAP_SYS_PTRACE = 19


@dataclass
class Outcome:
    """What --inject did for one process: ``sent`` (the script is queued in it) or why not."""

    pid: int
    name: str
    sent: bool
    reason: str | None = None

    def to_dict(self) -> dict:
        return {"pid": self.pid, "name": self.name, "sent": self.sent, "reason": self.reason}


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read(4 << 20).decode(errors="replace")
    except OSError:
        return None


def executable_of(pid: int) -> str | None:
    """The process's interpreter as a path this host can run: its ``/proc/PID/exe`` target,
    else that magic link itself (a deleted or another mount namespace's file)."""
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None
    return exe if os.path.isfile(exe) else f"/proc/{pid}/exe"


def python_version(pid: int, exe: str | None = None) -> tuple[tuple[int, ...], str] | None:
    """(version, text) of the CPython that ``pid`` runs: its libpython mapping names major.minor;
    the executable, asked (``-I -S``: nothing of the job's environment or site runs), gives the
    rest. None where neither can be read."""
    maps = _read(f"/proc/{pid}/maps") or ""
    mapped = re.search(r"/libpython(\d+)\.(\d+)", maps)
    exe = exe or executable_of(pid)
    if exe is not None:
        try:
            res = subprocess.run([exe, "-I", "-S", "-c", "import sys; print(*sys.version_info[:3], sys.version_info.releaselevel)"],
                                 capture_output=True, text=True, timeout=CALL_TIMEOUT_S, stdin=subprocess.DEVNULL)
            major, minor, micro, level = res.stdout.split()
            v = (int(major), int(minor), int(micro))
            if mapped is None or (int(mapped[1]), int(mapped[2])) == v[:2]:
                return v, f"{major}.{minor}.{micro}" + ("" if level == "final" else f" ({level})")
        except (OSError, ValueError, subprocess.SubprocessError):
            pass
    if mapped is not None:
        return (int(mapped[1]), int(mapped[2])), f"{mapped[1]}.{mapped[2]}"
    m = re.search(r"python(\d+)\.(\d+)", os.path.basename(exe or ""))
    return ((int(m[1]), int(m[2])), f"{m[1]}.{m[2]}") if m else None


def remote_debug_disabled(pid: int) -> str | None:
    """How the process's owner turned remote execution off (PEP 768), or None."""
    env = environ(pid) or {}
    if env.get("PYTHON_DISABLE_REMOTE_DEBUG"):
        return "PYTHON_DISABLE_REMOTE_DEBUG is set in its environment"
    args = procfs.cmdline(pid) or []
    if any(a == "-Xdisable_remote_debug" or (a == "disable_remote_debug" and i and args[i - 1] == "-X")
           for i, a in enumerate(args)):
        return "it runs with -X disable_remote_debug"
    return None


def has_cap_sys_ptrace() -> bool:
    eff = (procfs.status("self") or {}).get("CapEff")
    return bool(eff) and bool(int(eff, 16) >> CAP_SYS_PTRACE & 1)


def ptrace_refusal(pid: int) -> str | None:
    """Why the kernel would refuse to let us write into ``pid`` (as a debugger), or None."""
    fix = "run ups as the job's user, `sysctl kernel.yama.ptrace_scope=0` (Yama), or CAP_SYS_PTRACE"
    cap = has_cap_sys_ptrace()
    owner = uid_of(pid)
    if owner is not None and owner != os.geteuid() and not cap:
        return f"pid {pid} is another user's (uid {owner}): ptrace is refused ({fix})"
    scope = (_read("/proc/sys/kernel/yama/ptrace_scope") or "0").strip()
    if scope == "3":
        return "Yama's ptrace_scope is 3: no process may be traced until reboot"
    if scope in ("1", "2") and not cap:
        return (f"Yama's ptrace_scope is {scope}: only " + ("descendants" if scope == "1" else "CAP_SYS_PTRACE")
                + f" may be traced, and the job is not ups's ({fix})")
    return None


def interpreter_refusal(exe: str) -> str | None:
    """Why the job's interpreter must not be run by ups (it is run to read its version and to make
    the call): it, or a folder above it, belongs to a user other than root and you, or others can
    write it. What another user writes never runs as you (docs/safety.md)."""
    path = os.path.realpath(exe)
    here, what = path, "its interpreter"
    while True:
        try:
            st = os.stat(here)
        except OSError as exc:
            return f"{what} {here} cannot be read ({exc.strerror})"
        if st.st_uid not in (0, os.geteuid()):
            return f"{what} {here} belongs to {user_name(st.st_uid)}: ups does not run {path}"
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not (what != "its interpreter" and st.st_mode & stat.S_ISVTX):
            return f"others can write {what} {here}: ups does not run {path}"
        if here == "/":
            return None
        here, what = os.path.dirname(here), "the folder"


def refusal(p: Proc, version: tuple[tuple[int, ...], str] | None) -> str | None:
    """Why --inject cannot go into process ``p`` (whose ptrace :func:`inject_job` has checked
    first): its Python, or its owner's refusal; one line, with what the user can do; None: it can."""
    if version is None:
        return f"--inject: which Python {p.label} (pid {p.pid}) runs cannot be read from /proc; {AFTER}"
    if version[0][:2] < MIN_VERSION:
        return (f"--inject needs Python >= 3.14 in the job (PEP 768 sys.remote_exec); this job runs Python "
                f"{version[1]}: {AFTER}")
    off = remote_debug_disabled(p.pid)
    if off:
        return f"--inject: {p.label} (pid {p.pid}) refuses remote execution ({off}): honoured; {AFTER}"
    return None


def targets(job: Job) -> list[Proc]:
    """The processes the Reporter goes into: the ranks (the training processes). The agent,
    DataLoader workers and helpers stay watched from outside."""
    return [p for p in job.procs if p.role == "rank"]


def script_for(run: RunDir, p: Proc) -> str:
    """The one-line script for ``sys.remote_exec``, kept in the run folder (``inject/``): one
    expression, so nothing is bound in the program's ``__main__``."""
    spec = {"run_dir": str(run.path.resolve()), "run_id": run.run_id, "role": p.role, "name": p.name,
            "rank": p.rank, "local_rank": p.local_rank, "world_size": p.world_size}
    text = (f"__import__('runpy').run_path({str(INPROC)!r}, init_globals={{'UPS_INJECT': {spec!r}}}, "
            "run_name='__ups_inject__')\n")
    name = f"inject/{p.name}.py"
    run.write_file(name, text.encode())  # its folder made, no link followed
    return str(run.path.resolve() / name)


def inject(run: RunDir, p: Proc, exe: str) -> Outcome:
    script = script_for(run, p)
    env = {k: v for k, v in os.environ.items() if k != "PYTHON_DISABLE_REMOTE_DEBUG"}
    try:
        res = subprocess.run([exe, "-I", "-S", "-c", CALL, str(p.pid), script], capture_output=True, text=True,
                             timeout=CALL_TIMEOUT_S, env=env, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as exc:
        return Outcome(p.pid, p.name, False, f"--inject: {p.label} (pid {p.pid}): {exc}; {AFTER}")
    if res.returncode != 0:
        last = (res.stderr.strip().splitlines() or [f"exit code {res.returncode}"])[-1][:300]
        return Outcome(p.pid, p.name, False, f"--inject: sys.remote_exec into {p.label} (pid {p.pid}) failed: {last}; {AFTER}")
    return Outcome(p.pid, p.name, True)


def inject_job(run: RunDir, job: Job, *, actor: str = "cli") -> tuple[list[Outcome], list[str]]:
    """Try each rank; (what happened to each, the lines to show: a reason shared by every
    process once)."""
    outcomes: list[Outcome] = []
    versions: dict[str, tuple[tuple[int, ...], str] | None] = {}
    for p in targets(job):
        exe = executable_of(p.pid)
        # Nothing of the job runs before the kernel would let us trace it, and its interpreter is
        # run (for its version, then the call) only where no other user can have written it.
        why = None
        if (refused := ptrace_refusal(p.pid)) is not None:
            why = f"--inject: {refused}; {AFTER}"
        elif (owner := uid_of(p.pid)) not in (None, os.geteuid()):
            why = (f"--inject: {p.label} (pid {p.pid}) runs as another user (uid {owner}): its in-process reporter "
                   f"could neither read its script in your run folder nor write its record there; {AFTER}")
        elif exe is None:
            why = f"--inject: {p.label}'s interpreter cannot be found; {AFTER}"
        elif (bad := interpreter_refusal(exe)) is not None:
            why = f"--inject: {p.label} (pid {p.pid}): {bad}; {AFTER}"
        else:
            if exe not in versions:
                versions[exe] = python_version(p.pid, exe)
            why = refusal(p, versions[exe])
        outcomes.append(Outcome(p.pid, p.name, False, why) if why else inject(run, p, exe or ""))
    sent = [o for o in outcomes if o.sent]
    lines = list(dict.fromkeys(o.reason for o in outcomes if o.reason))
    if sent:
        lines.append(f"--inject: the in-process reporter is queued in {', '.join(f'{o.name} (pid {o.pid})' for o in sent)}: "
                     "each runs it at its next bytecode boundary (a process blocked inside a C call, such as a "
                     "collective's wait, runs it when that call returns); it stays until the process ends")
    if not outcomes:
        lines.append(f"--inject: the job has no rank to inject into; {AFTER}")
    run.append_event("attach.inject", actor=actor, processes=[o.to_dict() for o in outcomes])
    return outcomes, lines
