"""torch's DataLoader's words on its workers' deaths: the one reader of them.

torch (``torch/utils/data/_utils/signal_handling.py`` and ``dataloader.py``) says a worker died in
two sentences: its SIGCHLD handler's ``DataLoader worker (pid 123) is killed by signal:
Killed.``, and the loader's own finding, when its wait for a batch times out or fails,
``DataLoader worker (pid(s) 123, 124) exited unexpectedly``. The job's log carries them (after
a torchrun prefix, in a traceback's last line); the log reader, the rules and the attach
observer's churn read them here.
"""

from __future__ import annotations

import re

# "pid 123" or "pid(s) 123, 124"; then how it ended, where the sentence says
_NAMED = re.compile(r"DataLoader worker \(pid\(?s?\)? ?([\d, ]+)\)")
_DEATH = re.compile(_NAMED.pattern + r"\s*(?:is killed by signal: ([^.\n]+)|exited unexpectedly)")
EXITED = "exited unexpectedly"


def named_workers(text: str) -> set[int]:
    """The pids the first ``DataLoader worker (pid ...)`` of ``text`` names (none: empty)."""
    m = _NAMED.search(text)
    return {int(p) for p in re.findall(r"\d+", m.group(1))} if m else set()


def worker_deaths(text: str) -> list[tuple[list[int], str]]:
    """Each death ``text`` tells: (the workers' pids, how: ``"killed by signal: Killed"`` or
    :data:`EXITED`), in order."""
    if "DataLoader worker" not in text:
        return []
    return [([int(p) for p in re.findall(r"\d+", m.group(1))],
             f"killed by signal: {m.group(2).strip()}" if m.group(2) else EXITED) for m in _DEATH.finditer(text)]
