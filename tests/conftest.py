"""Shared fixtures. Subprocesses started by tests import this checkout's ``ups``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# Every subprocess a test starts (jobs, torchrun ranks, `python -m ups`) must import the
# code under test, not whatever `ups` happens to be installed.
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
)
os.environ.pop("UPS_RUN_DIR", None)
os.environ.pop("UPS_RUNS_DIR", None)
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")


@pytest.fixture
def runs_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty runs root, also exported as UPS_RUNS_DIR for CLI calls and subprocesses."""
    root = tmp_path / "runs"
    root.mkdir()
    monkeypatch.setenv("UPS_RUNS_DIR", str(root))
    return root


class ProcessJanitor:
    """Starts subprocesses in their own session and kills whatever is left at teardown."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []

    def popen(self, args, **kwargs) -> subprocess.Popen:
        kwargs.setdefault("start_new_session", True)
        proc = subprocess.Popen(args, **kwargs)
        self.procs.append(proc)
        return proc

    def python(self, code: str, **kwargs) -> subprocess.Popen:
        return self.popen([sys.executable, "-c", code], **kwargs)

    def cleanup(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                proc.kill()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:  # pragma: no cover
                pass


@pytest.fixture
def procs():
    janitor = ProcessJanitor()
    yield janitor
    janitor.cleanup()
