"""The ten failure modes of `ups why` (and the one-sided collective again, as it ends where the
backend times collectives out, and CUDA used in a DataLoader worker), each built for real: a real program under `ups launch`,
a real fault (a FIFO for a hung mount, a real allocator refusal, /dev/full, a held port, a low
`ulimit -n`), and what the verdict must name.

Shared by tests/test_why_modes.py (each drill is a test) and scripts/bench_why.py (seconds
from the failure becoming visible to the verdict). A drill's ``visible`` says when the failure
shows under the run's thresholds (a hang: the process turned stalled or unresponsive; a crash:
the run ended); ``check`` asserts what an operator reads in the verdict and what else a user
checks (status, stacks, run.json).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from helpers import run_ups

from ups.runs.rundir import RunDir

PROGRAMS = Path(__file__).parent / "programs"
DDP = str(PROGRAMS / "ddp_train.py")
FAST = {"UPS_HEARTBEAT_INTERVAL": "0.3"}
FINAL = ("succeeded", "partial", "failed", "killed", "lost")
VERDICT_WITHIN_S = 15.0


@dataclass
class Drill:
    name: str
    mode: str  # the verdict's mode
    launch: Callable[[Path], RunDir]  # builds the failure in a scratch folder; returns the run
    visible: Callable[[RunDir], bool]  # the failure shows under the run's thresholds
    check: Callable[[RunDir, dict], None]  # asserts on the verdict (dict of `ups why --json`)
    cleanup: Callable[[], None] | None = None


def launched(res: subprocess.CompletedProcess) -> RunDir:
    assert res.stdout.strip(), res.stderr
    return RunDir(json.loads(res.stdout)["run_dir"])


def status(run: RunDir) -> dict:
    res = run_ups("status", str(run.path), "--json")
    assert res.returncode == 0, res.stderr
    return {p["name"]: p for p in json.loads(res.stdout)["processes"]}


def ended(run: RunDir) -> bool:
    return run.read_manifest()["state"] in FINAL


def health_of(run: RunDir, name: str) -> str | None:
    from ups.runs.view import load_run_view

    p = load_run_view(run).process(name)
    return p.verdict.health.value if p else None


def in_trouble(*names: str) -> Callable[[RunDir], bool]:
    return lambda run: all(health_of(run, n) in ("stalled", "unresponsive") for n in names)


def torchrun(tmp: Path, *line: str, ups_opts: tuple[str, ...] = ()) -> RunDir:
    res = run_ups("launch", "torchrun", "--detach", "--json", *ups_opts, "--nproc-per-node", "2", DDP, *line,
                  env=FAST, cwd=tmp)
    return launched(res)


def site_in(where: dict, file: str) -> bool:
    return (where.get("site") or "").startswith(f"{file}:")


# ---------------------------------------------------------------- 1. worker stuck in HDF5
def make_shards(root: Path, n: int, fifo_at: int | None = None) -> None:
    import h5py
    import numpy as np

    root.mkdir(parents=True, exist_ok=True)
    for k in range(n):
        path = root / f"shard_{k:02d}.h5"
        if k == fifo_at:
            os.mkfifo(path)  # stands in for a file on a hung network mount
            continue
        with h5py.File(path, "w") as f:
            f["tensor"] = np.random.default_rng(k).normal(size=(8, 16)).astype(np.float32)


def launch_h5py(tmp: Path) -> RunDir:
    make_shards(tmp / "data", 4, fifo_at=2)
    res = run_ups("launch", "python", "--detach", "--json", "--unresponsive-after", "2",
                  str(PROGRAMS / "read_shards.py"), str(tmp / "data"), "--workers", "2", env=FAST, cwd=tmp)
    return launched(res)


def worker_in_trouble(run: RunDir) -> bool:
    from ups.runs.view import load_run_view

    return any(p.verdict.health.value == "unresponsive" for p in load_run_view(run).workers(0))


def check_h5py(run: RunDir, v: dict) -> None:
    assert v["who"]["role"] == "worker" and v["who"]["rank"] == 0
    assert "opening shard_02.h5 (h5py)" in v["headline"] and "index" in v["headline"]
    assert "h5py" in (v["where"]["frame"] or "") and site_in(v["where"], "read_shards.py")
    assert v["next"].startswith("check the storage of") and "--num-workers 0" in v["next"]
    procs = status(run)
    worker = procs[v["who"]["name"]]
    assert worker["phase"] == "fetch" and worker["item"].startswith("index")  # the dataset index in flight
    assert procs["rank-0"]["phase"] == "data"  # the main process waits on the DataLoader
    dump = run_ups("stacks", str(run.path), "--worker", str(worker["worker"])).stdout
    assert "h5py/_hl/files.py" in dump and "read_shards.py" in dump


# ------------------------------------------------------- 2. a rank stuck, its peers waiting
def check_rank_stuck(run: RunDir, v: dict) -> None:
    assert v["who"]["rank"] == 1 and site_in(v["where"], "ddp_train.py") and v["where"]["function"] == "main"
    assert "rank 1 is stuck in its own code while rank 0 waits for it" in v["headline"]
    procs = status(run)
    assert procs["rank-1"]["step"] == 5 and "no progress for" in procs["rank-1"]["reason"]
    assert "backward" in run_ups("stacks", str(run.path), "--rank", "0").stdout  # DDP's gradient all-reduce


# ---------------------------------------------------------- 3. a one-sided collective
def check_one_sided(run: RunDir, v: dict) -> None:
    assert v["who"]["rank"] == 1 and v["where"]["function"] == "broadcast" and site_in(v["where"], "ddp_train.py")
    assert v["headline"].startswith("one-sided collective: rank 1 is in broadcast #")
    assert "rank 0" in v["headline"]


def check_one_sided_timed_out(run: RunDir, v: dict) -> None:
    """The same call where the backend times collectives out (NCCL's watchdog; here gloo's)."""
    assert v["who"]["rank"] == 1 and v["where"]["function"] == "broadcast" and site_in(v["where"], "ddp_train.py")
    assert v["headline"].startswith("one-sided collective: rank 1 timed out in broadcast #")
    assert v["headline"].endswith("never entered by rank 0")
    assert "rank 0 was in DDP's gradient all-reduce (backward)" in v["evidence"]


# ---------------------------------------------------------- 4. SIGSEGV in model build
def check_segv(run: RunDir, v: dict) -> None:
    assert v["who"]["rank"] == 1 and "killed by SIGSEGV" in v["headline"]
    assert v["where"]["function"] == "build_model" and site_in(v["where"], "ddp_train.py")
    assert any("Segmentation fault" in e for e in v["evidence"])
    m = run.read_manifest()
    assert m["failure"]["rank"] == 1 and m["failure"]["signal"] == "SIGSEGV"


# ------------------------------------------------------------ 5. an uncaught exception
def check_exception(run: RunDir, v: dict) -> None:
    assert v["who"]["rank"] == 1 and site_in(v["where"], "ddp_train.py")
    assert v["headline"] == "rank 1 raised FloatingPointError: loss is NaN at step 5"
    assert any(e.startswith("then rank 0 ended") for e in v["evidence"])
    m = run.read_manifest()
    assert m["state"] == "failed" and m["failure"]["rank"] == 1
    assert m["summary"].startswith("rank 1 failed: FloatingPointError: loss is NaN at step 5 (at ddp_train.py:")
    assert "in main" in m["summary"] and m.get("verdict", {}).get("mode") == "exception", "run.json's verdict"
    # torchrun's own report names it too: the error file was written without @record.
    # (Its root-cause block: a peer that torchrun SIGTERMed first on a busy box is listed
    # under Failures with no error file, as it should be.)
    log = run.log_path("job").read_text()
    root = log.partition("Root Cause (first observed failure):")[2]
    assert "FloatingPointError: loss is NaN at step 5" in root and "error_file: <N/A>" not in root, root[:800]
    assert "Traceback" in (run.path / "stacks" / "rank-1.txt").read_text()
    shown = run_ups("status", str(run.path), "--wide").stdout  # the verdict heads the ended run's status
    assert "why: rank 1 raised FloatingPointError: loss is NaN at step 5. Where: ddp_train.py:" in " ".join(shown.split())


# -------------------------------------------------------------- 6. os._exit(0) mid-run
def check_os_exit(run: RunDir, v: dict) -> None:
    assert v["who"]["rank"] == 1 and "while rank 0 still ran" in v["headline"]
    assert v["headline"].startswith("rank 1 ended without a normal interpreter exit")
    assert "torchrun's report blames rank 0, which failed after it" in v["evidence"]
    m = run.read_manifest()
    assert m["failure"]["rank"] == 1 and m["failure"]["clean"] is False and m["failure"]["torchrun_root"] == 0
    assert m["ranks"]["1"]["exit_code"] in (0, None) and m["ranks"]["0"]["state"] == "failed"
    exits = {e["name"]: e for e in run.read_events() if e["event"] == "process.exit"}
    assert exits["rank-1"]["clean"] is False and exits["rank-1"]["at"] < exits["rank-0"]["at"]


# ------------------------------------------------------------- 7. out of memory on one rank
def check_oom(run: RunDir, v: dict) -> None:
    assert v["who"]["rank"] == 1 and v["headline"] == "rank 1 ran out of memory at step 4 (fatal: the process ended)"
    assert any("can't allocate memory" in e for e in v["evidence"])
    assert site_in(v["where"], "ddp_train.py")


# --------------------------------------------------------------------- 8. disk full
def launch_disk_full(tmp: Path) -> RunDir:
    ckpt = tmp / "ckpt" / "model.pt"
    ckpt.parent.mkdir()
    ckpt.symlink_to("/dev/full")  # every write there fails as on a full disk (ENOSPC), for real
    return torchrun(tmp, "--steps", "4", "--workers", "0", "--ckpt", str(ckpt))


def check_disk_full(run: RunDir, v: dict) -> None:
    assert v["who"]["rank"] == 0 and v["headline"].startswith("disk full: rank 0 failed writing ")
    assert "ckpt/model.pt (checkpoint)" in v["headline"] and v["where"]["phase"] == "checkpoint"
    assert v["next"].startswith("free space on ") and "/ckpt" in v["next"]


# ------------------------------------------------------- 9. a busy port at rendezvous
class PortHolder:
    """Something else listening where the job wants to rendezvous (this test process)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.port = self.sock.getsockname()[1]

    def close(self) -> None:
        self.sock.close()


