"""The shared status protocol: record schema, Reporter (writer), reader, health rules.

Knows nothing of the UI and imports nothing heavy.
"""

from ups.status.health import (
    Health,
    HealthVerdict,
    Thresholds,
    classify_health,
    classify_run,
    worst,
)
from ups.status.reader import ReadProblem, StatusSnapshot, read_status_dir
from ups.status.record import SCHEMA_VERSION, GpuMemory, StatusRecord
from ups.status.reporter import NullReporter, Reporter

__all__ = [
    "SCHEMA_VERSION",
    "GpuMemory",
    "Health",
    "HealthVerdict",
    "NullReporter",
    "ReadProblem",
    "Reporter",
    "StatusRecord",
    "StatusSnapshot",
    "Thresholds",
    "classify_health",
    "classify_run",
    "read_status_dir",
    "worst",
]
