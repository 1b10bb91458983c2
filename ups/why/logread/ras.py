"""NCCL's RAS status report (``ncclras``, NCCL 2.24+), read as a log: who is missing, who is behind.

``ncclras`` asks the RAS threads of a running NCCL job for a global view and prints it as text:
a job summary, a table of communicators, then ``Errors`` and ``Warnings`` sections whose
entries name processes and ranks. The parts read here (NCCL's documented text form):

* ``DEAD`` / ``N job process(es) ... considered dead``, each ``Process PID on node HOST
  managing GPU G``: processes the RAS network lost;
* ``INCOMPLETE`` (job-wide, or ``#G-C (hash) INCOMPLETE`` for a communicator) with
  ``Missing communicator data from N rank(s)`` and ``Rank R -- GPU G managed by process PID on
  node HOST``: ranks that did not answer;
* ``#G-C (hash) MISMATCH`` with ``Communicator ranks have different AllReduce operation
  counts``, ``N ranks have launched up to operation X`` and ``Rank R has launched up to
  operation Y -- GPU ...`` (or ``has not launched any operations``): the ranks behind stopped
  first; the others wait for them in operation ``Y + 1``.

:func:`read_ras` returns None when the text holds no such report. Pure: text in, facts out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_SECTION = re.compile(r"^(Errors|Warnings)\s*$")
_RULE = re.compile(r"^=+\s*$")
_DEAD = re.compile(r"^\s*(\d+) job process(?:es are| is) considered dead")
_MISSING_PROCS = re.compile(r"^\s*Missing communicator data from (\d+) (job process(?:es)?|ranks?)")
_PROCESS = re.compile(r"^\s*Process (\d+) on node (\S+) managing GPUs? (.+?)\s*$")
_COMM = re.compile(r"^#(\d+)-(\d+) \(([0-9a-f]+)\) (INCOMPLETE|MISMATCH|ERROR)\s*$")
_OP_COUNTS = re.compile(r"^\s*Communicator ranks have different (\w+) operation counts")
_GROUP_UP_TO = re.compile(r"^\s*(\d+) ranks have launched up to operation (\d+)")
_GROUP_NONE = re.compile(r"^\s*(\d+) ranks have not launched any operations")
_RANK_UP_TO = re.compile(r"^\s*Rank (\d+) has launched up to operation (\d+)")
_RANK_NONE = re.compile(r"^\s*Rank (\d+) has not launched any operations")
_RANK_LINE = re.compile(r"^\s*Rank (\d+) (?:has status (\w+) )?-- (?:GPU (\S+) managed by process (\d+) on node (\S+)|\[process)")


@dataclass
class Behind:
    """Ranks of one communicator whose count of one collective differs from the most common."""

    comm: str  # "#0-0 (27a079b828ff1a75)"
    op: str  # AllReduce, Broadcast ...
    majority: int | None  # the operation most ranks launched up to
    ranks: dict[int, int] = field(default_factory=dict)  # rank -> operation it launched up to (0: none)
    line: str = ""
    n: int = 0


@dataclass
class RasReport:
    dead: list[str] = field(default_factory=list)  # "process 3487984 on node 172.16.64.213 (GPU 5)"
    missing_ranks: dict[int, str] = field(default_factory=dict)  # rank -> its process and node
    missing_processes: list[str] = field(default_factory=list)
    behind: list[Behind] = field(default_factory=list)
    first_line: str = ""
    first_n: int = 0

    def note(self, line: str, n: int) -> None:
        """The report's first line that says something is wrong (where the reading points)."""
        if not self.first_line:
            self.first_line, self.first_n = line.strip(), n

    @property
    def lagging(self) -> Behind | None:
        """The first communicator whose ranks launched different counts, with ranks behind the others."""
        return next((b for b in self.behind if b.ranks and b.majority is not None
                     and all(c < b.majority for c in b.ranks.values())), None)

    @property
    def ahead(self) -> Behind | None:
        return next((b for b in self.behind if b.ranks), None)


