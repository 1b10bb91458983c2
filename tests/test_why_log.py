"""`ups why --log FILE` on real captured logs of runs ups did not launch: a torchrun run, a
Lightning run and a Hugging Face Trainer run, each a small program written the way its
framework's docs show (tests/programs/logs/), failing for real, its stdout and stderr captured
to a file as a user's terminal, SLURM or kubectl would. One run per framework (module
fixtures); each verdict is what a person reading the log would want: the class, the rank, the
line, where, and the fix.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import run_ups

pytestmark = pytest.mark.slow

PROGRAMS = Path(__file__).parent / "programs" / "logs"


def needs(module: str):
    return pytest.mark.skipif(importlib.util.find_spec(module) is None,
                              reason=f"{module} is not installed (pip install -e '.[test]')")


def capture(cmd: list[str], log: Path, cwd: Path) -> Path:
    """Run a program to its end with stdout and stderr in one file, as `cmd > log 2>&1` does."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    env.pop("UPS_RUN_DIR", None)
    with open(log, "wb") as out:
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=cwd, env=env, timeout=300,
                              start_new_session=True)
    assert proc.returncode != 0, log.read_text()  # the program failed, for real
    return log


def line_of(program: Path, code: str) -> int:
    return next(n for n, line in enumerate(program.read_text().splitlines(), 1) if code in line)


def why(log: Path) -> dict:
    res = run_ups("why", "--log", str(log), "--json", timeout=60)
    assert res.returncode == 1, res.stderr  # a failure is named
    return json.loads(res.stdout)


# -- torchrun: two ranks with gloo; rank 1's allocation is refused, rank 0 loses its peer ------------
@pytest.fixture(scope="module")
def torchrun_log(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("torchrun")
    program = PROGRAMS / "ddp_host_oom.py"
    return capture([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                    str(program)], tmp / "torchrun.log", tmp)


@pytest.mark.xdist_group("why-log-torchrun")  # one worker, one job for both: the fixture is per test process
def test_torchrun_log_names_the_refused_allocation_on_rank_1(torchrun_log: Path):
    text = torchrun_log.read_text()
    # What makes the log hard to read: the peer's error or torchrun's SIGTERM to it (whichever
    # came first: rank 0 sees its peer's socket close, the agent polls every 0.1 s), and the report.
    assert ("Connection closed by peer" in text or "SIGTERM" in text) and "ChildFailedError" in text
    v = why(torchrun_log)
    assert v["class"] == "host_oom" and v["kind"] == "class", v
    assert v["rank"] == 1, v
    assert "DefaultCPUAllocator: can't allocate memory" in v["line"]
    assert v["site"] == f"ddp_host_oom.py:{line_of(PROGRAMS / 'ddp_host_oom.py', 'torch.empty(1 << 62')}"
    assert v["fix"] and v["who"] and v["where"]
    # The text form says the same, for a person.
    res = run_ups("why", "--log", str(torchrun_log), timeout=60)
    assert res.returncode == 1 and res.stdout.startswith("host_oom: ") and "rank: 1" in res.stdout
    assert "fix: " in res.stdout and "DefaultCPUAllocator" in res.stdout


@pytest.mark.xdist_group("why-log-torchrun")
def test_torchrun_log_read_from_stdin_is_the_same_verdict(torchrun_log: Path):
    with open(torchrun_log, "rb") as fh:
        res = subprocess.run([sys.executable, "-m", "ups", "why", "--log", "-", "--json"], stdin=fh, capture_output=True,
                             timeout=60)
    assert res.returncode == 1, res.stderr
    v = json.loads(res.stdout)
    assert (v["class"], v["rank"]) == ("host_oom", 1)


# -- Lightning: the DataModule's data file is not there ------------------------------------------------
@pytest.fixture(scope="module")
def lightning_log(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("lightning")
    return capture([sys.executable, str(PROGRAMS / "lit_missing_data.py"), "--data", "data/train.npy"],
                   tmp / "lightning.log", tmp)


@needs("lightning")
def test_lightning_log_names_the_missing_data_file(lightning_log: Path):
    assert "GPU available" in lightning_log.read_text()  # Lightning's own start-up lines are there
    v = why(lightning_log)
    assert v["class"] == "file_missing", v
    assert "No such file or directory: 'data/train.npy'" in v["line"]
    assert v["site"] == f"lit_missing_data.py:{line_of(PROGRAMS / 'lit_missing_data.py', 'np.load(self.path)')}"
    assert v["rank"] is None and "path" in v["fix"]


# -- Hugging Face Trainer: resumed from a checkpoint whose weights are an HTML page -------------------
@pytest.fixture(scope="module")
def hf_log(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("hf")
    return capture([sys.executable, str(PROGRAMS / "hf_resume_corrupt.py"), str(tmp / "checkpoint-500")],
                   tmp / "hf.log", tmp)


@needs("transformers")
def test_hf_trainer_log_names_the_checkpoint_that_is_not_one(hf_log: Path):
    v = why(hf_log)
    assert v["class"] == "checkpoint_corrupt", v
    assert "SafetensorError" in v["line"] and "header" in v["line"]
    assert v["site"] == f"hf_resume_corrupt.py:{line_of(PROGRAMS / 'hf_resume_corrupt.py', 'trainer.train(resume_from_checkpoint=str(')}"
    assert "download" in v["fix"]
