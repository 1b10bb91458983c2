"""Shared fixtures. Subprocesses started by tests import this checkout's ``ups``."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
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


def pytest_configure(config: pytest.Config) -> None:
    """Compile ``ups``'s bytecode once, as a regular (non-editable) install does.

    The suite starts some 1,600 processes, most of them Python importing ``ups`` (the CLI,
    launchers, relays, every instrumented rank). Under ``PYTHONDONTWRITEBYTECODE=1`` (set on this box) an
    editable checkout has no bytecode, so each of them compiled ups's modules again: ~70 ms of
    CPU per CLI call. Python still reads bytecode that exists, and checks it against the
    source's mtime, so an edited module is compiled afresh as before. Done by the controller
    only, before xdist's workers start."""
    if hasattr(config, "workerinput"):
        return
    import compileall

    for package in ("ups", "console"):
        compileall.compile_dir(str(REPO / package), quiet=2, workers=1)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The slow tests first, each file's in its own order: xdist hands out tests in collection
    order, so a long drill collected last ran alone at the end while the other workers sat idle
    (longest first packs the workers). Every worker sorts the same collection the same way."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture
def runs_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """An empty runs root, also exported as UPS_RUNS_DIR for CLI calls and subprocesses.

    At teardown every run still live under it is force-killed, passed or failed: a failing
    assertion must not leave a detached job running for the rest of the suite. Then no
    process of a launched run may be left (its environment names the run): one that is, after
    the test's own end and `ups kill --force`, is a leak of `ups` (seen: the hung ranks of a
    torchrun job, each in a session of its own, outlived a forced kill); it is SIGKILLed and
    the test errors, naming it."""
    root = tmp_path / "runs"
    root.mkdir()
    monkeypatch.setenv("UPS_RUNS_DIR", str(root))
    yield root
    from helpers import live_processes, run_ups

    from ups.runs.rundir import FINAL_RUN_STATES, list_runs

    launched = []
    for summary in list_runs(root, missing_ok=True):
        # Only runs a test launched (they have a launcher): a test may also write records of
        # its own process into a run, and that run is no job to kill.
        if not (summary.manifest or {}).get("launcher"):
            continue
        launched.append(f"UPS_RUN_DIR={Path(summary.path).resolve()}".encode())
        if summary.state not in FINAL_RUN_STATES:
            try:
                run_ups("kill", str(summary.path), "--force", timeout=60)
            except Exception:  # noqa: BLE001 - teardown goes on
                pass
    if not launched:
        return

    def left() -> list[str]:
        return live_processes(lambda env, cmd: any(n in env.split(b"\0") for n in launched))

    deadline = time.monotonic() + 15  # a killed process's exit, on a busy box
    while (found := left()) and time.monotonic() < deadline:
        time.sleep(0.2)
    for line in found:
        try:
            os.kill(int(line.split()[0]), signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    assert not found, f"processes of a run outlived its end and `ups kill --force`: {found}"


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


FINISHED_PROGRAM = """\
import sys, time
print("step 1", flush=True)
time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 0.2)
print("done", flush=True)
"""


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """One real `ups launch python` run that succeeded: its launcher's and rank 0's records,
    run.json and events as ups writes them. Tests work on copies of it."""
    from helpers import run_ups

    from ups.runs.rundir import list_runs

    root = tmp_path_factory.mktemp("finished") / "runs"
    root.mkdir()
    prog = root.parent / "prog.py"
    prog.write_text(FINISHED_PROGRAM)
    res = run_ups("launch", "python", str(prog), env={"UPS_RUNS_DIR": str(root)}, timeout=120)
    assert res.returncode == 0, res.stderr
    (run,) = list_runs(root)
    assert run.state == "succeeded" and (run.path / "status" / "rank-0.json").exists()
    return run.path


HANG = """\
worker_timeout: 600      # the job's own watchdog stays out of it: the operator acts here
unresponsive_after: 1.5
heartbeat_interval: 0.3
dataloader_timeout: 600
batch_size: 2
"""


@pytest.fixture
def hung_precompute(tmp_path, runs_root):
    """A real precompute whose worker 1 blocks in h5py.File() on a FIFO (GIL held)."""
    import json

    from helpers import run_ups

    from ups.data.synth import synthesize
    from ups.runs.rundir import RunDir

    synthesize(tmp_path / "data", "burgers1d", "train", 16, shards=2)
    cfg = tmp_path / "hang.yaml"
    cfg.write_text(HANG)
    res = run_ups("launch", "precompute", "--config", str(cfg), "--root", str(tmp_path / "data"), "--tasks", "burgers1d",
                  "--cache-dir", str(tmp_path / "cache"), "--num-workers", "2", "--detach", "--json",
                  "--inject", "worker_hang:worker=1,after=0,mode=gil,times=2", "--inject", "slow_read:delay=0.3")
    assert res.returncode == 0, res.stderr
    run = RunDir(json.loads(res.stdout)["run_dir"])
    yield run
    run_ups("kill", str(run.path), "--force")


@pytest.fixture
def nvml_is():
    """Make ``module`` (a fake pynvml: tests/test_gpu_xid.py's ``fake_pynvml``) the initialised
    NVML of ups.gpu.nvml, the one entry point; the real one comes back after the test."""
    import types

    from ups.gpu import nvml
    from ups.gpu.xid import reset_process_watcher

    def install(module: types.ModuleType) -> None:
        reset_process_watcher()
        nvml.use(module)
    yield install
    reset_process_watcher()
    nvml.shutdown()  # the next use initialises the real one again


@pytest.fixture
def never_answers():
    """A webhook URL for notifier tests (test_notify, test_attach_notify): a listening socket
    that never accepts or reads: a connect succeeds (the backlog), no reply ever comes."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}/hook"
    sock.close()


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """A real one-node SLURM (slurmctld, slurmd, munged; tests/slurm.py) in a folder of its own,
    started once per test process and stopped after its tests; the tests that use it share one
    xdist group (``slurm``), so one process starts it and they do not fight for its 2 CPUs.
    Skipped, with the reason, where the daemons cannot start."""
    from slurm import Cluster, Unavailable

    try:
        cluster = Cluster.start(tmp_path_factory.mktemp("slurm"))
    except Unavailable as exc:
        pytest.skip(str(exc))
    yield cluster
    cluster.stop()
