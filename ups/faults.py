"""Injected faults: ``--inject`` on the CLI, ``UPS_FAULTS`` in a job's environment.

Grammar: faults separated by ``;``, each ``name`` or ``name:key=value,key=value``::

    UPS_FAULTS="worker_hang:worker=1,after=5;slow_read:delay=0.2"

Values are parsed as int, then float, else kept as strings. Jobs ask
``faults.get("worker_hang")`` and decide with the fault's parameters; which names a job
understands is listed in its ``KNOWN_FAULTS`` and in ``ups launch ... --help``. An unknown
fault name is bad input (exit 2) at launch, so a typo never silently rehearses nothing.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ups.errors import UpsError

# The faults each job rehearses, here (not in the jobs, which import torch) so that the CLI
# checks --inject without importing torch.
PRECOMPUTE_FAULTS = ("worker_hang", "worker_crash", "slow_read", "write_enospc", "write_hang")
TRAIN_FAULTS = ("segv", "oom", "hang", "skip_collective")
# Any program under `ups launch torchrun|python` (ups.instrument.torch.rehearse): a straggler, a pause.
PROGRAM_FAULTS = ("slow_step", "slow_sample", "pause")

ENV_FAULTS = "UPS_FAULTS"


@dataclass(frozen=True)
class Fault:
    name: str
    params: dict[str, Any] = field(default_factory=dict)

    def get(self, key: str, default: Any = None) -> Any:
        return self.params.get(key, default)

    def matches(self, **where: Any) -> bool:
        """True when every given key is absent from the fault or equal to its value."""
        return all(k not in self.params or self.params[k] == v for k, v in where.items())

    def __str__(self) -> str:
        if not self.params:
            return self.name
        return self.name + ":" + ",".join(f"{k}={v}" for k, v in self.params.items())


def _value(text: str) -> Any:
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def parse_faults(spec: str | None) -> list[Fault]:
    """Parse a fault spec; UpsError naming the bad part on malformed input."""
    out: list[Fault] = []
    for part in (spec or "").split(";"):
        part = part.strip()
        if not part:
            continue
        name, _, rest = part.partition(":")
        name = name.strip()
        if not name.replace("_", "").isalnum():
            raise UpsError(f"bad fault {part!r}: the name must be letters, digits and '_'")
        params: dict[str, Any] = {}
        for kv in filter(None, (x.strip() for x in rest.split(","))):
            key, eq, value = kv.partition("=")
            if not eq or not key.strip():
                raise UpsError(f"bad fault {part!r}: expected key=value, got {kv!r}")
            params[key.strip()] = _value(value.strip())
        out.append(Fault(name, params))
    return out


class Faults:
    """The faults active in this process (from ``UPS_FAULTS`` unless given)."""

    def __init__(self, faults: Iterable[Fault] = ()) -> None:
        self.faults = list(faults)

    @classmethod
    def from_env(cls) -> Faults:
        return cls(parse_faults(os.environ.get(ENV_FAULTS)))

    def get(self, name: str, **where: Any) -> Fault | None:
        """The first fault called ``name`` whose parameters match ``where``."""
        return next((f for f in self.faults if f.name == name and f.matches(**where)), None)

    def __bool__(self) -> bool:
        return bool(self.faults)

    def __str__(self) -> str:
        return ";".join(str(f) for f in self.faults)


def validate_faults(specs: Iterable[str], known: Iterable[str]) -> str:
    """Join ``--inject`` values into one UPS_FAULTS string, refusing unknown names."""
    known = set(known)
    faults = [f for spec in specs for f in parse_faults(spec)]
    for f in faults:
        if f.name not in known:
            raise UpsError(f"unknown fault {f.name!r} (known: {', '.join(sorted(known))})")
    return ";".join(str(f) for f in faults)
