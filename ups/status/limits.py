"""What a process learns of its own rhythm, for the Reporter (:mod:`ups.status.reporter`):
the learned stall limit (p99 of the recent gaps between progress) and the recent rate.

The gaps themselves are appended by the Reporter's hot path to a plain deque of
``INTERVALS_KEPT``; the heartbeat thread derives the figures from it here.
"""

from __future__ import annotations

from collections import deque

INTERVALS_KEPT = 256  # recent gaps between progress, for the learned stall limit (p99)
RATE_WINDOW_S = 10.0
# Entering one of these breaks the current progress interval: an eval or a checkpoint between
# two steps has a limit of its own and must not teach the process that steps are that slow.
LONG_PHASES = frozenset(("eval", "checkpoint", "load", "dist.init", "ddp.wrap", "model.build", "data.load"))


def learned_p99(intervals: deque[float]) -> float | None:
    """The p99 of the gaps between steps (seconds, rounded), None until there are 8."""
    if len(intervals) < 8:
        return None
    ordered = sorted(intervals)
    return round(ordered[int(0.99 * (len(ordered) - 1))], 4)


class RateWindow:
    """Steps per second over the last ``RATE_WINDOW_S`` seconds, from (time, step) samples."""

    def __init__(self) -> None:
        self.samples: deque[tuple[float, int]] = deque()

    def update(self, now: float, step: int) -> float | None:
        """Add a sample; the rate over the window, None while it spans under 0.5 s or no step."""
        samples = self.samples
        samples.append((now, step))
        while len(samples) > 2 and now - samples[0][0] > RATE_WINDOW_S:
            samples.popleft()
        t0, s0 = samples[0]
        if now - t0 >= 0.5 and step:
            return max(0.0, (step - s0) / (now - t0))
        return None
