"""Which processes are the job's: the proof every signal from ``ups`` needs first.

A record's word is never enough: anyone who can write a file under a runs folder can name
any pid with its true start time. A pid is signalled only when the kernel's own facts tie it
to the run:

* the run is the acting user's: the run folder and ``run.json`` belong to the user running
  ``ups`` (``run.json`` not writable by anyone else), and so does the record that names the
  pid. A run another user owns is read, never acted on;
* the process belongs to the run's owner (real and effective uid), and is never pid 1 (or
  lower), nor the acting command or one of its parents;
* and it is provably the job's, one of:
  - the run's launcher itself: the pid and start time ``run.json`` records **and** its
    command line is ``python -m ups.launch.supervise <this run folder>`` (an attached run's:
    ``python -m ups.attach.observe <this run folder>``);
  - a descendant of that launcher, of the job's top process (its pid and start time as
    run.json records them), or of the acting process (a job's own watchdog acting on its
    DataLoader workers), by the ``PPid`` chain in ``/proc``;
  - a member of the job's session: the launcher starts in a session of its own and the job
    inside it, so its processes carry the launcher's pid as session id. Session ids are not
    reused while any member lives, so the session is ours when its leader is alive with the
    recorded start time, or gone altogether (then only the old session's members can carry
    that id). A leader pid alive with another start time means the old session is gone.
    An attached job's orphaned ranks (their torchrun agent died) are each a root of the job
    as its top process is (``job.roots`` in run.json), each the leader of its own session.

The trust root is run.json (the acting user's, writable by no one else), and for a multi-node
run this host's ``nodes/<host>.json`` under the same checks; status records are
the job's word and prove nothing alone. Everything else here is read from ``/proc``.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ups.errors import Refused, RefusedSignal
from ups.status import procfs
from ups.status.confined import user_name
from ups.status.procfs import cmdline
from ups.status.procs import process_start_time, same_start

SUPERVISOR_MODULE = "ups.launch.supervise"
OBSERVER_MODULE = "ups.attach.observe"  # an attached run's launcher: it watches, and starts nothing
MAX_DEPTH = 256  # a PPid chain longer than this is not one we started


@dataclass(frozen=True)
class ProcInfo:
    """What the kernel says of a live process (``/proc/PID/stat`` and ``status``)."""

    pid: int
    ppid: int
    pgid: int
    sid: int
    uid: int  # real
    euid: int
    start: float | None


def proc_info(pid: int) -> ProcInfo | None:
    """The process's parent, group, session and owner; None when it is gone (or a zombie)."""
    if pid <= 0:
        return None
    st = procfs.stat(pid)
    status = procfs.status(pid)
    if st is None or st.gone or status is None:
        return None
    try:
        uids = status["Uid"].split()[:2]
        return ProcInfo(pid, st.ppid, st.pgrp, st.session, int(uids[0]), int(uids[1]), process_start_time(pid))
    except (KeyError, ValueError, IndexError):
        return None


def caught_signals(pid: int) -> int | None:
    """The process's caught-signal mask (``SigCgt``: bit N-1 set when signal N has a handler)."""
    try:
        return int((procfs.status(pid) or {})["SigCgt"], 16)
    except (KeyError, ValueError):
        return None


def catches(pid: int, signum: int) -> bool | None:
    """Whether the process has a handler for ``signum`` now (None: cannot tell)."""
    mask = caught_signals(pid)
    return None if mask is None else bool(mask >> (int(signum) - 1) & 1)