def read_ras(text: str) -> RasReport | None:
    """The RAS report in ``text`` (a log, or ``ncclras`` output saved to a file), or None."""
    if "ranks have launched up to operation" not in text and "considered dead" not in text \
            and "Missing communicator data" not in text and "operation counts" not in text:
        return None
    lines = text.splitlines()
    report = RasReport()
    in_report = False
    block: str | None = None
    current: Behind | None = None
    for n, raw in enumerate(lines):
        line = raw.rstrip()
        if _SECTION.match(line) and n + 1 < len(lines) and _RULE.match(lines[n + 1]):
            in_report = True
            continue
        if not in_report:
            continue
        if line.strip() in ("DEAD", "INCOMPLETE"):
            block, current = line.strip(), None
            continue
        m = _COMM.match(line)
        if m:
            block, current = f"{m.group(4)}:#{m.group(1)}-{m.group(2)} ({m.group(3)})", None
            continue
        if _DEAD.match(line) or _MISSING_PROCS.match(line):
            report.note(line, n)
            continue
        m = _PROCESS.match(line)
        if m and block in ("DEAD", "INCOMPLETE"):
            who = f"process {m.group(1)} on node {m.group(2)} (GPU {m.group(3)})"
            (report.dead if block == "DEAD" else report.missing_processes).append(who)
            continue
        m = _OP_COUNTS.match(line)
        if m and block and block.startswith("MISMATCH:"):
            current = Behind(block.split(":", 1)[1], m.group(1), None, line=line.strip(), n=n)
            report.behind.append(current)
            report.note(line, n)
            continue
        if current is not None:
            m = _GROUP_UP_TO.match(line) or _GROUP_NONE.match(line)
            if m:
                count = int(m.group(2)) if m.re is _GROUP_UP_TO else 0
                if current.majority is None:  # most frequent first (NCCL sorts them so)
                    current.majority = count
                continue
            m = _RANK_UP_TO.match(line) or _RANK_NONE.match(line)
            if m:
                current.ranks[int(m.group(1))] = int(m.group(2)) if m.re is _RANK_UP_TO else 0
                continue
        m = _RANK_LINE.match(line)
        if m and block and block.startswith("INCOMPLETE:"):
            where = f"process {m.group(4)} on node {m.group(5)} (GPU {m.group(3)})" if m.group(4) else "process unknown"
            report.missing_ranks[int(m.group(1))] = where
            report.note(line, n)
    if not (report.dead or report.missing_ranks or report.missing_processes or report.behind):
        return None
    return report


def ras_summary(report: RasReport) -> tuple[str, int | None, str, int]:
    """(class name, the rank to name or None, the line that says it, its index in the log):
    the ranks behind the others first (they stopped where the others wait), then ranks missing,
    then dead processes."""
    lag = report.lagging
    if lag is not None:
        rank = min(lag.ranks, key=lambda r: (lag.ranks[r], r))
        ranks = ", ".join(f"rank {r} at operation {c}" if c else f"rank {r} (none launched)"
                          for r, c in sorted(lag.ranks.items()))
        return ("nccl_rank_behind", rank,
                f"NCCL RAS: {lag.comm}: {lag.op} counts differ: {ranks}, the others launched up to operation "
                f"{lag.majority}: the ranks part at {lag.op} operation {lag.ranks[rank] + 1}", lag.n)
    if report.missing_ranks:
        rank = min(report.missing_ranks)
        return ("nccl_process_lost", rank,
                "NCCL RAS: no answer from " + "; ".join(f"rank {r} ({w})" for r, w in sorted(report.missing_ranks.items())[:4]),
                report.first_n)
    ahead = report.ahead
    if ahead is not None:  # ranks *ahead* of the others: they entered a collective the others never did
        rank = min(ahead.ranks)
        return ("collective_mismatch", rank,
                f"NCCL RAS: {ahead.comm}: {ahead.op} counts differ: "
                + ", ".join(f"rank {r} launched up to operation {c}" for r, c in sorted(ahead.ranks.items())[:4])
                + f", the others up to {ahead.majority}: the ranks part at {ahead.op} operation {(ahead.majority or 0) + 1}",
                ahead.n)
    gone = report.dead or report.missing_processes
    return ("nccl_process_lost", None, "NCCL RAS: " + ("dead: " if report.dead else "no answer from: ")
            + "; ".join(gone[:4]), report.first_n)
