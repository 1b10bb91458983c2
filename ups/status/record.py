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
from collections import deque
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from itertools import repeat
from typing import Any

from ups.status.safeio import (
    INT_MAX,
    NAME_MAX,
    PID_MAX,
    BadFile,
    Check,
    boolean,
    check_object,
    decode_json,
    dict_of,
    display_number,
    integer,
    list_of,
    number,
    obj,
    optional,
    safe_value,
    text,
)
from ups.status.schema import (
    COLL_RANKS_MAX,
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
    collective: dict[str, Any] | None = None  # now inside: {"op", "seq", "site", "since", "group", "ranks", ...}
    coll_seq: int = 0  # collectives entered so far (per-rank sequence number)
    command: str | None = None  # agents and helpers: what runs there ("torchrun ...")
    interval_p99: float | None = None  # p99 of recent gaps between progress (learned stall limits)
    heartbeat_tid: int | None = None  # the Reporter's own thread: an observer leaves its CPU and I/O out
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
        """A record from decoded JSON, every field checked (see :data:`RECORD_SPEC`);
        RecordError with the first field that fails and why."""
        if not isinstance(data, dict):
            raise RecordError(f"expected a JSON object, got {type(data).__name__}")
        schema = data.get("schema")
        if isinstance(schema, bool) or not isinstance(schema, int):
            raise RecordError("missing or non-integer 'schema'")
        if schema > SCHEMA_VERSION:
            raise RecordError(f"future schema {schema} (this ups reads up to {SCHEMA_VERSION})")
        if "role" in data and data["role"] not in ROLES:
            raise RecordError(f"unknown role {safe_value(data['role'])!r:.60}")
        try:
            checked = check_object(data, RECORD_SPEC, required=("run_id", "role", "name", "pid", "pid_start", "host"),
                                   skip_unknown=True)  # RECORD_SPEC names every field: other keys are ignored
        except BadFile as exc:
            raise RecordError(str(exc)) from None
        gpu = checked.get("gpu")
        if gpu is not None:
            checked["gpu"] = GpuMemory(gpu.get("device"), gpu.get("allocated"), gpu.get("reserved"), gpu.get("peak"))
        if cls is not StatusRecord:
            return cls(**checked)
        return _checked_record(checked)

    @classmethod
    def from_json(cls, text: str | bytes) -> StatusRecord:
        try:
            data = decode_json(text)
        except BadFile as exc:
            raise RecordError(str(exc)) from None
        return cls.from_dict(data)

    def with_changes(self, **changes: Any) -> StatusRecord:
        return replace(self, **changes)

    # -- derived ----------------------------------------------------------------------
    @property
    def is_final(self) -> bool:
        return self.state in FINAL_STATES

    @property
    def label(self) -> str:
        """Short human label: 'launcher', 'rank 1', 'rank 0 / worker 3', 'rank 0 / pool worker 2'."""
        if self.role == "helper" and "-pool-" in self.name:
            return f"rank {self.rank or 0} / pool worker {self.name.rsplit('-', 1)[-1]}"
        return process_label(self.role, self.rank, self.worker, loader=self.loader, pid=self.pid, node=self.node,
                             host=self.host if "@" in self.name else None)


_FIELDS = tuple(f.name for f in fields(StatusRecord))
_DEFAULTS = tuple(None if f.default is MISSING else f.default for f in fields(StatusRecord))
_REQUIRED = frozenset(f.name for f in fields(StatusRecord) if f.default is MISSING and f.default_factory is MISSING)
_FACTORIES = {f.name: f.default_factory for f in fields(StatusRecord) if f.default_factory is not MISSING}
_set_field = object.__setattr__  # what the dataclass's own frozen __init__ sets each field with


def _checked_record(checked: dict[str, Any]) -> StatusRecord:
    """``StatusRecord(**checked)`` for a dict that RECORD_SPEC has checked (keys: fields only),
    without the generated __init__'s 42 Python-level assignments: the fields are set in one
    C-level pass, as that __init__ would set them (a default where a key is missing, a fresh
    one from the field's factory). A required field that is missing is a TypeError, as there."""
    if not _REQUIRED <= checked.keys():
        raise TypeError(f"StatusRecord missing required fields: {', '.join(sorted(_REQUIRED - checked.keys()))}")
    for name, factory in _FACTORIES.items():
        if name not in checked:
            checked[name] = factory()
    record = object.__new__(StatusRecord)
    deque(map(_set_field, repeat(record), _FIELDS, map(checked.get, _FIELDS, _DEFAULTS)), maxlen=0)
    return record


def _stack_file(v: Any) -> str:
    """A stack file is a path inside the run folder (``stacks/<name>.txt``): readers open it."""
    v = text(NAME_MAX, cut=False)(v)
    if v.startswith("/") or ".." in v.split("/") or "\0" in v:
        raise BadFile(f"{v[:60]!r} is not a path inside the run folder")
    return v


_FINITE = number(-1e300, 1e300)


def _training_value(v: Any) -> Any:
    """A training metric (ups.instrument.metrics): a finite number, or the word a non-finite
    one is written as ("nan", "inf", "-inf": JSON has no such numbers)."""
    if v in ("nan", "inf", "-inf"):
        return v
    return _FINITE(v)


def _median_p90(v: Any) -> list[float]:
    """A step part's [median, p90] (ups.status.steptime): exactly two seconds figures."""
    pair = list_of(number(0.0, 1e9), 2)(v)
    if len(pair) != 2:
        raise BadFile(f"has {len(pair)} items, not [median, p90]")
    return pair


_KNOWN_METRICS: dict[str, Check] = {
    **dict.fromkeys(("nofile_limit", "skipped_steps", "epoch", "forced_num_workers", "checkpoints", "workers",
                     "loss_step", "gpu_total"), integer(0, INT_MAX)),
    **dict.fromkeys(("loss", "lr", "eval_loss", "grad_norm"), _training_value),
    **dict.fromkeys(("samples_per_s", "tokens_per_s"), number(0.0, 1e300)),
    # the first NaN/Inf loss of a rank, which `ups why` names (ups.why.rules.metrics)
    "loss_nonfinite": obj({"step": integer(0, INT_MAX), "value": text(8), "at": optional(number(0.0))}, required=("step",)),
    "logged": dict_of(_training_value, max_items=64),  # what the program gave wandb/TensorBoard/Lightning/HF
    "file": text(4096),
    "metrics_error": text(256),  # why the last tick had no metrics (ups.status.samplers)
    # A launcher's record: the counter the job prints ("converted 5/40 files": ups.launch.lineprogress).
    "output_progress": obj({"k": integer(0, INT_MAX), "n": integer(1, INT_MAX), "at": number(0.0), "text": text(512),
                            "rate": optional(number(0.0, 1e15)), "unit": text(64, cut=False)}, required=("k", "n", "at")),
    # A DataLoader worker's record: the final state of the previous worker of its slot (the
    # epoch before's), for a watcher that reads that one's end after this one took the file.
    "previous": obj({"pid": integer(1, PID_MAX), "pid_start": number(0.0), "state": text(choices=STATES),
                     "phase": text(NAME_MAX, cut=False), "step": integer(0, INT_MAX), "error": optional(text()),
                     "exit_code": optional(integer(-(1 << 31), 1 << 31))}, required=("pid", "pid_start", "state")),
    # A rank's recent steps (ups.status.steptime): seconds a step, [median, p90] of each part;
    # runq and cpu: shares of wall time its main thread waited for a core, and ran; workers_runq:
    # the share of their runnable time its child processes (DataLoader workers) waited for one;
    # stepping_s: how long since its first step (a job's start weighs in every median).
    "step_parts": obj({"n": integer(1, INT_MAX), "window_s": number(0.0, 1e9), "step_mean": optional(number(0.0, 1e9)),
                       **dict.fromkeys(("step", "data", "collective", "backward", "other"), _median_p90),
                       "runq": optional(number(0.0, 1e3)), "cpu": optional(number(0.0, 1e3)),
                       "workers_runq": optional(number(0.0, 1.0)), "workers_wait": optional(number(0.0, 1.0)),
                       "stepping_s": optional(number(0.0, 1e9))},
                      required=("n", "step", "data", "collective", "backward", "other")),
    # A launcher's record: what it sees of the processes it watches (ups.launch.proof), by name.
    "observed": dict_of(obj({
        "pid": integer(1, PID_MAX), "state": text(choices=("watching", "busy", "idle", "unsure")),
        "windows": integer(0, INT_MAX), "idle_windows": integer(0, INT_MAX), "same_stack": optional(boolean),
        "proven": boolean, "since": optional(number(0.0, 1e12)),
        "last": optional(obj({"verdict": text(choices=("busy", "idle", "unsure")), "text": text(1024),
                              **dict.fromkeys(("seconds", "cpu", "demand", "io_bps", "tcp_bps"), number(0.0, 1e15)),
                              "wakeups": integer(0, INT_MAX), "d_state": boolean, "wchan": optional(text(256)),
                              "children": list_of(text(256), 64)})),
    }, required=("pid", "state")), max_items=64),
}


def _metric(key: str, v: Any) -> Any:
    """A metric the rules read keeps its type or is dropped (None); flat lists of numbers
    (series) pass; anything else becomes a short display value."""
    known = _KNOWN_METRICS.get(key)
    if known is not None:
        try:
            return known(v)
        except BadFile:
            return None
    if isinstance(v, list) and len(v) <= 4096 and all(isinstance(x, int | float) and not isinstance(x, bool)
                                                      for x in v):
        return [display_number(x) for x in v]
    return display_number(v)


def _metrics(v: Any) -> dict[str, Any]:
    """Free-form metrics (loss, lr, ...) made safe for display; a non-object becomes {}."""
    if not isinstance(v, dict):
        return {}
    out = {}
    for key, value in list(v.items())[:256]:
        value = _metric(key, value)
        if value is not None:
            out[key[:120]] = value
    return out


_WALL = number(0.0)  # a UNIX time, finite and before the year 5138
_MONO = optional(number(0.0, 1e12))
_SMALL = optional(integer(0, PID_MAX))
RECORD_SPEC: dict[str, Check] = {
    "schema": integer(0, 1 << 16),
    "run_id": text(NAME_MAX, cut=False), "role": text(choices=ROLES), "name": text(NAME_MAX, cut=False),
    "pid": integer(1, PID_MAX), "pid_start": _WALL, "host": text(NAME_MAX, cut=False),
    "rank": _SMALL, "local_rank": _SMALL, "world_size": _SMALL, "worker": _SMALL, "loader": _SMALL, "node": _SMALL,
    "phase": text(NAME_MAX, cut=False), "state": text(choices=STATES),
    "step": integer(0, INT_MAX), "total": optional(integer(0, INT_MAX)), "unit": text(64, cut=False),
    "rate": optional(number(0.0, 1e15)),
    "started_at": _WALL, "progress_at": _WALL, "heartbeat_at": _WALL, "phase_at": _WALL,
    "heartbeat_interval": number(0.0, 1e6),
    "item": optional(text()), "error": optional(text()), "error_site": optional(text(1024)),
    "command": optional(text()), "boot_id": optional(text(128, cut=False)),
    "gpu": optional(obj(dict.fromkeys(("device", "allocated", "reserved", "peak"), optional(integer(0, INT_MAX))))),
    "metrics": _metrics,
    "stack_file": optional(_stack_file), "stack_signal": optional(integer(1, 65)),
    "exit_code": optional(integer(-(1 << 31), 1 << 31)),
    "collective": optional(obj({"op": text(NAME_MAX, cut=False), "seq": integer(0, INT_MAX), "site": optional(text(1024)),
                                "since": _WALL, "since_mono": _MONO, "prev_op": optional(text(NAME_MAX)),
                                "prev_site": optional(text(1024)),
                                # the group (ups.instrument.torch.collectives): its name, description
                                # ("default_pg", "mesh_tp"), global ranks; the framework's part in it
                                # ("FSDP unshard of layers.3"); a call site this rank never used before;
                                # the p2p peer's global rank; waiting for an async collective's work
                                "group": optional(text(NAME_MAX)), "group_desc": optional(text(NAME_MAX)),
                                "ranks": optional(list_of(integer(0, INT_MAX), COLL_RANKS_MAX)),
                                "context": optional(text(256)), "new": optional(boolean),
                                "peer": optional(integer(0, INT_MAX)), "waiting": optional(boolean)},
                               required=("op", "seq"))),
    "coll_seq": integer(0, INT_MAX),
    "interval_p99": optional(number(0.0, 1e9)),
    "heartbeat_tid": optional(integer(1, PID_MAX)),
    "started_mono": _MONO, "progress_mono": _MONO, "heartbeat_mono": _MONO, "phase_mono": _MONO,
}
"""Every field of a record and what it must be. A record with a field that fails is not
read at all (listed as unreadable with the field and why): a half-trusted record would put
its wrong part on screen, or into the health rules, as if it were true."""
