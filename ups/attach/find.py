"""Find a PyTorch job from any one of its processes, from ``/proc`` only (no signal, no ptrace).

``find_job(pid)`` climbs from the given process to the job's top (a DataLoader worker to its
rank, a rank to torchrun's agent or to the ``mp.spawn`` / Lightning parent that started it, an
agent to nothing above it: a shell, SLURM or a container's init is not the job), then takes
every descendant of the top and gives each a role:

* **agent**: torchrun's elastic agent (``torchrun``, ``python -m torch.distributed.run`` or
  ``.launch``), the launchers of accelerate and deepspeed, and an ``mp.spawn`` parent;
* **rank**: a process whose environment (``/proc/PID/environ``: the one it was started with)
  names its RANK (or LOCAL_RANK), while its parent's does not name the same one; a task
  ``srun`` started straight under ``slurmstepd`` (no torchrun between), by its SLURM_PROCID,
  with the step's other tasks on this node (:mod:`ups.attach.slurm`); an
  ``mp.spawn`` child (``spawn_main`` in its command line) is numbered by start order, as
  ``mp.spawn`` starts them; a Lightning script that re-executes itself for ranks 1.. is rank 0;
* **worker**: a DataLoader worker (torch names its main thread ``pt_data_worker``);
* **helper**: any other descendant (a ``resource_tracker``, a compile worker, a shell).

The job's log is where its stdout or stderr go when that is a regular file
(``/proc/PID/fd/1``, ``/2``): the agent's, else the first rank's; for a SLURM step whose
output goes through slurmstepd, the job's output file (``slurm-<job>.out``).

``scan()`` lists every such job on this host, once each (by its top process), leaving out the
jobs started by ``ups launch`` (their environment names a run folder) and those an attached
run already watches, and names **orphans**: ranks of torchrun whose agent died (torchrun starts
each rank in a session of its own, so a rank outlives its agent, re-parented to init), one
entry per job (the ranks that share its TORCHELASTIC_RUN_ID, MASTER_ADDR and MASTER_PORT),
with the ports they listen on and, where NVML exists, the GPU memory they hold.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any

from ups.attach import slurm
from ups.attach.output import log_of, piped_log
from ups.errors import UpsError
from ups.status import procfs
from ups.status.procfs import comm, environ
from ups.status.procs import process_start_time

DIST_KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK", "MASTER_ADDR",
             "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS")
LAUNCHER_NAMES = ("torchrun", "accelerate", "deepspeed")
LAUNCHER_MODULES = ("torch.distributed.run", "torch.distributed.launch", "accelerate.commands.launch", "deepspeed.launcher.runner")
WORKER_COMM = "pt_data_worker"
SPAWN_MARK = "spawn_main"  # python -c 'from multiprocessing.spawn import spawn_main; spawn_main(...)'
UPS_RUN_ENV = "UPS_RUN_DIR"  # set by ups launch for every process of the job
MAX_DEPTH = 64


def _read(path: str, limit: int = 1 << 20) -> bytes | None:
    try:
        with open(path, "rb") as fh:
            return fh.read(limit)
    except OSError:
        return None


def cmdline(pid: int) -> list[str]:
    """The process's arguments; [] when gone."""
    return procfs.cmdline(pid) or []


def stat_of(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, session id) of a live process; None when gone or a zombie."""
    st = procfs.stat(pid)
    return None if st is None or st.gone else (st.state, st.ppid, st.session)


def session_led(pid: int) -> int | None:
    """``pid`` when it leads its own session (torchrun starts each rank so), else None: the
    session that proves its members are the job's (ups.runs.ownership)."""
    st = stat_of(pid)
    return pid if st is not None and st[2] == pid else None


