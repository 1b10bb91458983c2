"""What the heartbeat thread samples for the Reporter (:mod:`ups.status.reporter`): the
training metrics read off the training thread (ups.instrument.metrics), the GPU's memory,
and the process's bounded history of them (:mod:`ups.status.series`).

Samplers never wait on the training thread, and a broken one is dropped: it must not stop
heartbeats. Imported by every instrumented process: standard library's light modules only
(the series module is imported by the heartbeat thread once there is a point to keep).
"""

from __future__ import annotations

import time
from collections import deque

from ups.status.identity import env_int
from ups.status.schema import LOSS_TRACE

ENV_ATTEMPT = "UPS_ATTEMPT"  # 1 for a run's first attempt; a restart after a hang counts up
TRACE_KEPT = 4096  # losses read and not yet in the series (a tick without a series drops the oldest)

TYPE_CHECKING = False  # typing costs ~10 ms to import; annotations here are strings
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from ups.status.series import SeriesWriter


def series_number(value: Any) -> Any:
    """A metric as a series cell: numbers as they are, ``"nan"``/``"inf"`` kept, else None."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value
    if value in ("nan", "inf", "-inf"):
        return float(value)
    return None


METRIC_ERRORS_KEPT = 3  # a metric sampler that fails this many ticks in a row is stopped


class Samplers:
    """The metric samplers, the GPU sampler, the loss trace and the series of one process."""

    def __init__(self, run_dir: str, gpu_sampler: Callable[[], Any] | None, *, history: bool) -> None:
        self.run_dir = run_dir
        self.metric_samplers: list[Callable[[], dict[str, Any]]] = []
        self._metric_errors: dict[int, int] = {}  # id(sampler) -> its errors in a row
        self._gpu_sampler = gpu_sampler
        # A rank's series is started by the heartbeat thread once there is a point to keep (the
        # read of an earlier attempt's file off every process's start-up). Its module is
        # imported here, in the thread that starts the Reporter: an import in the heartbeat
        # thread could meet the program's own imports (ups.status.heartbeat.name_this_thread).
        self.history: SeriesWriter | None = None
        self.history_wanted = history
        if history:
            import ups.status.series  # noqa: F401 - loaded now, on this thread
        self.trace: deque[tuple[int, float]] = deque(maxlen=TRACE_KEPT)  # losses read since the last series tick

    def sample_gpu(self, current: Any) -> Any:
        """The GPU sampler's reading, else ``current`` (no sampler, or it broke and is dropped)."""
        sampler = self._gpu_sampler
        if sampler is None:
            return current
        try:
            return sampler()
        except Exception:  # noqa: BLE001 - a broken sampler must not stop heartbeats
            self._gpu_sampler = None
            return current

    def set_gpu_sampler(self, sampler: Callable[[], Any] | None) -> None:
        self._gpu_sampler = sampler

    @property
    def samples_gpu(self) -> bool:
        """Whether a GPU sampler is set."""
        return self._gpu_sampler is not None

    def sample_metrics(self, metrics: dict[str, Any]) -> None:
        """Merge what the metric samplers return into ``metrics``; their loss trace is kept for the series."""
        for sampler in list(self.metric_samplers):
            try:
                values = sampler()
            except Exception as exc:  # noqa: BLE001 - a broken sampler must not stop heartbeats
                # One error (a value read while the training thread changed it) is a tick without
                # metrics, not the end of them for a days-long run: only METRIC_ERRORS_KEPT in a
                # row stop a sampler, and the record says why.
                errors = self._metric_errors[id(sampler)] = self._metric_errors.get(id(sampler), 0) + 1
                metrics["metrics_error"] = f"{type(exc).__name__}: {exc}"[:200]
                if errors >= METRIC_ERRORS_KEPT:
                    self.metric_samplers.remove(sampler)
                continue
            if self._metric_errors.pop(id(sampler), None) is not None:
                metrics.pop("metrics_error", None)
            if values:
                trace = values.pop(LOSS_TRACE, None)
                if trace:
                    self.trace.extend(trace)  # for the series (every step), not the record
                metrics.update(values)

    def history_tick(self, name: str, step: int, metrics: dict[str, Any], gpu: Any, rate: float | None) -> None:
        """One point of the process's series per tick in which it moved; the file every few s."""
        history = self.history
        if history is None and not self.history_wanted:
            return
        m = metrics
        loss = m.get("loss")
        if not step and loss is None:
            return
        if history is None:
            from ups.status.series import SeriesWriter

            history = self.history = SeriesWriter(self.run_dir, name, attempt=env_int(ENV_ATTEMPT) or 1)
        trace = list(self.trace)
        self.trace.clear()
        parts = m.get("step_parts")  # the window's median step (ups.status.steptime), once it has one
        step_time = parts.get("step") if isinstance(parts, dict) else None
        history.add({"t": time.time(), "step": step, "loss": series_number(loss), "lr": series_number(m.get("lr")),
                     "grad_norm": series_number(m.get("grad_norm")), "rate": rate, "sps": m.get("samples_per_s"),
                     "tps": m.get("tokens_per_s"), "mem": getattr(gpu, "allocated", None),
                     "step_time": series_number(step_time[0]) if isinstance(step_time, list) and step_time else None},
                    steps=trace)
        if isinstance(m.get("loss_nonfinite"), dict):
            history.note_nonfinite(m["loss_nonfinite"])
        history.maybe_write()

    def drop_history(self) -> None:
        """The series failed: history is a bonus, heartbeats are not; keep none from now on."""
        self.history, self.history_wanted = None, False

    def write_history(self) -> None:
        """Write the series file now (the process is closing)."""
        if self.history is not None:
            self.history.maybe_write(force=True)
