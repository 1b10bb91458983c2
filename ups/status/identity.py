"""Who a process is, as its record says (the Reporter's fixed fields, :mod:`ups.status.reporter`):
its name, role, place in the job (from its arguments and torchrun's environment), host, boot
and start. They change only when the process turns out to be something else (``relabel``).
And which reporter describes this very process (:class:`ProcessIdentity`, a base of the Reporter).

Imported by every instrumented process: standard library's light modules only.
"""

from __future__ import annotations

import os

from ups.status.host import boot_id, hostname
from ups.status.procs import process_start_time
from ups.status.schema import SCHEMA_VERSION

TYPE_CHECKING = False  # typing costs ~10 ms to import; annotations here are strings
if TYPE_CHECKING:
    from typing import Any


def env_int(name: str) -> int | None:
    """The environment variable ``name`` as an int, None when unset, empty or not a number."""
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        return None


def record_identity(*, run_id: str, role: str, name: str, pid: int, rank: int | None, local_rank: int | None,
                    world_size: int | None, worker: int | None, loader: int | None, node: int | None,
                    interval: float, command: str | None, now: float, mono: float) -> dict[str, Any]:
    """The record's fixed fields, in the record's order."""
    return dict(
        schema=SCHEMA_VERSION,
        run_id=run_id,
        role=role,
        name=name,
        pid=pid,
        pid_start=process_start_time(pid) or 0.0,
        host=hostname(),
        rank=rank,
        local_rank=local_rank,
        world_size=world_size,
        worker=worker,
        loader=loader,
        node=node,
        started_at=now,
        heartbeat_interval=interval,
        command=command,
        boot_id=boot_id(),
        started_mono=mono,
        heartbeat_tid=None,  # set by the heartbeat thread when it starts
    )


def placement_from_env(kwargs: dict[str, Any]) -> None:
    """``rank``, ``world_size`` and ``local_rank`` from torchrun's environment, where
    ``kwargs`` names none (0, 1 and 0 when unset)."""
    rank = env_int("RANK")
    world = env_int("WORLD_SIZE")
    local = env_int("LOCAL_RANK")
    kwargs.setdefault("rank", 0 if rank is None else rank)
    kwargs.setdefault("world_size", 1 if world is None else world)
    kwargs.setdefault("local_rank", 0 if local is None else local)


def relabel_identity(static: dict[str, Any], *, role: str, name: str, rank: int | None, local_rank: int | None,
                     world_size: int | None, command: str | None) -> None:
    """The fixed fields of a process that turned out to be something else (None: unchanged,
    except ``rank``; ``command`` "": none any more)."""
    static.update(role=role, name=name, rank=rank)
    if local_rank is not None:
        static["local_rank"] = local_rank
    if world_size is not None:
        static["world_size"] = world_size
    if command is not None:  # "": none any more
        static["command"] = command[:300] or None


class ProcessIdentity:
    """The process's own reporter, and the identity in a record's fixed fields (``_static``,
    set by the Reporter): a base of the Reporter."""

    _current: ProcessIdentity | None = None  # the process's own record (see register_current)
    _static: dict[str, Any]

    # -- the process's own reporter ------------------------------------------------------
    @classmethod
    def current(cls) -> Any:
        """The reporter that describes this process (set by ups.instrument), if any."""
        rep = cls._current
        return rep if rep is not None and rep.pid == os.getpid() else None

    def register_current(self) -> Any:
        type(self)._current = self
        return self

    @classmethod
    def forget_current(cls) -> None:
        """This process has no reporter of its own any more (a forked child: its parent's is not it)."""
        cls._current = None

    @property
    def pid(self) -> int:
        return self._static["pid"]

    @property
    def rank(self) -> int | None:
        return self._static["rank"]

    def set_world(self, world_size: int) -> None:
        """The world size learnt after start (``init_process_group``)."""
        self._static["world_size"] = world_size
