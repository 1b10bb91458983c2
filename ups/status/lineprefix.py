"""torchrun's line prefixes: the one reader of who printed a line of a torchrun job's log.

Two prefixes, often both on one line (``[default1]:[rank3]: Traceback ...``, recorded in
tests/data/torchrun_prefixes/):

* ``[rank3]:``: the **global** rank. torch.distributed's own excepthook prefixes an uncaught
  exception's lines so once the process group is up (torch >= 2.2), and torchrun prints it
  for every line with ``TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE='[rank${rank}]:'``;
* ``[default1]:``: the role (``default`` unless ``--role``) and the **local** rank, on every
  line with ``--tee`` (torchrun's template ``[${role_name}${local_rank}]:``). On one node it is
  the global rank too; on several nodes every node has a ``[default0]:``.

A bare number (``[1]:``) is never taken: torchrun's failure report numbers its entries so; nor
another word's (``[epoch3]:`` is a program's own print), so a job started with torchrun's
``--role NAME`` has its ``[NAME1]:`` lines read as no rank's.
"""

from __future__ import annotations

import re

# One prefix: "rank" or the role, a number, in brackets, a colon, at most one space (the line's
# own indentation, a traceback's frame, is the line's).
PATTERN = r"\[(?P<role>rank|default)(?P<n>\d+)\]:[ \t]?"
_PREFIX = re.compile(PATTERN)
GLOBAL_ROLE = "rank"


class Prefixes:
    """What the torchrun prefixes at the start of a line say: ``rank`` (global, None when no
    ``[rankN]:``), ``local_rank`` (from ``[roleN]:``, None when none), ``end`` (where the
    line's own text starts)."""

    __slots__ = ("end", "local_rank", "rank")

    def __init__(self, rank: int | None, local_rank: int | None, end: int) -> None:
        self.rank, self.local_rank, self.end = rank, local_rank, end

    def __repr__(self) -> str:
        return f"Prefixes(rank={self.rank}, local_rank={self.local_rank}, end={self.end})"


def read_prefixes(line: str, start: int = 0) -> Prefixes | None:
    """torchrun's prefixes at ``line[start:]``, in any order and number; None when it has none."""
    rank = local = None
    pos = start
    while True:
        m = _PREFIX.match(line, pos)
        if m is None:
            break
        n = int(m.group("n"))
        if m.group("role") == GLOBAL_ROLE:
            rank = n if rank is None else rank
        elif local is None:
            local = n
        pos = m.end()
    return None if pos == start else Prefixes(rank, local, pos)


def strip_prefixes(line: str) -> str:
    """The line as the process printed it, torchrun's prefixes off."""
    found = read_prefixes(line)
    return line if found is None else line[found.end:]


def global_rank(found: Prefixes | None, local_to_rank: dict[int, int] | None = None) -> int | None:
    """The global rank a line's prefixes name: ``[rankN]:``'s, else the local rank through
    ``local_to_rank`` (one node's table: local rank -> rank); None when neither tells."""
    if found is None:
        return None
    if found.rank is not None:
        return found.rank
    if found.local_rank is not None and local_to_rank is not None:
        return local_to_rank.get(found.local_rank)
    return None
