"""`ups --help`, `ups runs` and `ups status` never import heavy modules (fast over SSH)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ups.runs.rundir import RunDir

# pynvml is allowed: `ups status` asks NVML for per-process GPU memory (lazily, ~10 ms).
HEAVY = ("torch", "textual", "wandb", "h5py")
REPO = Path(__file__).resolve().parents[1]

PROBE = """
import sys
sys.argv = ["ups", *{args!r}]
from ups.cli.app import main
try:
    main()
except SystemExit:
    pass
loaded = sorted(m for m in {heavy!r} if m in sys.modules)
print("HEAVY:" + ",".join(loaded), file=sys.stderr)
"""


@pytest.mark.parametrize("args", [["--help"], ["runs"], ["status"], ["status", "--json"], ["kill", "--help"]])
def test_cli_paths_import_nothing_heavy(runs_root, args):
    RunDir.create(runs_root, "test")
    res = subprocess.run(
        [sys.executable, "-c", PROBE.format(args=args, heavy=HEAVY)],
        capture_output=True, text=True, timeout=60,
    )
    line = [ln for ln in res.stderr.splitlines() if ln.startswith("HEAVY:")]
    assert line == ["HEAVY:"], res.stderr


@pytest.mark.skipif(shutil.which("ruff") is None, reason="ruff not installed")
def test_ruff_bans_module_level_heavy_imports():
    res = subprocess.run(
        ["ruff", "check", "--select", "TID253", "ups", "console"], cwd=REPO, capture_output=True, text=True
    )
    assert res.returncode == 0, res.stdout + res.stderr
