"""A verdict: what is wrong, who, where, since when, on what evidence, and what to do next."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from ups.status.record import StatusRecord

MODES = (
    "healthy", "succeeded", "ended", "starting", "settling", "worker_stuck_in_read", "worker_stuck", "rank_stuck_peers_wait", "one_sided_collective", "collective_mismatch", "collective_timeout",
    "crashed_by_signal", "exception", "worker_exception", "cuda_in_worker", "no_normal_exit", "out_of_memory", "disk_full", "rendezvous_failed",
    "dataloader_resources", "stalled", "unresponsive", "dead", "failed", "killed", "lost", "unsupervised",
    "node_unreachable", "oom_killed", "killed_from_outside", "stopped_from_outside",
    "gpu_hardware", "cuda_fault", "gpu_throttled",
    "straggler_input", "straggler_compute", "straggler_host", "straggler_node", "straggler_unknown",  # ups.why.rules.stragglers
    "busy", "waiting", "no_signal", "hung",  # ups.why.rules.pauses: a pause is not a hang
    "loss_nonfinite", "loss_diverged", "step_rate_dropped", "gpu_memory_leak",  # ups.why.rules.metrics
)


def _log_classes() -> tuple[str, ...]:
    from ups.why.logread.classes import CLASSES

    return tuple(c.name for c in CLASSES if c.name not in MODES)


MODES = MODES + _log_classes()


def who_of(record: StatusRecord | None) -> dict[str, Any] | None:
    if record is None:
        return None
    return {"name": record.name, "role": record.role, "rank": record.rank, "worker": record.worker, "pid": record.pid,
            "host": record.host, "label": record.label}


@dataclass
class Verdict:
    mode: str
    headline: str
    ok: bool = False
    who: dict[str, Any] | None = None
    where: dict[str, Any] | None = None  # phase, site (file:line), function, frame (the innermost)
    since: float | None = None
    evidence: list[str] = field(default_factory=list)
    next: str = ""

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["text"] = self.text()
        return d

    def text(self, now: float | None = None) -> str:
        """The verdict as one paragraph."""
        parts = [self.headline.rstrip(".") + "."]
        where = self.where or {}
        if where.get("site") or where.get("frame"):
            at = where.get("site") or ""
            fn = f" in {where.get('qualname') or where['function']}" if where.get("function") else ""
            frame = where.get("frame")
            loc = f"{at}{fn}" if at else ""
            if frame and frame != loc:
                loc = f"{loc} ({frame})" if loc else str(frame)
            parts.append(f"Where: {loc}" + (f", phase {where['phase']}" if where.get("phase") else "") + ".")
        if self.since:
            ago = (now or time.time()) - self.since
            parts.append(f"Since {time.strftime('%H:%M:%S', time.localtime(self.since))} ({_ago(ago)} ago).")
        if self.evidence:
            parts.append("Evidence: " + "; ".join(e.rstrip(".") for e in self.evidence) + ".")
        if self.next:
            parts.append(f"Next: {self.next}")
        return " ".join(parts)


def _ago(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
