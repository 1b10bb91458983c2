"""`ups status` and `ups runs` in an 80-column terminal or a pipe: one line per process."""

from __future__ import annotations

import re
import sys
import textwrap

import pytest
from helpers import run_ups, status_now, wait_for

from ups.launch.spawn import launch_run

# Rank 0 waits for data with a long stall reason; its worker 0 failed with a long error.
JOB = textwrap.dedent(
    """
    import os, time
    from ups.status import Reporter
    worker = Reporter(os.environ["UPS_RUN_DIR"], role="worker", rank=0, worker=0, interval=0.2).start()
    worker.phase("data.open")
    worker.fail("DataError: /data/pdebench/2D_DarcyFlow_beta1.0_Train.hdf5: not a readable HDF5 file (truncated file)")
    worker.close()
    with Reporter.from_env(total=400, unit="samples", interval=0.2) as rep:
        rep.phase("data.wait")
        rep.advance()
        time.sleep(3600)
    """
)
ERROR = "DataError: /data/pdebench/2D_DarcyFlow_beta1.0_Train.hdf5: not a readable HDF5 file (truncated file)"
NARROW = {"COLUMNS": "80"}


@pytest.fixture
def stalled_run(runs_root):
    run = launch_run(runs_root, "precompute", [sys.executable, "-c", JOB], argv=["test"],
                     thresholds={"stalled_after": 0.5, "startup_grace": 0.0, "heartbeat_interval": 0.2})

    def stalled():
        data = status_now(run)
        health = {p["name"]: p["health"] for p in data["processes"]}
        return health.get("rank-0") == "stalled" and health.get("rank-0-worker-0") == "failed" and "launcher" in health and data

    data = wait_for(stalled, 60, interval=0.2, message="rank stalled and worker failed")
    yield run, data["processes"]
    run_ups("kill", run.run_id, "--force")


LABELS = {"launcher": "launcher", "rank-0": "rank 0", "rank-0-worker-0": "worker 0"}


def rows(out: str, name: str, pid: int) -> list[str]:
    """The table rows of one process: its label, then its pid."""
    return [ln for ln in out.splitlines() if re.match(rf"\s*{LABELS[name]}\s+{pid}\s", ln)]


def assert_one_line_per_process(lines: list[str], processes: list[dict]) -> None:
    """Right under the header, one line per process (label, pid, ..., health word), nothing between."""
    header = [i for i, ln in enumerate(lines) if ln.startswith("PROCESS")]
    assert len(header) == 1 and "HEALTH" in lines[header[0]], "\n".join(lines)
    table = lines[header[0] + 1 : header[0] + 1 + len(processes)]
    for p in processes:
        found = [ln for ln in table if re.match(rf"\s*{LABELS[p['name']]}\s+{p['pid']}\s", ln)]
        assert len(found) == 1 and p["health"] in found[0], f"{p['name']}:\n" + "\n".join(lines)


def test_status_keeps_each_process_on_one_line_at_80_columns(stalled_run):
    run, processes = stalled_run
    res = run_ups("status", run.run_id, env=NARROW)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert max(len(ln) for ln in lines) <= 80, res.stdout
    assert_one_line_per_process(lines, processes)
    # The reasons that did not fit follow the table whole, from the name of the process on.
    text = " ".join(res.stdout.split())
    assert f"rank 0 / worker 0: failed: {ERROR}" in text and "rank 0: stalled: no progress for" in text, res.stdout


def test_status_wide_shows_every_reason_whole_on_its_row(stalled_run):
    run, processes = stalled_run
    res = run_ups("status", run.run_id, "--wide", env=NARROW)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert_one_line_per_process(lines, processes)
    for p in processes:
        found = rows(res.stdout, p["name"], p["pid"])
        # rank 0's reason counts its stall in seconds, which changes between two reads
        assert (p["reason"] if p["name"] != "rank-0" else "stalled no progress for") in found[0], res.stdout


def test_runs_keeps_each_run_on_one_line_at_80_columns(stalled_run):
    run, _ = stalled_run
    res = run_ups("runs", env=NARROW)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert max(len(ln) for ln in lines) <= 80, res.stdout
    found = [ln for ln in lines if run.run_id in ln]
    assert len(found) == 1 and "failed" in found[0], res.stdout
    wide = run_ups("runs", "--wide", env=NARROW).stdout
    assert any(run.run_id in ln and ERROR in ln for ln in wide.splitlines()), wide
