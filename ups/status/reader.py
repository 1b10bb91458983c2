"""Reading a run's status folder into an immutable snapshot.

The reader never raises on bad files: empty, torn, garbage and future-schema files become
:class:`ReadProblem` entries next to the records that could be read. The source of records
is an interface (:class:`StatusSource`) so that a multi-node run can later read records
relayed through another channel than a shared folder.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ups.status.printable import printable
from ups.status.record import RecordError, StatusRecord
from ups.status.safeio import BadFile, read_bytes

MAX_RECORD_BYTES = 1 << 20  # a record is ~1 KB; anything huge is not ours


@dataclass(frozen=True)
class ReadProblem:
    """A status file that could not be turned into a record, and why (both safe to show:
    a file's name is outside input too)."""

    file: str
    problem: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "file", printable(self.file))
        object.__setattr__(self, "problem", printable(self.problem))


@dataclass(frozen=True)
class StatusSnapshot:
    """All records of a run at one moment, plus the files that could not be read."""

    records: tuple[StatusRecord, ...]
    problems: tuple[ReadProblem, ...]
    read_at: float

    def by_name(self) -> dict[str, StatusRecord]:
        return {r.name: r for r in self.records}


class StatusSource(Protocol):
    """Anything that can produce a snapshot of a run's records."""

    def read(self) -> StatusSnapshot: ...


def read_record_file(path: str | os.PathLike[str]) -> StatusRecord:
    """Read one record through the trust boundary (:mod:`ups.status.safeio`); raises
    RecordError with a short reason on any problem (a FIFO, a device, a symlink, too large,
    not UTF-8, not JSON, a field of the wrong type or out of range)."""
    try:
        data = read_bytes(path, MAX_RECORD_BYTES)
    except FileNotFoundError:
        raise RecordError("unreadable (No such file or directory)") from None
    except BadFile as exc:
        raise RecordError(str(exc)) from None
    return StatusRecord.from_json(data)


def read_status_dir(
    status_dir: str | os.PathLike[str], include: Callable[[str], bool] | None = None
) -> StatusSnapshot:
    """Snapshot every ``*.json`` record in ``status_dir`` (temp files are skipped).

    ``include(name)`` (name without ``.json``) reads only some records: a screen that shows
    the ranks and one rank's workers need not parse 2,000 worker files every second.
    """
    status_dir = Path(status_dir)
    records: list[StatusRecord] = []
    problems: list[ReadProblem] = []
    try:
        entries = list(os.scandir(status_dir))  # records are sorted below, after filtering
    except FileNotFoundError:
        entries = []
    except OSError as exc:
        return StatusSnapshot((), (ReadProblem(str(status_dir), f"cannot list: {exc}"),), time.time())
    for entry in entries:
        name = entry.name
        if name.startswith(".") or not name.endswith(".json"):
            continue
        if include is not None and not include(name[:-5]):
            continue
        try:
            records.append(read_record_file(entry.path))
        except RecordError as exc:
            problems.append(ReadProblem(name, str(exc)))
    records.sort(key=record_order)
    problems.sort(key=lambda p: p.file)
    return StatusSnapshot(tuple(records), tuple(problems), time.time())


def record_order(r: StatusRecord) -> tuple[int, int, int, int, int, int, str]:
    """Launcher and agents first (by node), then each rank followed by its workers and helpers."""
    per_node = r.role in ("launcher", "agent")
    return (
        0 if per_node else 1,
        (r.node or 0) if per_node else (r.rank if r.rank is not None else -1),
        {"launcher": 0, "agent": 1, "rank": 0, "worker": 1, "helper": 2}.get(r.role, 3),
        r.loader or 0,
        -1 if r.worker is None else r.worker,
        r.pid if r.role == "helper" else 0,
        r.name,
    )


class DirectoryStatusSource:
    """Records from ``<run>/status/`` on a local or shared file system."""

    def __init__(self, status_dir: str | os.PathLike[str]) -> None:
        self.status_dir = Path(status_dir)

    def read(self) -> StatusSnapshot:
        return read_status_dir(self.status_dir)
