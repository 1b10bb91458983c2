"""The status record: one small JSON document per process in ``<run>/status/``.

The record is the whole protocol between a job and everything that watches it (``ups
status``, the console, the precompute watchdog). It is written atomically by the process it
describes (see :mod:`ups.status.reporter`) and read by anyone (see :mod:`ups.status.reader`).

Compatibility rules:

* ``schema`` is an integer. Readers accept records with ``schema <= SCHEMA_VERSION`` and
  report newer ones as "future schema" instead of guessing.
* Unknown keys are ignored on read (a newer writer may add optional fields without bumping
  the schema); missing optional keys take their defaults.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from ups.status.schema import (
    FINAL_STATES,
    ROLES,
    SCHEMA_VERSION,
    STATES,
    process_label,
    process_name,
)

__all__ = ["FINAL_STATES", "ROLES", "SCHEMA_VERSION", "STATES", "GpuMemory", "RecordError", "StatusRecord", "process_name"]


class RecordError(ValueError):
    """A status file's content is not a valid record (reported by readers, never raised to UIs)."""


@dataclass(frozen=True, slots=True)
class GpuMemory:
    """torch's view of one process's CUDA memory, in bytes."""

    device: int | None = None
    allocated: int | None = None
    reserved: int | None = None
    peak: int | None = None


@dataclass(frozen=True, slots=True)
class StatusRecord:
    """Everything a watcher needs to know about one process of a run.

    Times are UNIX seconds (float). ``progress_at`` moves only when work advances;
    ``heartbeat_at`` moves every time the record is written. Health is derived from the
    two (see :func:`ups.status.health.classify_health`).
    """

    run_id: str
    role: str  # launcher | agent | rank | worker | helper
    name: str  # file stem in status/: "launcher", "rank-0", "rank-0-worker-1"
    pid: int
    pid_start: float  # process start time (psutil create_time), guards against pid reuse
    host: str
    schema: int = SCHEMA_VERSION
    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    worker: int | None = None
    phase: str = "start"
    state: str = "running"  # running | done | failed
    step: int = 0
    total: int | None = None
    unit: str = "items"
    rate: float | None = None  # units per second over the recent window
    started_at: float = 0.0
    progress_at: float = 0.0
    heartbeat_at: float = 0.0
    phase_at: float = 0.0  # when the current phase began
    heartbeat_interval: float = 1.0
    item: str | None = None  # current item, e.g. "advection1d_train_000.h5#17"
    gpu: GpuMemory | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    stack_file: str | None = None  # path relative to the run dir, e.g. "stacks/rank-0.txt"
    stack_signal: int | None = None  # signal that makes faulthandler dump; None: not registered
    exit_code: int | None = None
    error_site: str | None = None  # "train.py:42": the innermost frame of the program's own code
    loader: int | None = None  # workers: which DataLoader of their rank (0 = the first one)
    node: int | None = None  # multi-node runs: the node rank of a per-node process
    collective: dict[str, Any] | None = None  # now inside: {"op", "seq", "site", "since"}
    coll_seq: int = 0  # collectives entered so far (per-rank sequence number)
    command: str | None = None  # agents and helpers: what runs there ("torchrun ...")
    interval_p99: float | None = None  # p99 of recent gaps between progress (learned stall limits)
    # Clocks (issue: wall clocks jump). CLOCK_MONOTONIC is shared by every process of one boot
    # of one host, so readers on the same boot judge ages with it; wall time across hosts.
    boot_id: str | None = None
    started_mono: float | None = None
    progress_mono: float | None = None
    heartbeat_mono: float | None = None
    phase_mono: float | None = None

    # -- conversion -------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"), default=str)

    @classmethod
    def from_dict(cls, data: Any) -> StatusRecord:
        if not isinstance(data, dict):
            raise RecordError(f"expected a JSON object, got {type(data).__name__}")
        schema = data.get("schema")
        if not isinstance(schema, int):
            raise RecordError("missing or non-integer 'schema'")
        if schema > SCHEMA_VERSION:
            raise RecordError(f"future schema {schema} (this ups reads up to {SCHEMA_VERSION})")
        kwargs = {k: v for k, v in data.items() if k in _FIELD_NAMES}
        for required in ("run_id", "role", "name", "pid", "pid_start", "host"):
            if required not in kwargs:
                raise RecordError(f"missing required key {required!r}")
        if kwargs["role"] not in ROLES:
            raise RecordError(f"unknown role {kwargs['role']!r}")
        if not isinstance(kwargs["pid"], int):
            raise RecordError("'pid' is not an integer")
        gpu = kwargs.get("gpu")
        if isinstance(gpu, dict):
            kwargs["gpu"] = GpuMemory(**{k: gpu.get(k) for k in ("device", "allocated", "reserved", "peak")})
        elif gpu is not None:
            kwargs["gpu"] = None
        if not isinstance(kwargs.get("metrics", {}), dict):
            kwargs["metrics"] = {}
        if not isinstance(kwargs.get("collective"), dict | None):
            kwargs["collective"] = None
        try:
            return cls(**kwargs)
        except TypeError as exc:  # pragma: no cover - defensive
            raise RecordError(str(exc)) from exc

    @classmethod
    def from_json(cls, text: str) -> StatusRecord:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise RecordError(f"not valid JSON ({exc.msg} at char {exc.pos})") from None
        return cls.from_dict(data)

    def with_changes(self, **changes: Any) -> StatusRecord:
        return replace(self, **changes)

    # -- derived ----------------------------------------------------------------------
    @property
    def is_final(self) -> bool:
        return self.state in FINAL_STATES

    @property
    def label(self) -> str:
        """Short human label: 'launcher', 'rank 1', 'rank 0 / worker 3'."""
        return process_label(self.role, self.rank, self.worker, loader=self.loader, pid=self.pid, node=self.node,
                             host=self.host if "@" in self.name else None)


_FIELD_NAMES = frozenset(f.name for f in fields(StatusRecord))