_holder: list[PortHolder] = []


def launch_busy_port(tmp: Path) -> RunDir:
    holder = PortHolder()
    _holder.append(holder)
    script = tmp / "tiny.py"
    script.write_text("import torch.distributed as dist\ndist.init_process_group('gloo')\ndist.destroy_process_group()\n")
    res = run_ups("launch", "torchrun", "--detach", "--json", "--nnodes", "1", "--nproc-per-node", "2",
                  "--master-addr", "127.0.0.1", "--master-port", str(holder.port), str(script), env=FAST, cwd=tmp)
    return launched(res)


def check_busy_port(run: RunDir, v: dict) -> None:
    port = _holder[-1].port
    assert v["who"]["role"] == "agent" and v["where"]["phase"] == "rendezvous"
    assert v["headline"] == f"torchrun's agent could not rendezvous at 127.0.0.1:{port}: the port is in use"
    assert "rendezvous" in (v["where"]["frame"] or "") and not any(e.startswith("File ") for e in v["evidence"])
    assert f"port {port} is held by pid {os.getpid()}" in " ".join(v["evidence"])
    assert "--standalone" in v["next"]


def release_port() -> None:
    while _holder:
        _holder.pop().close()


# ------------------------------------------- 10. DataLoader workers out of file descriptors
FD_HUNGRY = textwrap.dedent("""\
    import torch
    from torch.utils.data import DataLoader, Dataset


    class Many(Dataset):  # from sample 64 on, many small tensors a sample: one file descriptor each
        def __len__(self):
            return 4096

        def __getitem__(self, i):
            return [torch.full((4,), float(i)) for _ in range(64 if i >= 64 else 1)]


    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for batch in DataLoader(Many(), batch_size=8, num_workers=2):
        loss = model(torch.cat(batch)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    """)


