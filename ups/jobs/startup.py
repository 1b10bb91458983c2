"""What every job process does the same way as it starts: take its exit code for bad input,
find the run it reports into, and pick its device. Shared by ups.jobs.precompute and
ups.jobs.train."""

from __future__ import annotations

import os

import torch

from ups.errors import UpsError
from ups.runs.rundir import RunDir
from ups.status.reporter import ENV_RUN_DIR

EXIT_BAD_INPUT = 2  # a bad config or option, before any work: as UpsError's exit code


def run_from_env() -> RunDir | None:
    """The run folder the launcher gave this process (``UPS_RUN_DIR``); None when run by hand."""
    run_dir = os.environ.get(ENV_RUN_DIR)
    return RunDir(run_dir) if run_dir else None


def resolve_device(want: str) -> str:
    """A config's ``device``: ``auto`` becomes cuda where CUDA is available, else cpu; cuda
    asked for where there is none is bad input, not a silent run on the CPU."""
    if want == "auto":
        want = "cuda" if torch.cuda.is_available() else "cpu"
    if want.startswith("cuda") and not torch.cuda.is_available():
        raise UpsError(f"device: {want!r} asked for but CUDA is not available on this machine")
    return want
