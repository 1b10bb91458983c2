"""One rank's lines of an attached job's log: ``ups logs RUN --rank N``.

An attached job has one log ups can read (where its stdout or stderr go; the observer copies it
into ``logs/job.log``), not one file a rank. Where torchrun's prefix names the rank a line came
from, that rank's lines are its log:

* ``[rank1]:`` the global rank (torch.distributed's own prefix on an uncaught exception, and
  torchrun's ``--log-line-prefix-template "[rank${rank}]:"``; a bare ``[1]:`` is not taken:
  torchrun's failure report numbers its entries so);
* ``[default1]:`` the role and the *local* rank (torchrun's ``--tee`` prefix, by default).

Where no line of the log names the rank, one line says what is available instead.
"""

from __future__ import annotations

from collections.abc import Callable

from ups.errors import UpsError
from ups.runs.rundir import RunDir
from ups.status.lineprefix import global_rank, read_prefixes

SCAN_BYTES = 4 << 20  # how much of the log's end is read to find the rank's prefix
PREFIX_BYTES = 64  # torchrun's prefixes fit in a line's first bytes


def rank_of_line(line: bytes, local_to_rank: dict[int, int]) -> int | None:
    """The rank a line's torchrun prefixes name (ups.status.lineprefix), or None. A local rank
    the attach did not record a rank for is taken as the rank (one node)."""
    found = read_prefixes(line[:PREFIX_BYTES].decode("latin-1"))
    rank = global_rank(found, local_to_rank)
    return found.local_rank if rank is None and found is not None else rank


def local_ranks(run: RunDir) -> dict[int, int]:
    """local rank -> rank for the processes found at the attach (this host's; the same number
    where the local rank was not recorded)."""
    procs = (run.read_manifest().get("attached") or {}).get("processes") or []
    return {p["local_rank"]: p["rank"] for p in procs
            if isinstance(p, dict) and isinstance(p.get("local_rank"), int) and isinstance(p.get("rank"), int)}


def rank_filter(run: RunDir, rank: int) -> Callable[[bytes], bool]:
    """Keeps rank ``rank``'s lines of the attached run's log copy; UpsError (one line saying
    what is available) when the job writes no log, or no line of it names that rank."""
    path = run.log_path("job")
    source = (run.read_manifest().get("attached") or {}).get("log")
    if not path.exists():
        raise UpsError(f"run {run.run_id} is attached and its job writes no log file (stdout and stderr go to a "
                       "terminal or a pipe): no log to show; `ups stacks` and `ups why` read it from outside")
    table = local_ranks(run)
    with open(path, "rb") as fh:
        fh.seek(0, 2)
        fh.seek(max(0, fh.tell() - SCAN_BYTES))
        named = {rank_of_line(line, table) for line in fh.read().splitlines()}
    if rank not in named:
        others = sorted(r for r in named if r is not None)
        have = f"its lines name rank(s) {', '.join(map(str, others))} only" if others else "no line names its rank"
        raise UpsError(f"run {run.run_id} is attached: its ranks write one log ({source or path}), and {have}; "
                       f"`ups logs {run.run_id}` shows all of it (torchrun --tee 3 prefixes each line with its rank)")
    return lambda line: rank_of_line(line, table) == rank