def launch_fds(limit: int) -> Callable[[Path], RunDir]:
    def launch(tmp: Path) -> RunDir:
        script = tmp / "many.py"
        script.write_text(FD_HUNGRY)
        # A box whose open-file limit is low, as many containers' are: the job inherits it.
        res = subprocess.run(["bash", "-c", f'ulimit -n {limit} && exec "$0" -m ups "$@"', sys.executable, "launch",
                              "python", "--detach", "--json", "--stalled-after", "3", str(script)],
                             capture_output=True, text=True, cwd=tmp, env={**os.environ, **FAST}, timeout=60)
        return launched(res)

    return launch


def check_fds(limit: int) -> Callable[[RunDir, dict], None]:
    def check(run: RunDir, v: dict) -> None:
        assert v["headline"].startswith("DataLoader workers of rank 0 ran out of file descriptors")
        assert f"ulimit -n (open files) is {limit}" in v["evidence"]
        assert any("Too many open files" in e for e in v["evidence"])
        assert "ulimit -n 65536" in v["next"] and "--num-workers 0" in v["next"]

    return check


# ---------------------------------------- CUDA inside a DataLoader worker (a GPU-only mode)
CUDA_DATASET = textwrap.dedent("""\
    import torch
    from torch.utils.data import DataLoader, Dataset


    class OnDevice(Dataset):
        def __len__(self):
            return 64

        def __getitem__(self, i):
            x = torch.full((4,), float(i))
            return x.to("cuda") if i >= 8 else x  # the mistake: the device belongs in the training loop


    if torch.cuda.is_available():
        torch.zeros(1, device="cuda")  # the parent uses CUDA first, as a training script does
    for batch in DataLoader(OnDevice(), batch_size=4, num_workers=2):
        pass
    """)


