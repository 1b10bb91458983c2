"""Exit truth, as a reader gets it: when each process of a run ended, and whether it ended
normally (the ``process.exit`` events its launcher logged; see :mod:`ups.launch.exits`, the
watcher that notes them).

A record that still says ``running`` after its process ended means the interpreter never
exited normally (``os._exit``, a signal). The root cause is the earliest process to end
abnormally: torchrun alone blames the rank that failed *first as torchrun saw it*.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ups.runs.rundir import RunDir
from ups.status.safeio import BadFile, check_object


@dataclass(frozen=True)
class ProcessExit:
    name: str
    pid: int
    role: str
    rank: int | None
    at: float  # wall time of the end (or of when it was found gone, if ``exact`` is False)
    exact: bool
    record_state: str  # the record's state right after the end: running means no normal exit
    phase: str
    step: int
    error: str | None
    exit_code: int | None  # what the record says (normal exits and recorded failures only)
    at_mono: float | None = None  # CLOCK_MONOTONIC of ``at`` (the order of ends, immune to clock steps)
    boot_id: str | None = None
    signal: str | None = None  # the signal that ended it, where its parent saw it (a DataLoader worker's rank)

    @property
    def clean(self) -> bool:
        """The interpreter exited normally (the final record was written, by itself)."""
        return self.record_state != "running" and self.signal is None

    def to_dict(self) -> dict:
        return {**asdict(self), "clean": self.clean}


def read_exits(run: RunDir) -> dict[str, ProcessExit]:
    """The ends a supervisor logged (latest per process name), e.g. for a reader after the run."""
    out: dict[str, ProcessExit] = {}
    fields = set(ProcessExit.__dataclass_fields__)
    for e in run.read_events():
        if e.get("event") == "process.exit":
            try:  # an event is outside input like any file of the run: typed before use
                checked = check_object({k: v for k, v in e.items() if k in fields}, _EXIT_SPEC, required=_EXIT_REQUIRED)
                out[checked["name"]] = ProcessExit(**checked)
            except (BadFile, TypeError):
                continue
    return out


def _exit_spec() -> dict:
    from ups.status.record import RECORD_SPEC
    from ups.status.safeio import boolean, number, optional, text

    r = RECORD_SPEC
    return {"name": r["name"], "pid": r["pid"], "role": r["role"], "rank": r["rank"], "at": number(0.0),
            "exact": boolean, "record_state": r["state"], "phase": r["phase"], "step": r["step"], "error": r["error"],
            "exit_code": r["exit_code"], "at_mono": r["progress_mono"], "boot_id": r["boot_id"],
            "signal": optional(text(32, cut=False))}


_EXIT_SPEC = _exit_spec()
_EXIT_REQUIRED = ("name", "pid", "role", "rank", "at", "exact", "record_state", "phase", "step", "error", "exit_code")
