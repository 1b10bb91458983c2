"""Names shared by every writer and reader of status records, with no heavy imports.

The Reporter imports only this (and the standard library) so that an instrumented process
pays a few milliseconds for it; the reader's dataclass lives in :mod:`ups.status.record`.
"""

from __future__ import annotations

SCHEMA_VERSION = 1

ROLES = ("launcher", "agent", "rank", "worker", "helper")
"""launcher: our supervisor; agent: torchrun's elastic agent; rank: a job process (torchrun
rank, or the main process of a single-process job); worker: a DataLoader worker; helper: any
other Python process of the job (a multiprocessing child, a subprocess of a rank)."""
STATES = ("running", "done", "failed")
FINAL_STATES = ("done", "failed")

LOSS_TRACE = "loss_trace"
"""The key under which a metrics sampler hands the Reporter every loss it read since its last
call, as ``[(step, value), ...]``: the heartbeat passes them to the process's series
(:mod:`ups.status.series`), never into the record."""


def process_name(
    role: str,
    rank: int | None = None,
    worker: int | None = None,
    *,
    loader: int | None = None,
    pid: int | None = None,
    node: int | None = None,
    host: str | None = None,
) -> str:
    """The file stem of a process's record and stack file (unique within a run).

    ``loader`` numbers the DataLoaders of one rank (0 is left out of the name); ``node``
    numbers the nodes of a multi-node run for the per-node processes (launcher, agent).
    ``host`` names them in a multi-node run: ``launcher@node1`` (global ranks are unique
    across nodes already; a single-node run keeps its plain names).
    """
    if role in ("launcher", "agent"):
        if host:
            return f"{role}@{host}"
        return role if not node else f"{role}-node{node}"
    r = 0 if rank is None else rank
    if role == "worker":
        return f"rank-{r}-worker-{worker}" if not loader else f"rank-{r}-loader-{loader}-worker-{worker}"
    if role == "helper":
        return f"rank-{r}-helper-{pid}"
    return f"rank-{r}"


def process_label(
    role: str,
    rank: int | None = None,
    worker: int | None = None,
    *,
    loader: int | None = None,
    pid: int | None = None,
    node: int | None = None,
    host: str | None = None,
) -> str:
    """Short human label: 'launcher', 'agent', 'rank 1', 'rank 0 / worker 3'."""
    if role in ("launcher", "agent"):
        if host:
            return f"{role}@{host}"
        return role if not node else f"{role} (node {node})"
    r = 0 if rank is None else rank
    if role == "worker":
        return f"rank {r} / worker {worker}" if not loader else f"rank {r} / loader {loader} / worker {worker}"
    if role == "helper":
        return f"rank {r} / helper {pid}"
    return f"rank {r}"

COLL_RANKS_MAX = 256  # a collective's group: a larger group's ranks are not written (its name and description are)