def launch_cuda_in_worker(tmp: Path) -> RunDir:
    """On a GPU box: CUDA cannot start in a forked worker. Here (no CUDA): the CPU analogue,
    the same call failing in the worker because there is no CUDA at all."""
    script = tmp / "cudaset.py"
    script.write_text(CUDA_DATASET)
    return launched(run_ups("launch", "python", "--detach", "--json", str(script), env=FAST, cwd=tmp))


def check_cuda_in_worker(run: RunDir, v: dict) -> None:
    assert v["who"]["role"] == "worker" and "used CUDA inside the Dataset while fetching index" in v["headline"]
    assert v["headline"].endswith("; rank 0 failed with it")
    assert v["where"] == {"phase": "fetch", "site": "cudaset.py:11", "function": "__getitem__",
                          "frame": v["where"]["frame"]} and "cuda" in (v["where"]["frame"] or "")
    assert v["next"].startswith("return CPU tensors from the Dataset") and "spawn" in v["next"]


# -------------------------------- an outside program: the DDP tutorial, default thresholds
TUTORIAL = PROGRAMS / "ddp_tutorial.py"
TUTORIAL_SAMPLES, TUTORIAL_BATCH = 512, 4


def tutorial_line(text: str) -> int:
    """The line of the tutorial program that holds ``text`` (where a verdict must point)."""
    return next(k for k, line in enumerate(TUTORIAL.read_text().splitlines(), 1) if text in line)


def tutorial_index(rank: int = 1, batch: int = 24) -> tuple[int, int]:
    """A dataset index that DistributedSampler (seed 0, epoch 0) gives ``rank`` in its batch
    number ``batch``, and the DataLoader worker that fetches that batch (round robin over 2).
    The 24 batches before it let every process learn its pace (default thresholds)."""
    from torch.utils.data import DistributedSampler

    order = list(DistributedSampler(range(TUTORIAL_SAMPLES), num_replicas=2, rank=rank, seed=0))
    return order[batch * TUTORIAL_BATCH + 1], batch % 2


