"""Reading a log the way an engineer does: its lines (who printed them, which are context),
its events (exceptions and their chains, torchrun's reports, NCCL, CUDA, kernel and SLURM
lines), and the verdict on the root-cause event: a known failure class with who, where and
the fix, the program's own error ("your code raised X at file:line"), or an unknown error
said as such. One reading for `ups why --log FILE` and for the live verdicts of `ups why RUN`.
"""

from __future__ import annotations

from ups.why.logread.classes import BY_NAME, CLASSES, LogClass
from ups.why.logread.decide import Reading, read_log

__all__ = ["BY_NAME", "CLASSES", "LogClass", "Reading", "read_log"]