def uid_of(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def children_map() -> dict[int, list[int]]:
    """ppid -> child pids, for every live process (one scan of /proc)."""
    kids: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = stat_of(int(name))
            if st is not None:
                kids.setdefault(st[1], []).append(int(name))
    return kids


def is_python(argv: list[str]) -> bool:
    return bool(argv) and os.path.basename(argv[0]).startswith("python")


def is_launcher(argv: list[str]) -> bool:
    """torchrun's agent, accelerate's or deepspeed's launcher (run directly or through python)."""
    if not argv:
        return False
    names = [os.path.basename(a) for a in argv[:2]]
    if any(n in LAUNCHER_NAMES for n in names):
        return True
    return "-m" in argv[:3] and any(m in argv[:4] for m in LAUNCHER_MODULES)


def _int(v: str | None) -> int | None:
    try:
        return int(v) if v is not None else None
    except ValueError:
        return None


def dist_env(env: dict[str, str] | None) -> dict[str, str]:
    return {k: v for k, v in (env or {}).items() if k in DIST_KEYS or k.startswith("TORCHELASTIC_")}


def global_rank(denv: dict[str, str]) -> int | None:
    """RANK; else, where only LOCAL_RANK is set (Lightning's launcher sets LOCAL_RANK, NODE_RANK
    and WORLD_SIZE for the ranks it starts), the local rank, offset by NODE_RANK times
    LOCAL_WORLD_SIZE where both are known."""
    rank = _int(denv.get("RANK"))
    if rank is not None:
        return rank
    local = _int(denv.get("LOCAL_RANK"))
    node, per_node = _int(denv.get("GROUP_RANK") or denv.get("NODE_RANK")), _int(denv.get("LOCAL_WORLD_SIZE"))
    if local is not None and node and per_node:
        return node * per_node + local
    return local


@dataclass
class Proc:
    """One process of a job, and what it is."""

    pid: int
    ppid: int
    start: float | None
    role: str  # agent | rank | worker | helper
    name: str  # its record's name: "agent", "rank-1", "rank-0-worker-0", "rank-0-helper-123"
    argv: list[str]
    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    worker: int | None = None
    group_rank: int | None = None
    env: dict[str, str] = field(default_factory=dict)  # its distributed variables only
    log: str | None = None
    rank_from: str | None = None  # "environment" | "SLURM_PROCID" | "start order" | "parentage"

    @property
    def label(self) -> str:
        if self.role == "rank":
            return f"rank {self.rank}"
        if self.role == "worker":
            return f"rank {self.rank} / worker {self.worker}"
        if self.role == "helper":
            return f"rank {self.rank or 0} / helper pid {self.pid}"
        return self.role

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["label"] = self.label
        return d


@dataclass
class Job:
    """A job's process tree, from its top process down."""

    top: int
    given: int
    procs: list[Proc]
    log: str | None
    launched_by_ups: str | None = None  # the run folder named by its environment
    orphan: bool = False  # ranks whose agent died (re-parented to init)
    roots: list[int] = field(default_factory=list)  # the tops of its trees: [top], or each orphaned rank or SLURM task
    slurm: slurm.Step | None = None  # the SLURM step its processes are (or run in)
    log_holder: int | None = None  # a process outside the job that writes its log (a SLURM batch script, tee)
    log_via: str | None = None  # how its output reaches the log, where a pipe is between: "rank 0 → pipe → tee ..."
    log_pane: dict | None = None  # its terminal's tmux pane or screen window, when its output goes to one (ups.attach.pane)

    @property
    def root_pids(self) -> list[int]:
        return self.roots or [self.top]

    @property
    def ranks(self) -> list[Proc]:
        return sorted((p for p in self.procs if p.role == "rank"), key=lambda p: (p.rank if p.rank is not None else 1 << 30))

    @property
    def top_proc(self) -> Proc:
        return next(p for p in self.procs if p.pid == self.top)

    @property
    def world_size(self) -> int | None:
        return next((p.world_size for p in self.ranks if p.world_size), None) or (len(self.ranks) or None)

    @property
    def nnodes(self) -> int | None:
        """How many nodes the job spans, from its ranks' environment: torchrun's
        GROUP_WORLD_SIZE, else WORLD_SIZE over LOCAL_WORLD_SIZE; None where neither says."""
        for p in self.ranks:
            n = _int(p.env.get("GROUP_WORLD_SIZE"))
            if n:
                return n
            world, local = _int(p.env.get("WORLD_SIZE")), _int(p.env.get("LOCAL_WORLD_SIZE"))
            if world and local and world % local == 0:
                return world // local
        return None

    @property
    def node_rank(self) -> int | None:
        """This host's node of the job (GROUP_RANK, or NODE_RANK), from its ranks' environment."""
        return next((p.group_rank for p in self.ranks if p.group_rank is not None), None)

    def describe(self) -> str:
        top = self.top_proc
        what = "torchrun job" if any(p.env.get("TORCHELASTIC_RUN_ID") for p in self.procs) else "PyTorch job"
        what = f"{self.slurm.describe()}: {what}" if self.slurm else what
        return f"{what}, top pid {top.pid} ({' '.join(top.argv)[:120]}), {len(self.ranks)} rank(s)"

    def to_dict(self) -> dict[str, Any]:
        return {"top": self.top, "given": self.given, "log": self.log, "log_via": self.log_via, "log_pane": self.log_pane,
                "world_size": self.world_size,
                "nnodes": self.nnodes, "node_rank": self.node_rank, "roots": self.root_pids,
                "launched_by_ups": self.launched_by_ups, "orphan": self.orphan, "describe": self.describe(),
                "slurm": self.slurm.to_dict() if self.slurm else None,
                "processes": [p.to_dict() for p in self.procs]}


def _job_like(pid: int, argv: list[str], env: dict[str, str] | None) -> bool:
    return (is_launcher(argv) or bool(dist_env(env)) or (is_python(argv) and any(SPAWN_MARK in a for a in argv))
            or is_python(argv) and slurm.task_rank(pid, env) is not None)


def find_top(pid: int) -> int:
    """The job's top process, climbing from ``pid`` (see the module's docstring)."""
    cur, depth = pid, 0
    while depth < MAX_DEPTH:
        st = stat_of(cur)
        if st is None:
            break
        parent = st[1]
        if parent <= 1:
            break
        pargv, penv = cmdline(parent), environ(parent)
        cargv, cenv = cmdline(cur), environ(cur)
        climb = is_launcher(pargv) or bool(dist_env(penv)) and is_python(pargv)
        # A process started by a plain python parent as a rank (mp.spawn, Lightning's
        # re-executed script, a DataLoader worker of a rank): the parent is part of the job.
        climb = climb or (is_python(pargv) and (any(SPAWN_MARK in a for a in cargv) or bool(dist_env(cenv)))
                          and not dist_env(penv) and not is_launcher(cargv) and "pytest" not in " ".join(pargv[:3]))
        climb = climb or comm(cur) == WORKER_COMM
        if not climb:
            break
        cur, depth = parent, depth + 1
    return cur


def _tree(top: int, kids: dict[int, list[int]]) -> list[tuple[int, int]]:
    """(pid, parent) of the top and every descendant, parents first."""
    out, todo = [], [(top, 0)]
    while todo:
        p, parent = todo.pop(0)
        out.append((p, parent))
        todo.extend((c, p) for c in sorted(kids.get(p, [])))
    return out


def _roles(tree: list[tuple[int, int]]) -> list[Proc]:
    info = {pid: (cmdline(pid), environ(pid) or {}, comm(pid)) for pid, _ in tree}
    procs: dict[int, Proc] = {}
    top = tree[0][0]
    spawned = [pid for pid, parent in tree if parent == top and any(SPAWN_MARK in a for a in info[pid][0])
               and not dist_env(info[pid][1]).get("RANK")]
    starts = {pid: process_start_time(pid) for pid, _ in tree}
    spawn_order = sorted(spawned, key=lambda p: (starts.get(p) or 0.0, p))
    workers_of: dict[int, int] = {}
    for pid, parent in tree:
        argv, env, name_ = info[pid]
        denv = dist_env(env)
        penv = dist_env(info[parent][1]) if parent in info else {}
        rank_s = global_rank(denv)
        task = slurm.task_rank(pid, env) if rank_s is None and not is_launcher(argv) else None
        p = Proc(pid, parent, starts.get(pid), "helper", "", argv, env={**denv, **slurm.env_of(env)}, log=log_of(pid))
        p.local_rank, p.world_size = _int(denv.get("LOCAL_RANK")), _int(denv.get("WORLD_SIZE"))
        if task is not None:  # a task srun started: its SLURM_PROCID is its rank
            rank_s, p.world_size, p.local_rank = task
        p.group_rank = _int(denv.get("GROUP_RANK") or denv.get("NODE_RANK"))
        owner = procs.get(parent)
        if pid == top and (is_launcher(argv) or spawned or any(dist_env(info[c][1]) for c, pp in tree if pp == top)
                           and rank_s is None):
            p.role = "agent"
            if not is_launcher(argv) and not spawned:
                # Lightning's script re-executes itself for ranks 1..: it is rank 0 itself.
                p.role, p.rank, p.rank_from = "rank", 0, "parentage"
        elif name_ == WORKER_COMM and owner is not None and owner.role == "rank":
            p.role, p.rank = "worker", owner.rank
            p.worker = workers_of.get(parent, 0)
            workers_of[parent] = p.worker + 1
        elif rank_s is not None and (owner is None or owner.role == "agent" or global_rank(penv) != rank_s
                                     and not (owner.role == "rank" and owner.rank_from == "environment")):
            p.role, p.rank, p.rank_from = "rank", rank_s, "environment" if task is None else "SLURM_PROCID"
        elif pid in spawn_order:
            p.role, p.rank, p.rank_from = "rank", spawn_order.index(pid), "start order"
            p.world_size = p.world_size or len(spawn_order)
        elif pid == top:
            p.role, p.rank, p.rank_from = "rank", 0, "parentage"  # a single-process program
        else:
            p.rank = owner.rank if owner is not None else None
        procs[pid] = p
    for p in procs.values():
        if p.role == "agent":
            p.name = "agent"
        elif p.role == "rank":
            p.name = f"rank-{p.rank}"
        elif p.role == "worker":
            p.name = f"rank-{p.rank}-worker-{p.worker}"
        else:
            p.name = f"rank-{p.rank or 0}-helper-{p.pid}"
    names: set[str] = set()
    for p in procs.values():  # two processes claiming one rank (a broken environment): keep both
        if p.name in names:
            p.name = f"{p.name}-pid{p.pid}"
        names.add(p.name)
    return list(procs.values())


def find_job(pid: int, *, kids: dict[int, list[int]] | None = None, group: bool = True) -> Job:
    """The job ``pid`` belongs to; UpsError (one line) when there is no such process or it is
    no PyTorch job. An orphaned rank's job is every orphaned rank of its torchrun job on this
    host (:func:`orphan_siblings`), unless ``group`` is false."""
    if pid <= 1:
        raise UpsError(f"pid {pid}: ups attaches to a job's process, never pid 1 or lower")
    if stat_of(pid) is None:
        raise UpsError(f"no process {pid} on this host (it ended, or is a zombie)")
    if environ(pid) is None and uid_of(pid) not in (None, os.geteuid()):
        raise UpsError(f"pid {pid} runs as another user (uid {uid_of(pid)}): its environment cannot be read; "
                       "attach as that user")
    top = find_top(pid)
    kids = kids if kids is not None else children_map()
    step = slurm.step_of(environ(top))
    stepd = slurm.stepd_of(top) if step is not None and slurm.task_rank(top, environ(top)) else None
    roots = slurm.step_tasks(stepd, kids, step.job_id, step.step_id) if stepd and step else [top]
    procs = [p for root in roots or [top] for p in _roles(_tree(root, kids))]
    if len(roots) > 1:  # the step's tasks on this node, each a root: the job's top is its lowest rank
        top = min((p for p in procs if p.pid in roots), key=lambda p: (p.rank if p.rank is not None else 1 << 30)).pid
    if not any(_job_like(p.pid, p.argv, p.env) for p in procs) and not any(_has_torch(p.pid) for p in procs[:8]):
        raise UpsError(f"pid {pid} ({' '.join(cmdline(pid))[:80]}) is not a PyTorch job: no torchrun, no RANK or "
                       "LOCAL_RANK in its environment, no torch loaded")
    env = environ(top) or {}
    st = stat_of(top)
    job = Job(top, pid, procs, None, launched_by_ups=env.get(UPS_RUN_ENV) or _ups_run_of(procs), slurm=step,
              roots=roots if len(roots) > 1 else [])
    job.orphan = bool(st and st[1] == 1 and any(p.env.get("TORCHELASTIC_RUN_ID") for p in procs) and
                      not any(p.role == "agent" for p in procs))
    top_proc = job.top_proc
    job.log = top_proc.log or next((p.log for p in job.ranks if p.log), None)
    if job.log is None and step is not None:
        job.log, job.log_holder = slurm.output_file(step.job_id, log_of)
    if job.log is None:  # behind a pipe: the file its reader (tee, a logger) writes
        for p in [top_proc, *job.ranks][:4]:
            found = piped_log(p.pid)
            if found:
                job.log, job.log_holder, reader = found
                job.log_via = f"{p.label} → pipe → {reader} (pid {job.log_holder}) → {job.log}"
                break
    if job.log is None:  # a terminal that a tmux pane or screen window owns: read read-only (ups.attach.pane)
        from ups.attach.pane import describe, pane_of

        pane = pane_of(top_proc.pid) or (pane_of(job.ranks[0].pid) if job.ranks else None)
        if pane is not None and pane["uid"] == uid_of(top):  # the job's user's server only
            job.log_pane = pane
            job.log_via = describe(pane)
    if group and job.orphan:
        job = orphan_siblings(job, kids)
    return job


def node_names(procs: list[Proc], host: str) -> list[Proc]:
    """In a run of several nodes the agent's record is ``agent@<host>`` (as ``ups launch``
    names it): global ranks are unique across nodes already."""
    from ups.status.schema import process_name

    for p in procs:
        if p.role == "agent":
            p.name = process_name("agent", host=host)
    return procs


def tree_procs(roots: list[int], kids: dict[int, list[int]] | None = None) -> list[Proc]:
    """Every process of the trees under ``roots`` (the observer's look at its job, each tick:
    no climbing, so a job whose agent died is still its ranks), roles as :func:`find_job`
    gives them; a process under two roots is counted once."""
    kids = kids if kids is not None else children_map()
    out: dict[int, Proc] = {}
    for root in roots:
        if root in out or stat_of(root) is None:
            continue
        for p in _roles(_tree(root, kids)):
            out.setdefault(p.pid, p)
    return list(out.values())


def orphan_siblings(job: Job, kids: dict[int, list[int]]) -> Job:
    """An orphaned rank's job with the other orphaned ranks of its torchrun job on this host
    (children of init whose environment names the same run id, store address and port), each
    with its DataLoader workers: one job, its top the lowest rank, its roots every rank."""
    key = orphan_key(job)
    if key is None:
        return job
    members = [job]
    for pid in sorted(kids.get(1, [])):
        if pid == job.top or orphan_key_of(environ(pid)) != key:
            continue
        try:
            other = find_job(pid, kids=kids, group=False)
        except UpsError:
            continue  # it ended meanwhile
        if orphan_key(other) == key:
            members.append(other)
    given = job.given
    (grouped,) = group_orphans(members)
    grouped.given = given
    return grouped


def _ups_run_of(procs: list[Proc]) -> str | None:
    for p in procs[:4]:
        env = environ(p.pid) or {}
        if env.get(UPS_RUN_ENV):
            return env[UPS_RUN_ENV]
    return None


def _has_torch(pid: int) -> bool:
    """torch is loaded in the process (its shared library is mapped)."""
    data = _read(f"/proc/{pid}/maps", 64 << 20) or b""
    return b"libtorch" in data


def listening_ports(pid: int) -> list[int]:
    """TCP ports the process listens on (its sockets' inodes in /proc/net/tcp, tcp6)."""
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    except OSError:
        return []
    ports = set()
    for table in ("tcp", "tcp6"):
        for line in (_read(f"/proc/{pid}/net/{table}") or b"").decode(errors="replace").splitlines()[1:]:
            parts = line.split()
            if len(parts) > 9 and parts[3] == "0A" and parts[9] in inodes:  # 0A: LISTEN
                ports.add(int(parts[1].rsplit(":", 1)[1], 16))
    return sorted(ports)


def gpu_memory(pids: list[int]) -> dict[int, int] | None:
    """GPU memory each pid holds (bytes), from NVML; None where NVML is not available."""
    try:
        from ups.gpu import nvml

        if not nvml.available():
            return None
        from ups.gpu.attribution import gpu_memory_by_pid
        from ups.gpu.snapshot import get_provider

        held = gpu_memory_by_pid(get_provider().snapshot())
    except Exception:  # noqa: BLE001 - no NVML, no driver: said as "not known"
        return None
    return {p: held[p] for p in pids if p in held}


def watched_pids(runs_root: str | os.PathLike[str] | None) -> set[int]:
    """The processes attached runs under ``runs_root`` watch now (their observer alive)."""
    from ups.runs.rundir import list_runs
    from ups.status.procs import same_start

    out: set[int] = set()
    if runs_root is None:
        return out
    try:
        runs = list_runs(runs_root, missing_ok=True)
    except UpsError:
        return out
    for s in runs:
        m = s.manifest or {}
        obs = m.get("launcher") or {}
        if m.get("kind") != "attached" or not isinstance(obs, dict) or m.get("state") not in ("launching", "running"):
            continue
        if not same_start(process_start_time(obs.get("pid") or 0), obs.get("pid_start")):
            continue
        for p in (m.get("attached") or {}).get("processes") or []:
            if isinstance(p, dict) and isinstance(p.get("pid"), int):
                out.add(p["pid"])
    return out


def orphan_key(job: Job) -> tuple[str, str, str] | None:
    """What the ranks of one torchrun job share (its run id, the store's address and port);
    None for a job that is no orphan, or whose ranks name no run id."""
    env = next((p.env for p in job.ranks if p.env.get("TORCHELASTIC_RUN_ID")), None)
    if not job.orphan or env is None:
        return None
    return orphan_key_of(env)


def orphan_key_of(env: dict[str, str] | None) -> tuple[str, str, str] | None:
    if not env or not env.get("TORCHELASTIC_RUN_ID") or "RANK" not in env:
        return None
    return env["TORCHELASTIC_RUN_ID"], env.get("MASTER_ADDR", ""), env.get("MASTER_PORT", "")


def group_orphans(jobs: list[Job]) -> list[Job]:
    """Orphaned ranks of one torchrun job (each found as a job of its own: a session of its
    own, re-parented to init) as one job, its top the lowest rank."""
    out: list[Job] = []
    groups: dict[tuple[str, str, str], Job] = {}
    for j in jobs:
        key = orphan_key(j)
        if key is None:
            out.append(j)
        elif key in groups:
            g = groups[key]
            g.procs = g.procs + j.procs
            g.log = g.log or j.log
        else:
            groups[key] = j
            out.append(j)
    for key, g in groups.items():
        g.roots = sorted({j.top for j in jobs if orphan_key(j) == key})
        g.procs.sort(key=lambda p: (p.rank if p.rank is not None else 1 << 30, p.role != "rank", p.worker or 0, p.pid))
        g.top = g.ranks[0].pid
        g.given = g.top
    return out


def scan(runs_root: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Every PyTorch job of this host that ups does not watch, once each, and the orphans."""
    kids = children_map()
    me = os.getpid()
    mine = {me}
    cur = me
    while (st := stat_of(cur)) is not None and st[1] > 1:  # this command and its parents
        cur = st[1]
        mine.add(cur)
    watched = watched_pids(runs_root)
    seen: set[int] = set()
    jobs: list[Job] = []
    for name in sorted(os.listdir("/proc"), key=lambda n: int(n) if n.isdigit() else 0):
        if not name.isdigit():
            continue
        pid = int(name)
        if pid in seen or pid in mine or pid <= 1:
            continue
        argv = cmdline(pid)
        env = environ(pid)
        if not (_job_like(pid, argv, env) and (is_python(argv) or is_launcher(argv))):
            continue
        try:
            job = find_job(pid, kids=kids, group=False)
        except UpsError:
            continue
        pids = {p.pid for p in job.procs}
        seen |= pids
        if job.top in mine or pids & mine - {job.top} or job.launched_by_ups or pids & watched:
            continue
        if job.top not in {j.top for j in jobs}:
            jobs.append(job)
    jobs = group_orphans(jobs)
    held = gpu_memory([p.pid for j in jobs for p in j.procs])
    out = []
    for j in jobs:
        d = j.to_dict()
        for p in d["processes"]:
            if j.orphan and p["role"] == "rank":
                p["ports"] = listening_ports(p["pid"])
            p["gpu_bytes"] = None if held is None else held.get(p["pid"], 0)
        out.append(d)
    return {"jobs": out, "orphans": [d for d in out if d["orphan"]],
            "gpu": "NVML not available: GPU memory not known" if held is None else "NVML"}