def make_samples(root: Path, *, h5: bool = False, fifo_at: int | None = None) -> None:
    import numpy as np

    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for k in range(TUTORIAL_SAMPLES):
        path = root / f"sample_{k:04d}.{'h5' if h5 else 'bin'}"
        if k == fifo_at:
            os.mkfifo(path)  # a file on a hung network mount: open() never returns
            continue
        values = rng.normal(size=17).astype(np.float32)
        if h5:
            import h5py

            with h5py.File(path, "w") as f:
                f["x"] = values
        else:
            values.tofile(path)


def tutorial(fault: str | None = None, *, h5: bool = False, fifo: bool = False, epochs: int = 2) -> Callable[[Path], RunDir]:
    """The tutorial under `ups launch torchrun` with no flags and default thresholds; the fault
    comes from the program's own switch (``DDP_TUTORIAL_FAULT``), or a FIFO among the samples."""
    def launch(tmp: Path) -> RunDir:
        index, _ = tutorial_index()
        make_samples(tmp / "data", h5=h5, fifo_at=index if fifo else None)
        env = {"DDP_TUTORIAL_FAULT": fault.replace("IDX", str(index))} if fault else {}
        res = run_ups("launch", "torchrun", "--detach", "--json", "--standalone", "--nproc-per-node", "2", str(TUTORIAL),
                      str(tmp / "data"), "--epochs", str(epochs), env=env, cwd=tmp)
        return launched(res)

    return launch


def check_tutorial_worker(mode_words: str, site_text: str, *, file: str | None = None) -> Callable[[RunDir, dict], None]:
    def check(run: RunDir, v: dict) -> None:
        index, worker = tutorial_index()
        assert v["who"]["role"] == "worker" and v["who"]["rank"] == 1 and v["who"]["worker"] == worker, v["who"]
        assert v["headline"].startswith(f"rank 1 / worker {worker} ") and mode_words in v["headline"], v["headline"]
        assert f"index {index}" in v["headline"], "the dataset index in flight"
        assert v["where"]["site"] == f"ddp_tutorial.py:{tutorial_line(site_text)}", v["where"]
        assert v["where"]["function"] == "__getitem__"
        if file is not None:
            name = f"sample_{index:04d}.{file}"
            assert f"opening {name}" in v["headline"] and any(e.endswith(name) for e in v["evidence"]), v
        if v["mode"] != "worker_exception":
            assert "rank 1 waits for the batch" in v["headline"] and "rank 0 waits for rank 1" in v["headline"]

    return check


def check_tutorial_one_sided(run: RunDir, v: dict) -> None:
    site = f"ddp_tutorial.py:{tutorial_line('dist.all_reduce(flag)')}"
    assert v["who"]["rank"] == 1 and v["where"]["function"] == "all_reduce" and v["where"]["site"] == site, v
    assert v["headline"].startswith(f"one-sided collective: rank 1 entered all_reduce at {site}, never entered by rank 0")
    assert "collective mismatch" in v["headline"] and "SIGABRT" in v["headline"]
    assert any("collective mismatch" in e for e in v["evidence"]) and any(e.startswith("rank 0 was") for e in v["evidence"])


def check_tutorial_mismatched(run: RunDir, v: dict) -> None:
    reduce_at = f"ddp_tutorial.py:{tutorial_line('dist.all_reduce(t)')}"
    bcast_at = f"ddp_tutorial.py:{tutorial_line('dist.broadcast(t, src=0)')}"
    assert v["who"] is None, "both sides, no tie-break"
    assert v["headline"].startswith(f"mismatched collectives: rank 0 is in all_reduce #1 at {reduce_at}; "
                                    f"rank 1 is in broadcast #1 at {bcast_at}"), v["headline"]


