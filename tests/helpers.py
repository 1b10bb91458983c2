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
    """Poll ``predicate`` until it returns a truthy value; fail the test at the deadline.

    Between two polls it waits ``interval``, or as long as the last poll took if that was
    longer: a predicate that runs ``ups`` in a subprocess (~0.2 s of CPU) would otherwise keep
    a core of a 2-core box busy, taken from the job under test."""
    deadline = time.monotonic() + timeout
    last_exc: Exception | None = None
    while True:
        started = time.monotonic()
        try:
            value = predicate()
            if value:
                return value
        except Exception as exc:  # noqa: BLE001 - keep polling, report the last one
            last_exc = exc
        now = time.monotonic()
        if now > deadline:
            extra = f" (last error: {last_exc!r})" if last_exc else ""
            raise AssertionError(f"timed out after {timeout:g} s waiting for {message}{extra}")
        time.sleep(min(max(interval, now - started), max(deadline - now, 0.01)))


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


def status_now(run: Path | object) -> dict:
    """What `ups status RUN --json` prints, built in this process by the code the command runs
    (the settled view, then the same payload and JSON encoding). For polling loops: a
    subprocess a poll costs ~0.3 s of CPU, and a suite of real jobs on two cores is CPU-bound.
    What a test finally asserts on still comes from the real command where it matters."""
    from ups.runs.payload import gpu_by_pid, status_payload
    from ups.runs.read import open_run
    from ups.runs.rundir import RunDir

    rd = run if isinstance(run, RunDir) else RunDir(Path(run))
    return json.loads(json.dumps(status_payload(open_run(rd), gpu_by_pid()), default=str))


def why_now(run: Path | object) -> dict:
    """The verdict `ups why RUN --json` prints (its "verdict"), built in this process by the
    code the command runs; for polling loops, as :func:`status_now`."""
    from ups.runs.read import open_run
    from ups.runs.rundir import RunDir
    from ups.why import diagnose_view

    rd = run if isinstance(run, RunDir) else RunDir(Path(run))
    return json.loads(json.dumps(diagnose_view(open_run(rd)).to_dict(), default=str))


def job_processes(run) -> list[str]:  # a RunDir
    """Live processes whose environment names this run (``"PID COMMAND"``): what the job
    started, recorded or not; zombies excluded."""
    needle = f"UPS_RUN_DIR={run.path.resolve()}".encode()
    return live_processes(lambda env, cmd: needle in env.split(b"\0"))


def launcher_processes(run_path: Path) -> list[str]:
    """Live launchers of a run (their command line names the run folder): ``"PID COMMAND"``."""
    needle = str(Path(run_path).resolve()).encode()
    return live_processes(lambda env, cmd: b"ups.launch.supervise" in cmd and needle in cmd)


def live_processes(match: Callable[[bytes, bytes], bool]) -> list[str]:
    """``"PID COMMAND"`` of every live process (zombies excluded) for which ``match(environ,
    cmdline)`` holds (both raw, NUL-separated)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        from ups.status import procfs

        try:
            env = Path(f"/proc/{entry}/environ").read_bytes()
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        st = procfs.stat(int(entry))
        state = st.state if st is not None else "Z"
        if state != "Z" and match(env, cmd):
            found.append(entry + " " + cmd.replace(b"\0", b" ").decode(errors="replace")[:160])
    return found


def read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())


RAW_NAMES = {
    "advection1d": "1D_Advection_Sols_beta0.4.hdf5",
    "burgers1d": "1D_Burgers_Sols_Nu0.01.hdf5",
    "darcy2d": "2D_DarcyFlow_beta1.0_Train.hdf5",
}


def write_raw_pdebench(root: Path, task: str, samples: int, *, seed: int = 0, timesteps: int = 6, resolution: int = 32) -> Path:
    """One file in the raw PDEBench layout, as downloaded: dataset ``tensor`` (N, T, X) or, for
    Darcy, (N, 1, H, W) with the permeability in ``nu`` (N, H, W), plus coordinates."""
    import h5py
    import numpy as np

    from ups.data.synth import SOLVERS

    rng = np.random.default_rng(seed)
    data, _, _ = SOLVERS[task](samples, timesteps, resolution, rng)  # the stack's layout: (..., C)
    path = Path(root) / RAW_NAMES[task]
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as f:
        if task == "darcy2d":
            f.create_dataset("nu", data=data[:, 0, ..., 0].astype(np.float32))
            f.create_dataset("tensor", data=data[..., 1].astype(np.float32))
            f.create_dataset("x-coordinate", data=np.linspace(0, 1, resolution, dtype=np.float32))
            f.create_dataset("y-coordinate", data=np.linspace(0, 1, resolution, dtype=np.float32))
        else:
            f.create_dataset("tensor", data=data[..., 0].astype(np.float32))
            f.create_dataset("x-coordinate", data=np.linspace(0, 1, resolution, dtype=np.float32))
            f.create_dataset("t-coordinate", data=np.linspace(0, 1, timesteps + 1, dtype=np.float32))
    return path


def record_job(run, proc) -> None:
    """Record a process the test started itself as the run's job, as the launcher does
    (run.json ``job``: pid, start time, session): ups signals only a run's provable processes,
    and a hand-made run has no launcher. The process must lead its own session
    (``procs.popen`` starts it so)."""
    from ups.status.procs import process_start_time

    run.update_manifest(job={"pid": proc.pid, "pid_start": process_start_time(proc.pid), "pgid": proc.pid,
                             "sid": os.getsid(proc.pid)})


PYSPY_RELEASES = Path(os.environ.get("UPS_TEST_CACHE", Path.home() / ".cache" / "ups-tests")) / "py-spy"


def pyspy_release(version: str) -> Path | None:
    """The folder holding the ``py-spy`` binary of release ``version``, installed once (pip,
    ``--no-deps --target``) into a cache shared by the test processes; None when pip cannot
    get it (no registry). The binary is the real release: each test that reads stacks from
    outside runs with the newest py-spy (the test extra) and with the older ones it names."""
    import shutil
    import tempfile

    final = PYSPY_RELEASES / version
    if (final / "bin" / "py-spy").exists():
        return final / "bin"
    PYSPY_RELEASES.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=PYSPY_RELEASES, prefix=f".{version}-"))
    res = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(tmp),
                          f"py-spy=={version}"], capture_output=True, text=True, timeout=300)
    if res.returncode != 0 or not (tmp / "bin" / "py-spy").exists():
        shutil.rmtree(tmp, ignore_errors=True)
        return None
    try:
        os.rename(tmp, final)  # another test process may have won the race: its copy is as good
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
    return final / "bin"
