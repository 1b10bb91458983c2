"""Which rank a process is, from what its launcher put in its environment.

torchrun sets ``RANK``/``LOCAL_RANK``/``WORLD_SIZE``; SLURM's ``srun`` sets ``SLURM_PROCID``/
``SLURM_LOCALID``/``SLURM_NTASKS``; Open MPI ``OMPI_COMM_WORLD_*``; MPICH/Intel MPI and PMIx
``PMI_RANK``/``PMI_SIZE``/``PMIX_RANK``; Lightning's re-executed scripts get ``LOCAL_RANK``
(and ``NODE_RANK``, ``WORLD_SIZE``); accelerate and DeepSpeed launchers set torchrun's names.
A process whose environment names a rank is only *provisionally* that rank: the process group
it initialises says its global rank for sure (see ``ups.instrument.torch.collectives``), and
the record follows.

A variable inherited from a parent is not an identity of one's own: a torch.compile worker of
rank 1 carries ``RANK=1`` too. :func:`own_rank` compares with what the parent process was
(``UPS_PARENT``) and with the rank its own environment named (``UPS_RANK_ENV``, which every
instrumented process sets for its children).
"""

from __future__ import annotations

import os

from ups.status import procfs

ENV_RANK_ENV = "UPS_RANK_ENV"  # the rank an instrumented parent's environment named ("-": none)

_GLOBAL = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK")
_LOCAL = ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID")
_WORLD = ("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")


class EnvRank:
    """A rank as the environment names it. (A plain class: every process of a job imports this
    module at start-up, and ``dataclasses`` would cost it milliseconds.)"""

    __slots__ = ("local_rank", "rank", "source", "world_size")

    def __init__(self, rank: int, local_rank: int | None, world_size: int | None, source: str) -> None:
        self.rank = rank
        self.local_rank = local_rank
        self.world_size = world_size
        self.source = source  # the variable the rank came from

    @property
    def key(self) -> str:
        return str(self.rank)


def _first_int(env, names: tuple[str, ...]) -> tuple[int | None, str | None]:  # a mapping
    for name in names:
        value = env.get(name)
        if value is not None:
            try:
                return int(value), name
            except ValueError:
                continue
    return None, None


def env_rank(env=None) -> EnvRank | None:  # a mapping, os.environ by default
    """The rank the environment names, if any. ``LOCAL_RANK`` alone (Lightning's re-executed
    scripts) counts as the global rank on node 0 only; on another node the global rank waits
    for the process group."""
    env = os.environ if env is None else env
    rank, source = _first_int(env, _GLOBAL)
    local, local_source = _first_int(env, _LOCAL)
    world, _ = _first_int(env, _WORLD)
    if rank is None and local is not None:
        node, _ = _first_int(env, ("NODE_RANK", "GROUP_RANK"))
        if node not in (None, 0):
            return None
        rank, source = local, local_source
    if rank is None or rank < 0:
        return None
    return EnvRank(rank, local, world, source or "?")


def own_rank(parent: tuple[str, int, int] | None, *, top_role: str) -> EnvRank | None:
    """The rank this process is by its environment, or None if it is not a rank by it.

    * the job's top process: a rank only where the job is ranks (``ups launch python|srun``),
      never torchrun's or accelerate's agent even inside a SLURM allocation;
    * a child of an agent or of a helper (DeepSpeed's per-node launcher): any rank its
      environment names that its parent's did not; the plain child of a one-process
      ``accelerate launch`` (no rank in its environment) is rank 0;
    * a child of a rank (Lightning's rank 0 re-executing the script): a rank other than its
      parent's; the same rank is an inherited variable, i.e. a helper of that rank.
    """
    found = env_rank()
    if found is None:
        if parent is not None and parent[0] == "agent" and _single_process_launcher(parent[1]):
            return EnvRank(0, 0, 1, "accelerate launch, one process")
        return None
    if parent is None:
        return found if top_role == "rank" else None
    role, _pid, parent_rank = parent
    if role == "worker":
        return None
    if role == "rank":
        return found if found.rank != parent_rank else None
    if role == "agent":
        return found
    return found if os.environ.get(ENV_RANK_ENV) != found.key else None


def _single_process_launcher(pid: int) -> bool:
    """``accelerate launch`` with one process runs the script as a plain child, no rank in its
    environment (it starts torchrun's machinery only for more): that child is the job's only
    rank. Read from the parent's command line, on this rare path only."""
    argv = procfs.cmdline(pid)
    if not argv:
        return False
    return is_launcher_program(argv) and any("accelerate" in os.path.basename(a) for a in argv[:4])


def mark_for_children(rank: EnvRank | None) -> None:
    """What the children of this process compare their own environment with."""
    os.environ[ENV_RANK_ENV] = rank.key if rank is not None else "-"


_LAUNCHER_PROGRAMS = ("torchrun", "accelerate", "accelerate-launch", "deepspeed")
_LAUNCHER_MODULES = ("torch.distributed.run", "torch.distributed.launch", "accelerate.commands.launch")


def is_launcher_program(argv: list[str]) -> bool:
    """torchrun, accelerate or deepspeed as the program: an agent even where the environment
    names a rank (``srun torchrun ...``: SLURM_PROCID is the node's task, not a rank)."""
    head = argv[:4]
    if any(os.path.basename(a) in _LAUNCHER_PROGRAMS for a in head[:2]):
        return True
    return any(a in _LAUNCHER_MODULES for a in head)