TUTORIAL_DRILLS: tuple[Drill, ...] = (
    Drill("tutorial_worker_hangs_in_sleep", "worker_stuck", tutorial("sleep:IDX"), in_trouble("rank-1-worker-0"),
          check_tutorial_worker("is stuck in __getitem__", "time.sleep(3600)")),
    Drill("tutorial_worker_hangs_opening_a_fifo", "worker_stuck_in_read", tutorial(fifo=True), in_trouble("rank-1-worker-0"),
          check_tutorial_worker("(I/O)", 'with open(path, "rb")', file="bin")),
    Drill("tutorial_worker_hangs_in_h5py_file", "worker_stuck_in_read", tutorial(h5=True, fifo=True),
          in_trouble("rank-1-worker-0"), check_tutorial_worker("(h5py)", 'with h5py.File(path, "r")', file="h5")),
    Drill("tutorial_worker_raises", "worker_exception", tutorial("raise:IDX"), ended,
          check_tutorial_worker("raised ValueError: corrupt sample", "raise ValueError")),
    Drill("tutorial_one_sided_all_reduce_aborted", "one_sided_collective", tutorial("extra_all_reduce:100"), ended,
          check_tutorial_one_sided),
    Drill("tutorial_all_reduce_vs_broadcast", "collective_mismatch", tutorial("broadcast_vs_all_reduce:100"),
          in_trouble("rank-0", "rank-1"), check_tutorial_mismatched),
)


STALL = ("--stalled-after", "3")
DRILLS: tuple[Drill, ...] = (
    Drill("worker_stuck_in_hdf5_open", "worker_stuck_in_read", launch_h5py, worker_in_trouble, check_h5py),
    Drill("rank_stuck_while_peers_wait", "rank_stuck_peers_wait",
          lambda tmp: torchrun(tmp, "--steps", "100", "--workers", "0", "--fail", "sleep", "--fail-step", "5", ups_opts=STALL),
          in_trouble("rank-1"), check_rank_stuck),
    Drill("one_sided_broadcast", "one_sided_collective",
          lambda tmp: torchrun(tmp, "--steps", "100", "--workers", "0", "--fail", "broadcast", "--fail-step", "5",
                               ups_opts=STALL),
          in_trouble("rank-0", "rank-1"), check_one_sided),
    Drill("one_sided_broadcast_timed_out", "one_sided_collective",
          lambda tmp: torchrun(tmp, "--steps", "100", "--workers", "0", "--fail", "broadcast", "--fail-step", "5",
                               "--pg-timeout", "4"),
          ended, check_one_sided_timed_out),
    Drill("sigsegv_in_model_build", "crashed_by_signal",
          lambda tmp: torchrun(tmp, "--workers", "0", "--fail", "segv"), ended, check_segv),
    Drill("exception_on_one_rank", "exception",
          lambda tmp: torchrun(tmp, "--steps", "30", "--workers", "0", "--fail", "raise", "--fail-step", "5"),
          ended, check_exception),
    Drill("os_exit_mid_run", "no_normal_exit",
          lambda tmp: torchrun(tmp, "--steps", "40", "--workers", "0", "--fail", "exit", "--fail-step", "8"),
          ended, check_os_exit),
    Drill("out_of_memory_on_one_rank", "out_of_memory",
          lambda tmp: torchrun(tmp, "--steps", "30", "--workers", "0", "--fail", "oom", "--fail-step", "4"),
          ended, check_oom),
    Drill("disk_full_writing_a_checkpoint", "disk_full", launch_disk_full, ended, check_disk_full),
    Drill("busy_port_at_rendezvous", "rendezvous_failed", launch_busy_port, ended, check_busy_port, release_port),
    # The same fault ends several ways: at 128 descriptors the loop hangs waiting for the batch (or,
    # on a loaded box, raises an EOFError receiving it); at 96 the main process raises (EMFILE, or
    # an EOFError) or hangs; at 64 the worker itself raises. Each must be named for what it is.
    *(Drill(name, "dataloader_resources", launch_fds(limit), lambda run: in_trouble("rank-0")(run) or ended(run),
            check_fds(limit))
      for name, limit in (("dataloader_out_of_file_descriptors", 128), ("dataloader_main_out_of_file_descriptors", 96),
                          ("dataloader_worker_out_of_file_descriptors", 64))),
    Drill("cuda_in_dataloader_worker", "cuda_in_worker", launch_cuda_in_worker, ended, check_cuda_in_worker),
)


def culprit(verdict: dict) -> str | None:
    """The process a verdict blames (None: nothing wrong, still settling, or no one process)."""
    if verdict["ok"] or verdict["mode"] == "settling" or not verdict.get("who"):
        return None
    return verdict["who"]["name"]


