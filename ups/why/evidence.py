"""Everything a verdict may rest on, read once and lazily: the run's view (records + health),
its events (the launcher's process exits, automatic stack dumps, kills), each process's
stack file, the job's and the ranks' logs, the ranks' metric series, their Flight Recorder
dumps, and what this host says
(:mod:`ups.why.host`: for a live stuck process what the kernel says it is blocked in, the
cgroup's OOM kills, who holds a port, free space, the GPUs).

The rules read nothing else: a rule is a pure function of its evidence. A test builds one
from a view and a :class:`~ups.why.host.GivenHost`, with no process and nothing read from
the machine.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import cached_property

from ups.runs.exits import ProcessExit, read_exits
from ups.runs.rundir import RunDir
from ups.runs.view import ProcessView, RunView
from ups.status.health import Health, busy_doing
from ups.status.record import StatusRecord
from ups.status.series import read_run_series
from ups.why import flight, stacks
from ups.why.host import HostFacts, ProcFacts

LOG_TAIL_BYTES = 200_000


@dataclass
class Evidence:
    view: RunView
    now: float = field(default_factory=time.time)
    host: HostFacts = field(default_factory=HostFacts)
    """This machine's facts (read lazily); a :class:`~ups.why.host.GivenHost` in tests."""
    _stacks: dict[str, stacks.Section | None] = field(default_factory=dict)
    _texts: dict[str, str] = field(default_factory=dict)

    @property
    def run(self) -> RunDir:
        return self.view.run

    @property
    def manifest(self) -> dict:
        return self.view.manifest or {}

    @cached_property
    def events(self) -> list[dict]:
        return self.run.read_events()

    @cached_property
    def exits(self) -> dict[str, ProcessExit]:
        """The current attempt's process ends: a restarted run's earlier attempts ended their
        processes too (killed for the restart), under the same names as this attempt's."""
        exits = read_exits(self.run)
        restarted = [a.get("ended_at") for a in self.manifest.get("attempts") or []
                     if isinstance(a, dict) and a.get("records") and isinstance(a.get("ended_at"), int | float)]
        if not restarted:
            return exits
        since = max(restarted)
        return {name: ex for name, ex in exits.items() if ex.at > since}

    def stack_text(self, record: StatusRecord) -> str:
        """A process's stack file (its end); another node's, read with ``--remote``: as its
        node's stream sent it."""
        if record.name not in self._texts:
            remote = self.view.remote_stacks.get(record.name)
            self._texts[record.name] = remote if remote is not None else _tail(
                self.run.path / (record.stack_file or f"stacks/{record.name}.txt"), 256_000)
        return self._texts[record.name]

    def stack(self, record: StatusRecord, kind: str | None = None) -> stacks.Section | None:
        """The latest stack section of a process (of ``kind``: dump, fatal, exception)."""
        key = f"{record.name}:{kind}"
        if key not in self._stacks:
            self._stacks[key] = stacks.latest(self.stack_text(record), kind)
        return self._stacks[key]

    @cached_property
    def job_log(self) -> str:
        return _tail(self.run.log_path("job"), LOG_TAIL_BYTES)

    def rank_log(self, rank: int) -> str:
        from ups.runs.actions import find_logs

        try:
            return "\n".join(_tail(p, LOG_TAIL_BYTES // 2) for p in find_logs(self.run, rank))
        except Exception:  # noqa: BLE001 - no per-rank log is no evidence, not an error
            return ""

    @cached_property
    def series(self) -> dict[str, dict]:
        """The processes' metric series (``metrics/<name>.json``) by record name; unreadable ones
        are left out."""
        found, _problems = read_run_series(self.run.path)
        return found

    @cached_property
    def flight(self) -> flight.Reading:
        """The ranks' PyTorch Flight Recorder dumps in the run's ``flight/`` folder
        (:mod:`ups.why.flight`: JSON, or a pickle only from a run proven to be yours)."""
        return flight.read_run_dumps(self.run.path)

    def gpu_of(self, record: StatusRecord):
        """The device a process of this host runs on: the one its record names, else its local
        rank's (torchrun's convention, one GPU a rank)."""
        snap = self.host.gpus
        if snap is None or record.host != self.host.hostname:
            return None
        index = record.gpu.device if record.gpu is not None and record.gpu.device is not None else record.local_rank
        return next((d for d in snap.devices if d.index == index), None)

    def proc(self, record: StatusRecord) -> ProcFacts | None:
        """Kernel facts of a live process of this host (None elsewhere)."""
        if record.host != self.host.hostname or record.is_final:
            return None
        return self.host.proc(record.pid)

    def processes(self, *roles: str) -> list[ProcessView]:
        return [p for p in self.view.processes if not roles or p.record.role in roles]

    @cached_property
    def observed(self) -> dict[str, dict]:
        """What the launcher sees of the processes it watches (ups.launch.proof, published in
        its record's ``metrics.observed``): by record name, ``state`` busy | idle | unsure |
        watching, ``proven``, and the last window's figures and text."""
        out: dict[str, dict] = {}
        for p in self.view.processes:
            if p.record.role == "launcher" and p.verdict.health not in (Health.DEAD, Health.UNRESPONSIVE):
                found = p.record.metrics.get("observed")
                if isinstance(found, dict):
                    out.update({k: v for k, v in found.items() if isinstance(v, dict)})
        return out

    @cached_property
    def watched_by_launcher(self) -> bool:
        """A live launcher of this run watches its processes: what it sees is coming."""
        return any(p.record.role == "launcher" and p.record.state == "running"
                   and p.verdict.health not in (Health.DEAD, Health.UNRESPONSIVE) for p in self.view.processes)

    def doing(self, p: ProcessView) -> tuple[str, str]:
        """What a process that makes no progress is doing, as far as is known: (``busy``,
        what) | (``idle``, the figures) | (``unsure``, the figures) | (``checking``, "") while
        the launcher has not seen a whole window yet | (``unknown``, "") with no launcher."""
        seen = self.observed.get(p.record.name) or {}
        last = seen.get("last") if isinstance(seen.get("last"), dict) else {}
        state = seen.get("state")
        doing = busy_doing(p.record)
        if state == "busy":
            return "busy", doing or _what_moved(last)
        if state == "idle":  # what the kernel saw beats the phase's word (a save hung on a dead mount)
            return "idle", str(last.get("text") or "")
        if doing is not None:
            return "busy", doing
        if state == "unsure":
            return "unsure", str(last.get("text") or "")
        return ("checking", "") if self.watched_by_launcher else ("unknown", "")


def _what_moved(window: dict) -> str:
    """What the launcher saw a busy process do, in words: computing, writing, sending."""
    def rate(bps: float) -> str:
        return f"{bps / 1e6:.1f} MB/s" if bps >= 1e6 else f"{bps / 1e3:.0f} KB/s"

    through = f" through {window['children'][0]}" if window.get("children") else ""
    if (window.get("tcp_bps") or 0) >= 4096:
        return f"sending or receiving data{through} ({rate(window['tcp_bps'])} on its sockets)"
    if (window.get("io_bps") or 0) >= 4096:
        return f"reading or writing{through} ({rate(window['io_bps'])})"
    return f"computing{through} (CPU {100 * (window.get('cpu') or 0):.0f}%, a thread busy {100 * (window.get('demand') or 0):.0f}% of the time)"


def _tail(path, limit: int) -> str:
    # Regular files only, never blocking (a FIFO named job.log is no evidence, and no hang).
    from ups.status.safeio import try_tail

    return try_tail(path, limit) or ""
