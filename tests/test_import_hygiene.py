"""`ups --help`, `ups runs` and `ups status` never import heavy modules (fast over SSH)."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ups.runs.rundir import RunDir

pytestmark = pytest.mark.notorch  # also run on each other Python, without torch (tests/test_pythons.py)

# pynvml is allowed: `ups status` asks NVML for per-process GPU memory (lazily, ~10 ms).
HEAVY = ("torch", "textual", "wandb", "h5py", "prometheus_client")
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


@pytest.mark.parametrize("args", [["--help"], ["runs"], ["status"], ["status", "--json"], ["kill", "--help"],
                                  ["exporter", "--help"]])
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


# The job entry points and the models import torch at the top (docs/testing.md): only they may
# fail to import, and only for torch, where ups is installed without it.
NEED_TORCH = ("ups.jobs.", "ups.models.")

EACH_FIRST = """
import importlib, pkgutil, sys, traceback
import ups, console
names = sorted(m.name for pkg in (ups, console) for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."))
skip = ("ups.__main__", "ups.launch.supervise", "ups.jobs.ddp_probe")  # scripts: they run when imported
failed = []
for name in names:
    if name.startswith(skip) or ".sitecustomize" in name:
        continue
    for loaded in [m for m in sys.modules if m.split(".")[0] in ("ups", "console")]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except Exception:
        failed.append(name + ": " + traceback.format_exc().strip().splitlines()[-1])
print("\\n".join(failed))
"""


@pytest.mark.slow
def test_every_module_imports_first_on_its_own():
    """A tool importing one of our modules first (a test, a plugin, `python -c`) must not hit an
    import cycle that `ups`'s own order hides: `from ups.cli.runs import render_status` did."""
    res = subprocess.run([sys.executable, "-c", EACH_FIRST], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert res.returncode == 0, res.stderr[-2000:]
    failed = [line for line in res.stdout.splitlines() if line.strip()]
    if importlib.util.find_spec("torch") is None:  # ups installed without torch (tests/test_pythons.py)
        failed = [line for line in failed
                  if not (line.startswith(NEED_TORCH) and line.endswith("ModuleNotFoundError: No module named 'torch'"))]
    assert failed == [], "\n".join(failed)