def run_drill(drill: Drill, tmp: Path, *, visible_within: float = 120.0, poll: float = 0.2, after_s: float = 1.0) -> dict:
    """Build the failure, wait until it is visible, then until the verdict names it, asking
    for the verdict every ``poll`` seconds from launch on (as a console does) and ``after_s``
    more after the right one.

    Returns {"run", "visible_s" (from launch), "verdict_s" (from visible), "verdict", "problem",
    "shown", "wrong"}: problem is the last assertion the verdict failed, None when it named the
    right mode, who and where within VERDICT_WITHIN_S; shown is every verdict seen (seconds from
    launch, mode, culprit, headline); wrong those that blamed another process than the right
    verdict does (target: none)."""
    import time

    from ups.why import diagnose

    t0 = time.monotonic()
    run = drill.launch(tmp)
    shown: list[tuple[float, str, str | None, str]] = []

    def look() -> dict | None:
        try:
            verdict = diagnose(run).to_dict()
        except Exception:  # noqa: BLE001 - the run folder is still being written at launch
            return None
        shown.append((round(time.monotonic() - t0, 2), verdict["mode"], culprit(verdict), verdict["headline"][:200]))
        return verdict

    seen = None
    while time.monotonic() - t0 < visible_within:
        look()
        if drill.visible(run):
            seen = time.monotonic()
            break
        time.sleep(poll)
    out = {"run": run, "visible_s": None if seen is None else round(seen - t0, 2), "verdict_s": None, "verdict": None,
           "problem": f"not visible within {visible_within:g} s", "shown": shown, "wrong": []}
    if seen is None:
        return out
    deadline = seen + VERDICT_WITHIN_S
    while True:
        verdict = look()
        at = time.monotonic()
        out["verdict"] = verdict
        try:
            assert verdict is not None, "no verdict"
            assert verdict["mode"] == drill.mode, f"mode {verdict['mode']}: {verdict['headline']}"
            drill.check(run, verdict)
            out["problem"] = None
            out["verdict_s"] = round(max(0.0, at - seen), 2)
            break
        except Exception as exc:  # noqa: BLE001 - e.g. run.json's verdict not written yet: retried to the deadline
            out["problem"] = str(exc) or f"{exc!r} at {_assert_line(exc)}"
        if time.monotonic() > deadline:
            return out
        time.sleep(poll)
    until = time.monotonic() + after_s
    while time.monotonic() < until:
        time.sleep(poll)
        look()
    right = culprit(out["verdict"])
    out["wrong"] = [s for s in shown if s[2] is not None and s[2] != right]
    return out


def _assert_line(exc: BaseException) -> str:
    """file:line of the failed check (an assert without a message says nothing else)."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    return f"{Path(frames[-1].filename).name}:{frames[-1].lineno}: {frames[-1].line}" if frames else "?"


def assert_drill(drill: Drill, tmp: Path) -> None:
    """Run a drill and assert what its test asserts: visible, the right verdict within
    VERDICT_WITHIN_S, no verdict on the way (asked every 0.2 s, as a console does) blaming
    another process, and the CLI saying the same. Stops the run if it still runs."""
    out = run_drill(drill, tmp)
    run = out["run"]
    shown = "\n".join(map(str, out["shown"][-12:]))
    assert out["visible_s"] is not None, f"the failure never showed: {run.read_manifest().get('summary')}\n{shown}"
    assert out["problem"] is None, f"{out['problem']}\nverdict: {out['verdict'] and out['verdict']['text']}\n{shown}"
    assert out["verdict_s"] <= VERDICT_WITHIN_S
    assert not out["wrong"], "a verdict on the way blamed another process:\n" + "\n".join(map(str, out["wrong"][:6]))
    res = run_ups("why", str(run.path), "--json")  # what the operator runs says the same
    assert res.returncode == 1 and f'"mode": "{drill.mode}"' in res.stdout, res.stdout + res.stderr
    if not ended(run):
        assert run_ups("kill", str(run.path), "--grace", "3").returncode == 0