def _same_folder(a: str, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


class OwnRun:
    """A run folder proven to be the acting user's, opened once: the one proof behind every
    action that signals a process of a run or turns what a run holds into a process (a
    relaunch, a restart, a fallback, a pipeline's stages, an adopting launcher).

    The folder and its ``run.json`` belong to the acting user and no one else may write
    them, and ``events.jsonl`` (where every action is logged) is a regular file of theirs.
    The folder is opened once and every file is read through that descriptor, so what was
    proven is what is read: swapping a folder or a file for another one (a shared 1777 runs
    folder lets anyone create, though not replace, entries) after the check changes nothing.
    Anything else raises :class:`~ups.errors.Refused` with one line saying whose it is and why.

    ``manifest`` is run.json as written (decoded JSON, not made safe for display): what is run
    is exactly what this user wrote. ``dir_fd``: the folder as the caller opened it (a node
    joining a multi-node run proves what it opened ``O_NOFOLLOW``, before it writes there)."""

    def __init__(self, run_path: str | os.PathLike[str], *, nothing: str = "nothing acted on",
                 error: type[Refused] = Refused, dir_fd: int | None = None) -> None:
        from ups.status.safeio import BadFile, decode_json

        self.path = Path(run_path)
        self.owner = os.geteuid()
        self._error, self._nothing = error, nothing
        try:  # dir_fd: the folder already opened (never through a link) by the caller
            self._dir = os.dup(dir_fd) if dir_fd is not None else os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise error(f"{self.path} is not a run folder (no such folder): {nothing}") from None
        except NotADirectoryError:
            raise error(f"{self.path} is not a run folder (not a folder): {nothing}") from None
        except OSError as exc:
            raise error(f"{self.path}: cannot open the run folder ({exc.strerror or exc}): {nothing}") from None
        try:
            self._check("run folder", os.fstat(self._dir))
            try:
                st = os.stat("run.json", dir_fd=self._dir, follow_symlinks=False)
            except FileNotFoundError:
                raise error(f"{self.path} is not a run folder (no run.json): {nothing}") from None
            if not stat.S_ISREG(st.st_mode):
                raise error(f"{self.path} is not a run folder (run.json is not a regular file): {nothing}")
            self._check("run.json", st)
            try:
                events = os.stat("events.jsonl", dir_fd=self._dir, follow_symlinks=False)
            except FileNotFoundError:
                events = None
            if events is not None and (not stat.S_ISREG(events.st_mode) or events.st_uid != self.owner):
                raise error(f"{self.path}/events.jsonl is not a regular file of yours (a link or another user's): "
                            f"ups acts only where it can log what it does; {nothing}")
            try:
                manifest = decode_json(self.read("run.json"))
            except (OSError, BadFile) as exc:
                raise error(f"{self.path}/run.json is unreadable ({exc}): {nothing}") from None
            if not isinstance(manifest, dict):
                raise error(f"{self.path}/run.json is not a JSON object: {nothing}")
            self.manifest: dict[str, Any] = manifest
        except BaseException:
            self.close()
            raise

    def _check(self, what: str, st: os.stat_result) -> None:
        if st.st_uid != self.owner:
            raise self._error(f"{self.path}: the {what} belongs to {user_name(st.st_uid)}, not to you "
                              f"({user_name(self.owner)}): ups reads another user's runs but never acts on them; "
                              f"{self._nothing}")
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise self._error(f"{self.path}: the {what} is writable by other users (mode {stat.S_IMODE(st.st_mode):o}): "
                              f"what it holds cannot be trusted; {self._nothing}")

    def read(self, name: str, cap: int = 1 << 20) -> bytes:
        """A file of the run (``config.json``, ``metrics/rank-0.json``): a regular file of the
        acting user's that no one else may write, at most ``cap`` bytes; Refused otherwise
        (FileNotFoundError passes)."""
        from ups.status.safeio import OPEN_READ, BadFile, read_fd

        try:
            fd = os.open(name, OPEN_READ, dir_fd=self._dir)
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise self._error(f"{self.path}/{name}: {exc.strerror or exc} (not a regular file of yours): {self._nothing}") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise self._error(f"{self.path}/{name} is not a regular file: {self._nothing}")
            self._check(name, st)
            try:
                return read_fd(fd, cap)
            except BadFile as exc:
                raise self._error(f"{self.path}/{name}: {exc}: {self._nothing}") from None
        finally:
            os.close(fd)

    def launch_fields(self) -> dict[str, Any]:
        """What this run turns into a process (command, its template, env, cwd, notification
        targets: :func:`ups.runs.manifest_spec.exec_fields`), exactly as written: from run.json,
        or from this host's node manifest for a multi-node run (checked as run.json is)."""
        from ups.runs.manifest_spec import exec_fields
        from ups.status.host import hostname
        from ups.status.safeio import BadFile, decode_json

        source, name = self.manifest, "run.json"
        if self.manifest.get("multinode"):
            name = f"nodes/{hostname()}.json"
            try:
                source = decode_json(self.read(name))
            except FileNotFoundError:
                raise self._error(f"{self.path}: this host has no {name}: {self._nothing}") from None
            except BadFile as exc:
                raise self._error(f"{self.path}/{name} is unreadable ({exc}): {self._nothing}") from None
            if not isinstance(source, dict):
                raise self._error(f"{self.path}/{name} is not a JSON object: {self._nothing}")
        try:
            return exec_fields(source)
        except BadFile as exc:
            raise self._error(f"{self.path}/{name}: {exc}: {self._nothing}") from None

    def names(self, folder: str = ".") -> list[str]:
        """The names in a sub-folder of the run (``metrics``), [] when there is none."""
        try:
            fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self._dir)
        except OSError:
            return []
        try:
            return sorted(os.listdir(fd))
        finally:
            os.close(fd)

    def close(self) -> None:
        if getattr(self, "_dir", None) is not None:
            os.close(self._dir)
            self._dir = None  # type: ignore[assignment]

    def __enter__(self) -> OwnRun:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class JobScope:
    """What this host's ``/proc`` proves about a run's processes, from its run.json.

    Build it with :meth:`of_run` (which refuses a run the acting user does not own); then
    :meth:`prove` each pid before any signal."""

    run_path: Path
    owner: int
    launchers: tuple[dict[str, Any], ...]  # launcher, then previous (adopted) launchers
    job: dict[str, Any]
    actor_pid: int

    @classmethod
    def of_run(cls, run_path: str | os.PathLike[str], manifest: dict[str, Any] | None = None) -> JobScope:
        """The scope of a run the acting user may act on; RefusedSignal (one line) otherwise.
        Reads run.json only when ``manifest`` is not given (the caller's validated copy)."""
        path = Path(run_path)
        me = os.geteuid()
        with OwnRun(path, error=RefusedSignal) as own:
            manifest = own.manifest if manifest is None else manifest
        if not isinstance(manifest, dict):
            raise RefusedSignal(f"{path}/run.json is not a JSON object: nothing acted on")
        if manifest.get("multinode"):
            # A multi-node run's launcher and job are in this host's node manifest, not run.json.
            own = _node_manifest(path, me)
            if own is not None:
                manifest = {**manifest, **{k: own[k] for k in ("launcher", "previous_launchers", "job") if k in own}}
        launchers = [x for x in [manifest.get("launcher"), *reversed(_list(manifest.get("previous_launchers")))]
                     if isinstance(x, dict)]
        job = manifest.get("job") if isinstance(manifest.get("job"), dict) else {}
        return cls(path, me, tuple(launchers), job, os.getpid())

    # -- anchors -----------------------------------------------------------------------
    def _launcher_proven(self, entry: dict[str, Any]) -> int | None:
        """The recorded launcher's pid when the live process is it: same start time, and it
        runs our supervisor on this very run folder."""
        pid, start = _int(entry.get("pid")), _float(entry.get("pid_start"))
        if pid is None or pid <= 1 or start is None or not same_start(process_start_time(pid), start):
            return None
        argv = cmdline(pid) or []
        module = next((m for m in (SUPERVISOR_MODULE, OBSERVER_MODULE) if m in argv), None)
        if module is None or not any(_same_folder(a, self.run_path) for a in argv[argv.index(module) + 1:]):
            return None
        return pid

    def anchors(self) -> dict[int, str]:
        """Live processes whose descendants are the job's: pid -> what it is."""
        out: dict[int, str] = {self.actor_pid: "this process"}
        for entry in self.launchers:
            pid = self._launcher_proven(entry)
            if pid is not None:
                out[pid] = "the run's launcher"
        for entry in self.job_roots():
            jpid, jstart = _int(entry.get("pid")), _float(entry.get("pid_start"))
            if jpid and jpid > 1 and jstart is not None and same_start(process_start_time(jpid), jstart):
                out.setdefault(jpid, "the job's top process")
        return out

    def job_roots(self) -> list[dict[str, Any]]:
        """The job's top process, and an attached job's other roots: the orphaned ranks of a
        torchrun job whose agent died share no parent, each the leader of its own session."""
        return [self.job, *(r for r in _list(self.job.get("roots")) if isinstance(r, dict))]

    def sessions(self) -> dict[int, str]:
        """Session ids that are provably the job's (see the module's docstring)."""
        leaders = {_int(e.get("pid")): (_float(e.get("pid_start")), e) for e in self.launchers}
        for root in self.job_roots():
            jpid = _int(root.get("pid"))
            if jpid is not None and jpid not in leaders:
                leaders[jpid] = (_float(root.get("pid_start")), None)
        out: dict[int, str] = {}
        for sid in {_int(e.get("pid")) for e in self.launchers} | {_int(r.get("sid")) for r in self.job_roots()}:
            if sid is None or sid <= 1 or sid not in leaders or leaders[sid][0] is None:
                continue
            start, launcher = leaders[sid]
            live = process_start_time(sid)
            if live is None:
                out[sid] = f"the job's session {sid} (its leader is gone)"
            elif same_start(live, start) and (launcher is None or self._launcher_proven(launcher) == sid):
                out[sid] = f"the job's session {sid}"
        return out

    # -- the proof -----------------------------------------------------------------------
    def prove(self, pid: int, pid_start: float | None, label: str, *, via_actor: bool = True) -> str:
        """Why ``pid`` is the job's (a short phrase); RefusedSignal when it is not proven.

        ``via_actor=False``: a descendant of the acting process proves nothing (a sweep for
        what no record names must not take a console's other runs for this one's)."""
        if pid <= 1:
            raise RefusedSignal(f"{label} names pid {pid}: ups never signals pid 1 or lower")
        info = proc_info(pid)
        if info is None:
            raise RefusedSignal(f"{label} (pid {pid}) is not running", exit_code=1)
        if pid_start is None or not same_start(info.start, pid_start):
            raise RefusedSignal(f"pid {pid} is not {label} of this run any more (started {info.start}, record says "
                                f"{pid_start}): refusing to signal it")
        if info.uid != self.owner or info.euid != self.owner:
            raise RefusedSignal(f"pid {pid} ({label}) runs as {user_name(info.euid)}, not as the run's owner "
                                f"{user_name(self.owner)}: refusing to signal it")
        anchors = self.anchors()
        if not via_actor:
            anchors.pop(self.actor_pid, None)
        for entry in self.launchers:
            if _int(entry.get("pid")) == pid and pid in anchors:
                return "the run's launcher"
        sessions = self.sessions()
        if info.sid in sessions:
            return f"in {sessions[info.sid]}"
        cur, seen = info.ppid, 0
        while cur > 1 and seen < MAX_DEPTH:
            if cur in anchors and cur != pid:
                return f"a descendant of {anchors[cur]} (pid {cur})"
            parent = proc_info(cur)
            if parent is None:
                break
            cur, seen = parent.ppid, seen + 1
        raise RefusedSignal(f"pid {pid} ({label}) is not provably this run's: not its launcher, not in the job's "
                            "session, not a descendant of the launcher or the job; refusing to signal it")


def check_record_owner(path: Path, label: str) -> None:
    """A record file written by another user never names a process for us to signal."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return  # the process ended and took nothing with it; the pid proof still decides
    except OSError as exc:
        raise RefusedSignal(f"{path}: cannot check its owner ({exc.strerror or exc}); {label} not signalled") from None
    if not stat.S_ISREG(st.st_mode):
        raise RefusedSignal(f"{path} is not a regular file; {label} not signalled")
    if st.st_uid != os.geteuid():
        raise RefusedSignal(f"{path} was written by {user_name(st.st_uid)}, not by you: {label} not signalled")


def _node_manifest(path: Path, me: int) -> dict[str, Any] | None:
    """This host's ``nodes/<host>.json`` of a multi-node run, trusted as run.json is: a regular
    file of the acting user's that no one else may write. None when there is none to trust (a
    signal is then refused by the proof, never sent on a weaker one)."""
    from ups.status.host import hostname
    from ups.status.safeio import read_json

    node = path / "nodes" / f"{hostname()}.json"
    try:
        st = os.lstat(node)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode) or st.st_uid != me or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return None
    try:
        data = read_json(node)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _float(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _list(v: Any) -> list[Any]:
    return v if isinstance(v, list) else []
