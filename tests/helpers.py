"""Test helpers: waiting on conditions with a deadline (never sleep-and-hope)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def wait_for(
    predicate: Callable[[], T],
    timeout: float,
    *,
    interval: float = 0.05,
    message: str = "condition",
) -> T:
    """Poll ``predicate`` until it returns a truthy value; fail the test at the deadline."""
    deadline = time.monotonic() + timeout
    last_exc: Exception | None = None
    while True:
        try:
            value = predicate()
            if value:
                return value
        except Exception as exc:  # noqa: BLE001 - keep polling, report the last one
            last_exc = exc
        if time.monotonic() > deadline:
            extra = f" (last error: {last_exc!r})" if last_exc else ""
            raise AssertionError(f"timed out after {timeout:g} s waiting for {message}{extra}")
        time.sleep(interval)


def run_ups(*args: str, env: dict[str, str] | None = None, timeout: float = 60, cwd: str | Path | None = None) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess (``python -m ups``)."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "ups", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        cwd=cwd,
    )


def read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())
