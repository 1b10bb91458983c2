"""The rules of `ups why`, one table: for each rule in ``ups.why.rules.RULES``, the cases where it
speaks and the near misses where it must not (or must leave the verdict to another rule).

Every case is built in memory: status records with the health a watcher gave them, a run
view around them, the host's facts given (``GivenHost``: no /proc, no cgroup, no NVML), and
where a rule reads the run folder (stack files, logs, events, metric series) a tmp folder
holding just those files. No process, no sleep. Each case is named by what an operator reads:
the rule, the mode, who, and the headline's key words.

The real-process drills of the same modes are in test_why_modes.py, test_why_tutorial.py,
test_why.py and test_frameworks.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from ups.gpu.snapshot import DeviceSnapshot, GpuSnapshot
from ups.runs.rundir import RunDir
from ups.runs.view import NodeView, ProcessView, RunView
from ups.status.health import Health, HealthVerdict, Thresholds
from ups.status.record import StatusRecord, process_name
from ups.status.series import SeriesWriter
from ups.why.evidence import Evidence
from ups.why.host import GivenHost, ProcFacts
from ups.why.rules import RULES, Rule, first_verdict
from ups.why.rules.collectives import collectives, ddp_backward
from ups.why.rules.exits import ended, live_failure, oom_skipped, settling
from ups.why.rules.hardware import full_disk, gpu_straggler, lost_node, unsupervised
from ups.why.rules.metrics import ended_training, live_training
from ups.why.rules.pauses import busy_pause, no_signal
from ups.why.rules.processes import dead, healthy, hung
from ups.why.rules.stragglers import straggler
from ups.why.rules.workers import starved_loader, stuck_workers
from ups.why.verdict import MODES, Verdict

pytestmark = pytest.mark.notorch  # also run on each other Python, without torch (tests/test_pythons.py)

NOW = 1_800_000_000.0
HERE = "node-a"
THERE = "node-b"


# --------------------------------------------------------------------------- the scene
class Scene:
    """One run as `ups why` would see it: records with their health, run.json's content, the
    files of the run folder a rule reads, and the host's facts."""

    def __init__(self, path: Path) -> None:
        path.mkdir(parents=True)
        self.run = RunDir(path)
        self.manifest: dict = {"kind": "torchrun", "state": "running", "command": ["torchrun", "train.py"]}
        self.views: list[ProcessView] = []
        self.supervision = "supervised"
        self.nodes: tuple[NodeView, ...] = ()
        self.facts: dict = {"hostname": HERE}

    # -- records
    def add(self, role: str = "rank", rank: int | None = 0, *, worker: int | None = None,
            health: Health = Health.OK, reason: str = "", host: str = HERE, heartbeat: float = NOW - 1,
            progress: float = NOW - 1, **fields) -> StatusRecord:
        """A process's record and the health the watcher gave it."""
        name = process_name(role, rank, worker)
        fields.setdefault("pid", 1000 + len(self.views))
        fields.setdefault("phase", "train")
        fields.setdefault("step", 10)
        fields.setdefault("phase_at", NOW - 300)
        if health is Health.DONE:
            fields.setdefault("state", "done")
        r = StatusRecord(run_id=self.run.run_id, role=role, name=name, pid_start=NOW - 600, host=host, rank=rank,
                         local_rank=rank, worker=worker, started_at=NOW - 600, heartbeat_at=heartbeat,
                         progress_at=progress, unit="steps", **fields)
        self.views.append(ProcessView(r, HealthVerdict(health, reason or health.value), NOW - heartbeat, NOW - progress))
        return r

    def ranks(self, n: int, **kw) -> list[StatusRecord]:
        return [self.add("rank", i, **kw) for i in range(n)]

    def ended(self, state: str, **manifest) -> None:
        self.manifest.update(state=state, **manifest)
        self.supervision = "final"

    # -- the run folder
    def stack(self, name: str, text: str) -> None:
        (self.run.path / "stacks").mkdir(exist_ok=True)
        with open(self.run.path / "stacks" / f"{name}.txt", "a") as fh:
            fh.write(text)

    def log(self, name: str, text: str) -> None:
        (self.run.path / "logs").mkdir(exist_ok=True)
        (self.run.path / "logs" / f"{name}.log").write_text(text)

    def event(self, event: str, **fields) -> None:
        with open(self.run.path / "events.jsonl", "a") as fh:
            fh.write(json.dumps({"ts": NOW - 5, "event": event, "actor": "launcher", **fields}) + "\n")

    def exit(self, r: StatusRecord, at: float, *, exact: bool = True, clean: bool = False) -> None:
        """The launcher's note of a process's end (exit truth)."""
        self.event("process.exit", name=r.name, pid=r.pid, role=r.role, rank=r.rank, at=at, exact=exact,
                   record_state=r.state if clean else "running", phase=r.phase, step=r.step, error=r.error,
                   exit_code=r.exit_code)

    def series(self, name: str, points: list[dict]) -> None:
        w = SeriesWriter(self.run.path, name)
        for p in points:
            w.add(p)
        w.maybe_write(force=True)

    # -- what the rules get
    def evidence(self) -> Evidence:
        view = RunView(self.run, self.manifest, None, tuple(self.views), (), Thresholds(), NOW, self.supervision,
                       self.nodes)
        return Evidence(view, now=NOW, host=GivenHost(**self.facts))


def dump(*frames: tuple[str, int, str]) -> str:
    """A faulthandler dump of the main thread, innermost frame first."""
    lines = [f'  File "{f}", line {n} in {fn}' for f, n, fn in frames]
    return "=== stack dump of rank pid 1 requested by launcher at 12:00:00 ===\n" \
           "Current thread 0x00007f0000000001 (most recent call first):\n" + "\n".join(lines) + "\n"


def fatal(what: str, *frames: tuple[str, int, str]) -> str:
    lines = [f'  File "{f}", line {n} in {fn}' for f, n, fn in frames]
    return f"Fatal Python error: {what}\n\nCurrent thread 0x00007f0000000001 (most recent call first):\n" + \
        "\n".join(lines) + "\n"


TORCH = "/usr/lib/python3/site-packages/torch"
OWN_HANG = dump(("/home/u/train.py", 41, "hang_in_python"), ("/home/u/train.py", 90, "<module>"))
IN_BACKWARD = dump((f"{TORCH}/autograd/graph.py", 768, "_engine_run_backward"),
                   (f"{TORCH}/_tensor.py", 626, "backward"), ("/home/u/train.py", 77, "<module>"))
RUNNING = dict(health=Health.OK, reason="step 10 at 5 steps/s")
STALLED = dict(health=Health.STALLED, reason="no progress for 45 s (limit 30 s)", progress=NOW - 45)
UNRESPONSIVE = dict(health=Health.UNRESPONSIVE, reason="no heartbeat for 20 s, pid alive", heartbeat=NOW - 20,
                    progress=NOW - 20)
DEAD = dict(health=Health.DEAD, reason="pid 1001 is gone", heartbeat=NOW - 120, progress=NOW - 120)
DONE = dict(health=Health.DONE, reason="done")


def coll(op: str, seq: int, site: str, **kw) -> dict:
    return {"op": op, "seq": seq, "site": site, "since": NOW - 40, **kw}


# --------------------------------------------------------------------------- the table
@dataclass(frozen=True)
class Case:
    rule: Rule
    name: str  # what an operator reads
    build: Callable[[Scene], None]
    mode: str | None  # what the rule says; None: it stays silent
    who: str | None = None  # the label it names
    words: tuple[str, ...] = ()  # in its headline
    then: str | None = None  # the table's mode where another rule decides first (default: this rule's)
    evidence: tuple[str, ...] = ()  # in its evidence lines
    not_evidence: tuple[str, ...] = ()  # in none of them

    @property
    def near_miss(self) -> bool:
        return self.mode is None or (self.then is not None and self.then != self.mode)

    @property
    def id(self) -> str:
        return f"{self.rule.__name__}: {self.name}"


CASES: list[Case] = []


def case(rule: Rule, name: str, mode: str | None, **kw) -> Callable[[Callable[[Scene], None]], Callable[[Scene], None]]:
    def register(build: Callable[[Scene], None]) -> Callable[[Scene], None]:
        CASES.append(Case(rule, name, build, mode, **kw))
        return build
    return register


# ---- lost_node
def _two_nodes(s: Scene, b_health: str, b_reason: str) -> None:
    s.manifest["multinode"] = True
    s.add("rank", 0, **RUNNING)
    s.add("rank", 1, host=THERE, health=Health.UNREACHABLE if b_health == "unreachable" else Health.OK,
          reason=b_reason, heartbeat=NOW - 50)
    s.nodes = (NodeView(HERE, 0, "running", "ok", "", 1, 100, local=True),
               NodeView(THERE, 1, "running", b_health, b_reason, 1, 200))


@case(lost_node, "node node-b is unreachable, its rank 1 silent", "node_unreachable", who="rank 1",
      words=("node node-b is unreachable", "1 process(es) there, launcher pid 200"), evidence=("last heartbeat there: rank 1",))
def _(s: Scene) -> None:
    _two_nodes(s, "unreachable", "every record of node-b silent for 50 s")


@case(lost_node, "both nodes answer: no node is named", None, then="healthy")
def _(s: Scene) -> None:
    _two_nodes(s, "ok", "step 10")


@case(lost_node, "a node never heard from comes before the failure this node saw", "node_unreachable", who=None,
      words=("node node-b is unreachable", "never heard from"), then="node_unreachable")
def _(s: Scene) -> None:
    s.ended("failed", multinode=True, failure={"rank": 0, "error": "ConnectionResetError: Connection reset by peer"})
    s.add("rank", 0, health=Health.FAILED, state="failed", error="ConnectionResetError: Connection reset by peer")
    s.nodes = (NodeView(HERE, 0, "failed", "failed", "", 1, 100, local=True),
               NodeView(THERE, 1, None, "unreachable", "no answer over ssh", 0, None))


# ---- ended_training
def _succeeded_with(s: Scene, **metrics) -> None:
    s.ended("succeeded", summary="every rank exited 0")
    s.add("rank", 0, **DONE, metrics={"loss": 0.5, "loss_step": 60})
    s.add("rank", 1, **DONE, metrics=metrics)


@case(ended_training, "succeeded, but rank 1's loss became nan at step 40", "loss_nonfinite", who="rank 1",
      words=("the loss became nan on rank 1 at step 40",), evidence=("the run itself ended succeeded",))
def _(s: Scene) -> None:
    _succeeded_with(s, loss="nan", loss_step=60, loss_nonfinite={"step": 40, "value": "nan", "at": NOW - 100})


@case(ended_training, "succeeded with finite losses: the run succeeded", None, then="succeeded")
def _(s: Scene) -> None:
    _succeeded_with(s, loss=0.4, loss_step=60)


@case(ended_training, "a NaN in a run that failed: how it failed decides", None, then="exception")
def _(s: Scene) -> None:
    s.ended("failed", failure={"rank": 1})
    s.add("rank", 0, **DONE)
    s.add("rank", 1, health=Health.FAILED, state="failed", error="ValueError: loss is nan (at train.py:50)",
          error_site="train.py:50", metrics={"loss_nonfinite": {"step": 40, "value": "nan", "at": NOW - 100}})


# ---- ended (every kind of end it names)
@case(ended, "the run succeeded", "succeeded", words=("nothing wrong: the run succeeded (every rank exited 0)",))
def _(s: Scene) -> None:
    s.ended("succeeded", summary="every rank exited 0")
    s.ranks(2, **DONE)


@case(ended, "succeeded, a step skipped for lack of memory in its evidence", "succeeded",
      words=("nothing wrong: the run succeeded",), evidence=("rank 1 ran out of memory at step 37",))
def _(s: Scene) -> None:
    _skipped(s)
    s.ended("succeeded", summary="every rank exited 0")


@case(ended, "stopped by alice (a kill, its reason)", "killed", words=("the run was stopped by alice (wrong lr)",))
def _(s: Scene) -> None:
    s.ended("killed", summary="killed by alice: wrong lr")
    s.ranks(2, health=Health.DEAD)
    s.event("kill", actor="alice", target="run", reason="wrong lr")


@case(ended, "lost: the launcher and every process vanished", "lost",
      words=("the launcher and every process vanished",))
def _(s: Scene) -> None:
    s.ended("lost", summary="the launcher and every process vanished with no final record")


@case(ended, "failed, nothing more known", "failed", words=("the run ended failed",))
def _(s: Scene) -> None:
    s.ended("failed")


@case(ended, "rank 1 raised ValueError at prep.py:2", "exception", who="rank 1",
      words=("rank 1 raised ValueError: invalid literal",))
def _(s: Scene) -> None:
    s.ended("failed", failure={"rank": 1})
    s.add("rank", 0, **DONE)
    s.add("rank", 1, health=Health.FAILED, state="failed", error_site="prep.py:2",
          error="ValueError: invalid literal for int() with base 10: 'x7' (at prep.py:2)")


@case(ended, "rank 0 killed by SIGSEGV in model.build, its faulthandler frame", "crashed_by_signal", who="rank 0",
      words=("rank 0 was killed by SIGSEGV in phase model.build",), evidence=("faulthandler: Segmentation fault",))
def _(s: Scene) -> None:
    s.ended("failed", failure={"rank": 0, "signal": "SIGSEGV"})
    r = s.add("rank", 0, health=Health.DEAD, phase="model.build")
    s.add("rank", 1, health=Health.DEAD)
    s.stack(r.name, fatal("Segmentation fault", ("/home/u/model.py", 12, "build"), ("/home/u/train.py", 5, "<module>")))


@case(ended, "rank 1 left with os._exit in phase train, while rank 0 still ran", "no_normal_exit", who="rank 1",
      words=("rank 1 ended without a normal interpreter exit", "while rank 0 still ran"))
def _(s: Scene) -> None:
    s.ended("failed", failure={"rank": 1, "clean": False})
    r0 = s.add("rank", 0, **DONE)
    r1 = s.add("rank", 1, health=Health.DEAD)
    s.exit(r1, NOW - 30)
    s.exit(r0, NOW - 20, clean=True)


@case(ended, "rank 0 out of CUDA memory at step 12", "out_of_memory", who="rank 0",
      words=("rank 0 ran out of memory at step 12 (fatal",))
def _(s: Scene) -> None:
    s.ended("failed", failure={"rank": 0})
    s.add("rank", 0, health=Health.FAILED, state="failed", step=12,
          error="torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")


@case(ended, "disk full writing the checkpoint /ckpt/model.pt, 0.0 GiB free there (host fact)", "disk_full",
      who="rank 0", words=("disk full: rank 0 failed writing /ckpt/model.pt (checkpoint) in phase checkpoint",),
      evidence=("0.0 GiB free there now",))
def _(s: Scene) -> None:
    s.ended("failed", failure={"rank": 0})
    s.add("rank", 0, health=Health.FAILED, state="failed", phase="checkpoint",
          error="RuntimeError: [enforce fail at inline_container.cc:595] . unexpected pos 123 vs 456 "
                "(ups: while torch.save wrote /ckpt/model.pt)")
    s.facts["free"] = {"/ckpt": 12_345}


@case(ended, "rendezvous port 29500 in use, held by pid 4242 (host fact)", "rendezvous_failed", who="rank 0",
      words=("rank 0 could not rendezvous at localhost:29500 in dist.init: the port is in use",),
      evidence=("port 29500 is held by pid 4242 (python other_job.py)",))
def _(s: Scene) -> None:
    s.ended("failed", failure={"rank": 0}, command=["torchrun", "--rdzv-endpoint", "localhost:29500", "train.py"])
    s.add("rank", 0, health=Health.FAILED, state="failed", phase="dist.init",
          error="torch.distributed.DistNetworkError: The server socket has failed to listen on any local network "
                "address. port: 29500, useIpv6: 0, code: -98, name: EADDRINUSE, message: address already in use")
    s.facts["listeners"] = {29500: (4242, "python other_job.py")}


@case(ended, "rank 0 SIGKILLed by the kernel's OOM killer (cgroup oom_kill 2)", "oom_killed", who="rank 0",
      words=("rank 0 was killed by the kernel's OOM killer (SIGKILL)",), evidence=("cgroup memory.events: oom_kill 2",))
def _(s: Scene) -> None:
    s.ended("failed", failure={"rank": 0, "signal": "SIGKILL"})
    s.add("rank", 0, health=Health.DEAD)
    s.facts["oom_kills"] = 2


@case(ended, "rank 0 SIGKILLed from outside, no OOM kill counted", "killed_from_outside", who="rank 0",
      words=("rank 0 was killed by SIGKILL from outside ups",),
      evidence=("no OOM kill counted in this cgroup's memory.events",))
def _(s: Scene) -> None:
    s.ended("failed", failure={"rank": 0, "signal": "SIGKILL"})
    s.add("rank", 0, health=Health.DEAD)
    s.facts["oom_kills"] = 0


@case(ended, "rank 0 SIGKILLed by ups's own kill: not from outside", "crashed_by_signal", who="rank 0",
      words=("rank 0 was killed by SIGKILL",))
def _(s: Scene) -> None:
    s.ended("failed", failure={"rank": 0, "signal": "SIGKILL"})
    s.add("rank", 0, health=Health.DEAD)
    s.event("kill", actor="bob", target="run", reason="stuck")
    s.facts["oom_kills"] = 2


@case(ended, "rank 0 stopped from outside by SIGTERM (a preemption?)", "stopped_from_outside", who="rank 0",
      words=("rank 0 was stopped from outside (SIGTERM", "at step 10"))
def _(s: Scene) -> None:
    s.ended("failed", failure={"rank": 0, "signal": "SIGTERM"})
    s.add("rank", 0, health=Health.DEAD)


WORKER_RAISED = """ValueError: Caught ValueError in DataLoader worker process 1.
Original Traceback (most recent call last):
  File "/usr/lib/python3/site-packages/torch/utils/data/_utils/worker.py", line 308, in _worker_loop
    data = fetcher.fetch(index)
  File "/home/u/prep.py", line 12, in __getitem__
    return parse(self.rows[i])
ValueError: bad sample 17
"""


@case(ended, "rank 0 / worker 1 raised ValueError at prep.py:12 while fetching #17", "worker_exception",
      who="rank 0 / worker 1", words=("rank 0 / worker 1 raised ValueError: bad sample 17 while fetching shard.h5#17",
                                      "rank 0 failed with it"))
def _(s: Scene) -> None:
    s.ended("failed", failure={"rank": 0})
    s.add("rank", 0, health=Health.FAILED, state="failed", phase="data", error=WORKER_RAISED)
    s.add("worker", 0, worker=1, health=Health.DEAD, phase="fetch", item="shard.h5#17")


@case(ended, "rank 0 / worker 0 used CUDA inside the Dataset", "cuda_in_worker", who="rank 0 / worker 0",
      words=("rank 0 / worker 0 used CUDA inside the Dataset",))
def _(s: Scene) -> None:
    s.ended("failed", failure={"rank": 0})
    s.add("rank", 0, health=Health.FAILED, state="failed", phase="data",
          error=WORKER_RAISED.replace("process 1", "process 0").replace("ValueError: bad sample 17",
                                                                          "RuntimeError: Cannot re-initialize CUDA in forked subprocess"))
    s.add("worker", 0, worker=0, health=Health.DEAD, phase="fetch")


@case(ended, "DataLoader workers of rank 0 out of file descriptors (ulimit -n 1024)", "dataloader_resources",
      who="rank 0", words=("DataLoader workers of rank 0 ran out of file descriptors",),
      evidence=("ulimit -n (open files) is 1024",))
def _(s: Scene) -> None:
    s.ended("failed", failure={"rank": 0})
    s.add("rank", 0, health=Health.FAILED, state="failed", phase="data", metrics={"nofile_limit": 1024},
          error="RuntimeError: Too many open files. Communication with the workers is no longer possible.")


def _worker_killed(s: Scene, signal: str) -> None:
    s.ended("failed", failure={"rank": 0})
    s.add("rank", 0, health=Health.FAILED, state="failed", phase="data",
          error=f"RuntimeError: DataLoader worker (pid 1001) is killed by signal: {signal}.")
    s.add("worker", 0, worker=1, pid=1001, health=Health.DEAD, phase="fetch", item="#3")


@case(ended, "rank 0 / worker 1 killed by a Segmentation fault while fetching #3", "crashed_by_signal",
      who="rank 0 / worker 1", words=("rank 0 / worker 1 killed by Segmentation fault while fetching #3; rank 0 failed "
                                      "with it",))
def _(s: Scene) -> None:
    _worker_killed(s, "Segmentation fault")


@case(ended, "rank 0 / worker 1 killed by a Bus error: shared memory, not a crash", "dataloader_resources",
      who="rank 0 / worker 1", words=("DataLoader workers of rank 0 ran out of shared memory",),
      evidence=("/dev/shm is 0.1 GiB, 0.0 GiB free now",))
def _(s: Scene) -> None:
    _worker_killed(s, "Bus error")
    s.facts["shm"] = (64 << 20, 1 << 20)


def _gpu(xids: tuple[int, ...] = (), throttle: tuple[str, ...] = (), index: int = 0) -> GpuSnapshot:
    return GpuSnapshot(True, None, devices=(DeviceSnapshot(index, "NVIDIA H100", None, 80 << 30, 1 << 30, 99, 91, 300.0,
                                                           xid_errors=xids, throttle=throttle),))


def _cuda_failure(s: Scene, xids: tuple[int, ...], host: str = HERE) -> None:
    s.ended("failed", failure={"rank": 0})
    s.add("rank", 0, host=host, health=Health.FAILED, state="failed",
          error="RuntimeError: CUDA error: unspecified launch failure")
    s.facts["gpus"] = _gpu(xids)


@case(ended, "rank 0 failed on GPU 0, fallen off the bus (Xid 79): drain the node", "gpu_hardware", who="rank 0",
      words=("rank 0 failed on GPU 0 (NVIDIA H100), which reported a hardware fault: Xid 79: GPU has fallen off the bus",))
def _(s: Scene) -> None:
    _cuda_failure(s, (79,))


@case(ended, "rank 0's own kernel faulted on GPU 0 (Xid 31), not the hardware", "cuda_fault", who="rank 0",
      words=("rank 0's kernel faulted on GPU 0", "Xid 31: GPU memory page fault"))
def _(s: Scene) -> None:
    _cuda_failure(s, (31,))


@case(ended, "a faulty GPU of this host, rank 0 on another host: its own error", "exception", who="rank 0",
      words=("rank 0 raised RuntimeError: CUDA error: unspecified launch failure",))
def _(s: Scene) -> None:
    _cuda_failure(s, (79,), host=THERE)


@case(ended, "one-sided: rank 1 timed out in broadcast #7, never entered by rank 0", "one_sided_collective",
      who="rank 1", words=("one-sided collective: rank 1 timed out in broadcast #7, never entered by rank 0",))
def _(s: Scene) -> None:
    s.ended("failed", failure={"rank": 1})
    s.add("rank", 0, health=Health.FAILED, state="failed", error="RuntimeError: Connection closed by peer")
    s.add("rank", 1, health=Health.FAILED, state="failed", collective=coll("broadcast", 7, "train.py:88"),
          error="RuntimeError: [../gloo/transport/tcp/pair.cc:534] Timed out waiting 1800000ms for recv operation")


@case(ended, "every rank timed out together in all_reduce #5: the transport", "collective_timeout", who="rank 0",
      words=("every rank timed out together in all_reduce #5 at train.py:60",))
def _(s: Scene) -> None:
    s.ended("failed", failure={"rank": 0})
    for i in range(2):
        s.add("rank", i, health=Health.FAILED, state="failed", collective=coll("all_reduce", 5, "train.py:60"),
              error="RuntimeError: [../gloo/transport/tcp/pair.cc:534] Timed out waiting 1800000ms for recv operation")


@case(ended, "mismatched collectives: rank 0 in all_reduce, rank 1 in broadcast", "collective_mismatch", who=None,
      words=("mismatched collectives: rank 0 was in all_reduce at train.py:50; rank 1 was in broadcast at train.py:60",
             "the backend aborted rank 1"))
def _(s: Scene) -> None:
    s.ended("failed", failure={"rank": 1, "collective_mismatch": True})
    s.add("rank", 0, health=Health.DEAD, collective=coll("all_reduce", 5, "train.py:50"))
    s.add("rank", 1, health=Health.FAILED, state="failed", collective=coll("broadcast", 5, "train.py:60"),
          error="RuntimeError: Detected mismatch between collectives on ranks. Rank 1 is running collective: broadcast")


@case(ended, "rank 0 failed: the module is not installed (a log class)", "import_error", who="rank 0",
      words=("rank 0 failed: an import failed",))
def _(s: Scene) -> None:
    s.ended("failed", failure={"rank": 0})
    s.add("rank", 0, health=Health.FAILED, state="failed", error="ModuleNotFoundError: No module named 'wandbx'")


@case(ended, "a live run is not judged by how it ended", None, then="healthy")
def _(s: Scene) -> None:
    s.ranks(2, **RUNNING)


# ---- full_disk
@case(full_disk, "the runs folder's disk is full: 2 processes cannot write", "disk_full", who="rank 0",
      words=("the runs folder's disk is full: 2 process(es) of the run cannot write their records",))
def _(s: Scene) -> None:
    for i in range(2):
        s.add("rank", i, health=Health.UNREACHABLE, heartbeat=NOW - 40 + i,
              reason="disk full: no record written for 40 s because /runs has 0 bytes free; the process may be running fine")


@case(full_disk, "records silent for another reason: no full disk named", None, then="unresponsive")
def _(s: Scene) -> None:
    s.add("rank", 0, **UNRESPONSIVE)


# ---- unsupervised
@case(unsupervised, "the launcher (pid 999) is gone, 2 processes run on", "unsupervised", who="launcher",
      words=("the run's launcher (pid 999) is gone; 2 of its processes run on unsupervised",))
def _(s: Scene) -> None:
    s.manifest["launcher"] = {"pid": 999}
    s.supervision = "unsupervised"
    s.add("launcher", None, health=Health.DEAD)
    s.ranks(2, **RUNNING)


@case(unsupervised, "a launcher that lives: nothing to adopt", None, then="healthy")
def _(s: Scene) -> None:
    s.manifest["launcher"] = {"pid": 999}
    s.add("launcher", None, **RUNNING)
    s.ranks(2, **RUNNING)


# ---- settling
@case(settling, "rank 1 died 3 s ago: settling, no one blamed yet", "settling", who=None,
      words=("rank 1 ended without a normal exit; settling…",))
def _(s: Scene) -> None:
    s.add("rank", 0, **RUNNING)
    s.add("rank", 1, health=Health.DEAD, reason="pid 1001 is gone", heartbeat=NOW - 3)


@case(settling, "rank 1 died (SIGSEGV) first, then rank 0 failed: in that order", "settling", who=None,
      words=("rank 1 died (SIGSEGV) first; then rank 0 failed (RuntimeError: Connection closed by peer)",))
def _(s: Scene) -> None:
    r0 = s.add("rank", 0, health=Health.FAILED, state="failed", error="RuntimeError: Connection closed by peer")
    r1 = s.add("rank", 1, health=Health.DEAD, heartbeat=NOW - 4)
    s.stack(r1.name, fatal("Segmentation fault", ("/home/u/train.py", 30, "step")))
    s.exit(r1, NOW - 4)
    s.exit(r0, NOW - 2, clean=True)


@case(settling, "rank 1 died 2 min ago: no longer settling, it is dead", None, then="dead")
def _(s: Scene) -> None:
    s.add("rank", 0, **RUNNING)
    s.add("rank", 1, **DEAD)


@case(settling, "an unsupervised run does not settle", None, then="unsupervised")
def _(s: Scene) -> None:
    s.manifest["launcher"] = {"pid": 999}
    s.supervision = "unsupervised"
    s.add("rank", 0, **RUNNING)
    s.add("rank", 1, health=Health.DEAD, heartbeat=NOW - 3)


# ---- live_failure
@case(live_failure, "rank 1 raised ValueError while the run winds down", "exception", who="rank 1",
      words=("rank 1 raised ValueError: bad batch",))
def _(s: Scene) -> None:
    s.add("rank", 0, **STALLED)
    s.add("rank", 1, health=Health.FAILED, state="failed", heartbeat=NOW - 30, error="ValueError: bad batch (at train.py:9)")


@case(live_failure, "rank 1 failed 2 s ago: the launcher's record comes first (settling)", "exception", who="rank 1",
      words=("rank 1 raised ValueError: bad batch",), then="settling")
def _(s: Scene) -> None:
    s.add("rank", 0, **RUNNING)
    s.add("rank", 1, health=Health.FAILED, state="failed", heartbeat=NOW - 2, error="ValueError: bad batch (at train.py:9)")


@case(live_failure, "no process failed", None, then="stalled")
def _(s: Scene) -> None:
    s.add("rank", 0, **STALLED)


# ---- collectives
@case(collectives, "one-sided: rank 2 in broadcast #5 while ranks 0, 1 are in all_reduce #5", "one_sided_collective",
      who="rank 2", words=("one-sided collective: rank 2 is in broadcast #5, never entered by ranks 0, 1; every rank waits",))
def _(s: Scene) -> None:
    s.add("rank", 0, **STALLED, collective=coll("all_reduce", 5, "train.py:60"))
    s.add("rank", 1, **STALLED, collective=coll("all_reduce", 5, "train.py:60"))
    s.add("rank", 2, **STALLED, collective=coll("broadcast", 5, "train.py:88"))


@case(collectives, "a tie: rank 0 in all_reduce #5, rank 1 in broadcast #5: both sides shown", "collective_mismatch",
      who=None, words=("mismatched collectives: rank 0 is in all_reduce #5 at train.py:60; rank 1 is in broadcast #5 "
                       "at train.py:88; every rank waits",))
def _(s: Scene) -> None:
    s.add("rank", 0, **STALLED, collective=coll("all_reduce", 5, "train.py:60"))
    s.add("rank", 1, **STALLED, collective=coll("broadcast", 5, "train.py:88"))


@case(collectives, "rank 0 in broadcast, rank 1 in DDP's all-reduce (backward)", "one_sided_collective", who="rank 0",
      words=("one-sided collective: rank 0 is in broadcast #3, never entered by rank 1: it waits in DDP's gradient "
             "all-reduce (backward)",))
def _(s: Scene) -> None:
    s.add("rank", 0, **STALLED, collective=coll("broadcast", 3, "train.py:88"))
    r1 = s.add("rank", 1, **STALLED)
    s.stack(r1.name, IN_BACKWARD)


@case(collectives, "rank 1 stuck in its own code while rank 0 waits for it in all_reduce", "rank_stuck_peers_wait",
      who="rank 1", words=("rank 1 is stuck in its own code while rank 0 waits for it in all_reduce",))
def _(s: Scene) -> None:
    s.add("rank", 0, **STALLED, collective=coll("all_reduce", 5, "train.py:60"))
    r1 = s.add("rank", 1, **STALLED)
    s.stack(r1.name, OWN_HANG)


FSDP_AG = dict(group="0", group_desc="default_pg", ranks=[0, 1], context="FSDP unshard of root", new=False)


@case(collectives, "FSDP2: rank 1 in its own code while rank 0 waits in FSDP's all-gather: rank 1, with the context",
      "rank_stuck_peers_wait", who="rank 1",
      words=("rank 1 is stuck in its own code while rank 0 waits for it in all_gather_single (FSDP unshard of root)",))
def _(s: Scene) -> None:
    s.add("rank", 0, **STALLED, collective=coll("all_gather_single", 76, "train.py:142", waiting=True, **FSDP_AG))
    r1 = s.add("rank", 1, **STALLED)
    s.stack(r1.name, OWN_HANG)


@case(collectives, "one-sided all_reduce against FSDP's all-gather: the new call site is the odd one, both sides shown",
      "one_sided_collective", who="rank 1",
      words=("one-sided collective: rank 1 is in all_reduce #76, never entered by rank 0",),
      evidence=("rank 0: all_gather_single (FSDP unshard of root) #76 at train.py:142",))
def _(s: Scene) -> None:
    # rank 0's op changed from its previous one (clip_grad_norm_'s all_reduce), rank 1's did not:
    # without the record's `new`, the old rule would have named rank 0.
    s.add("rank", 0, **STALLED, collective=coll("all_gather_single", 76, "train.py:142", prev_op="all_reduce", **FSDP_AG))
    s.add("rank", 1, **STALLED, collective=coll("all_reduce", 76, "train.py:138", prev_op="all_reduce", group="0",
                                                 group_desc="default_pg", ranks=[0, 1], new=True))


def _mesh(dim: str, ranks: list[int]) -> dict:
    return dict(group=f"mesh_{dim}{ranks[0]}", group_desc=f"mesh_{dim}", ranks=ranks, new=False)


@case(collectives, "2-D mesh: rank 1 stuck; rank 0 waits on 'tp' [0, 1], rank 3 on 'dp' [1, 3], rank 2 through them",
      "rank_stuck_peers_wait", who="rank 1",
      words=("rank 1 is stuck in its own code while rank 0 waits for it in all_reduce (TP RowwiseParallel._prepare_output_fn) "
             "on mesh dim 'tp' [0, 1] and rank 3 in all_gather_single on mesh dim 'dp' [1, 3]",),
      evidence=("rank 3 waits in all_gather_single #81 on mesh dim 'dp' [1, 3]",
                "waiting through them: rank 2 in all_reduce #45 on mesh dim 'tp' [2, 3]"))
def _(s: Scene) -> None:
    tp = "TP RowwiseParallel._prepare_output_fn"
    s.add("rank", 0, **STALLED, collective=coll("all_reduce", 45, "train.py:90", context=tp, **_mesh("tp", [0, 1])))
    r1 = s.add("rank", 1, **STALLED)
    s.add("rank", 2, **STALLED, collective=coll("all_reduce", 45, "train.py:90", **_mesh("tp", [2, 3])))
    s.add("rank", 3, **STALLED, collective=coll("all_gather_single", 81, "train.py:88", **_mesh("dp", [1, 3])))
    s.stack(r1.name, OWN_HANG)


@case(collectives, "pipeline: rank 0 in send to rank 1, rank 1 in a new all_reduce: a wait cycle, rank 1 named",
      "one_sided_collective", who="rank 1", words=("one-sided collective: rank 1 is in all_reduce #1",),
      evidence=("rank 0: isend to rank 1 (pipelining fwd_send) #24 on group 1 [0, 1]",))
def _(s: Scene) -> None:
    s.add("rank", 0, **STALLED, collective=coll("isend", 24, "pipe.py:124", group="1", group_desc="undefined", ranks=[0, 1],
                                                 peer=1, context="pipelining fwd_send", new=False, waiting=True))
    s.add("rank", 1, **STALLED, collective=coll("all_reduce", 1, "pipe.py:119", group="0", group_desc="default_pg",
                                                 ranks=[0, 1], new=True))


@case(collectives, "pipeline: rank 0's send and rank 1's recv are the two ends of one transfer: nothing wrong", None,
      then="settling")
def _(s: Scene) -> None:
    s.add("rank", 0, **STALLED, collective=coll("isend", 24, "pipe.py:124", group="1", ranks=[0, 1], peer=1, new=False))
    s.add("rank", 1, **STALLED, collective=coll("irecv", 24, "pipe.py:130", group="1", ranks=[0, 1], peer=0, new=False))


@case(collectives, "rank 1 in no collective and no stack dump yet: settling", "settling", who=None,
      words=("rank 0 waits in all_reduce #5 at train.py:60; rank 1 is in no explicit collective; settling…",))
def _(s: Scene) -> None:
    s.add("rank", 0, **STALLED, collective=coll("all_reduce", 5, "train.py:60"))
    s.add("rank", 1, **STALLED)


@case(collectives, "rank 0 waits for its worker 0, rank 1 for rank 0 in all_reduce: the worker is named", "worker_stuck", who="rank 0 / worker 0",
      words=("rank 0 / worker 0 is stuck", "rank 0 waits for the batch, rank 1 waits for rank 0") , then="worker_stuck")
def _(s: Scene) -> None:
    s.add("rank", 0, **STALLED, phase="data", phase_at=NOW - 45)
    s.add("rank", 1, **STALLED, collective=coll("all_reduce", 5, "train.py:60"))
    s.add("worker", 0, worker=0, **STALLED, phase="fetch", phase_at=NOW - 50, item="17")


@case(collectives, "ranks passing through all_reduce, none stalled: nothing wrong", None, then="healthy")
def _(s: Scene) -> None:
    s.add("rank", 0, **RUNNING, collective=coll("all_reduce", 5, "train.py:60"))
    s.add("rank", 1, **RUNNING)


@case(collectives, "one rank alone in a collective: no peers to mismatch", None, then="stalled")
def _(s: Scene) -> None:
    s.add("rank", 0, **STALLED, collective=coll("all_reduce", 5, "train.py:60"))


# ---- ddp_backward
@case(ddp_backward, "rank 2 stuck in its own code while ranks 0, 1 wait in backward", "rank_stuck_peers_wait",
      who="rank 2", words=("rank 2 is stuck in its own code while ranks 0, 1 wait for it in backward",))
def _(s: Scene) -> None:
    for i in range(2):
        r = s.add("rank", i, **STALLED)
        s.stack(r.name, IN_BACKWARD)
    r2 = s.add("rank", 2, **STALLED)
    s.stack(r2.name, OWN_HANG)


@case(ddp_backward, "every rank in backward: none is the odd one", None, then="stalled")
def _(s: Scene) -> None:
    for i in range(2):
        r = s.add("rank", i, **STALLED)
        s.stack(r.name, IN_BACKWARD)


@case(ddp_backward, "two ranks outside backward: no single culprit", None, then="stalled")
def _(s: Scene) -> None:
    r0 = s.add("rank", 0, **STALLED)
    s.stack(r0.name, IN_BACKWARD)
    for i in (1, 2):
        r = s.add("rank", i, **STALLED)
        s.stack(r.name, OWN_HANG)


# ---- starved_loader
def _starved(s: Scene, health: dict) -> None:
    s.add("rank", 0, **health, phase="data")
    s.log("job", "step 9\nRuntimeError: received 0 items of ancdata\n")


@case(starved_loader, "rank 0 stalled, the log says 'received 0 items of ancdata': out of descriptors",
      "dataloader_resources", who="rank 0", words=("DataLoader workers of rank 0 ran out of file descriptors",),
      evidence=("ulimit -n (open files) is 1024",))
def _(s: Scene) -> None:
    _starved(s, STALLED)
    s.facts["procs"] = {1000: ProcFacts("S", "unix_stream_read_generic", "recvmsg", None, 1024, 1020)}


@case(starved_loader, "rank 0 stalled, workers out of shared memory: /dev/shm figures (host fact)",
      "dataloader_resources", who="rank 0", words=("DataLoader workers of rank 0 ran out of shared memory",),
      evidence=("/dev/shm is 0.1 GiB, 0.0 GiB free now",))
def _(s: Scene) -> None:
    s.add("rank", 0, **STALLED, phase="data")
    s.log("job", "ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared memory (shm).\n")
    s.facts["shm"] = (64 << 20, 0)


@case(starved_loader, "the same log line, but the rank makes progress: nothing wrong", None, then="healthy")
def _(s: Scene) -> None:
    _starved(s, RUNNING)


# ---- stuck_workers
@case(stuck_workers, "rank 0 / worker 1 stuck opening shard_1.h5 (h5py) while fetching shard_1.h5#17",
      "worker_stuck_in_read", who="rank 0 / worker 1",
      words=("rank 0 / worker 1 is stuck opening shard_1.h5 (h5py) while fetching shard_1.h5#17; rank 0 waits for the batch",),
      evidence=("kernel: blocked in openat(), kernel wait pipe_wait", "file: /data/shard_1.h5"))
def _(s: Scene) -> None:
    s.add("rank", 0, **RUNNING, phase="data")
    w = s.add("worker", 0, worker=1, **UNRESPONSIVE, phase="data.open", item="shard_1.h5#17",
              metrics={"file": "/data/shard_1.h5"})
    s.stack(w.name, dump(("/usr/lib/python3/site-packages/h5py/_hl/files.py", 231, "make_fid"),
                         ("/usr/lib/python3/site-packages/h5py/_hl/files.py", 564, "__init__"),
                         ("/home/u/prep.py", 20, "__getitem__")))
    s.facts["procs"] = {w.pid: ProcFacts("S", "pipe_wait", "openat", None, 1024, 12)}


@case(stuck_workers, "rank 0 / worker 0 stuck in its own slow_transform while fetching 17", "worker_stuck",
      who="rank 0 / worker 0", words=("rank 0 / worker 0 is stuck in slow_transform while fetching 17 (stalled)",))
def _(s: Scene) -> None:
    s.add("rank", 0, **RUNNING, phase="data")
    w = s.add("worker", 0, worker=0, **STALLED, phase="fetch", item="17")
    s.stack(w.name, dump(("/home/u/prep.py", 33, "slow_transform"), ("/home/u/prep.py", 20, "__getitem__")))


@case(stuck_workers, "a worker asleep in __getitem__ after it wrote and closed fault.txt: asleep there, not reading it",
      "worker_stuck", who="rank 0 / worker 1",
      words=("rank 0 / worker 1 is stuck in __getitem__ while fetching 17",),
      evidence=("kernel: blocked in clock_nanosleep()",))
def _(s: Scene) -> None:
    s.add("rank", 0, **RUNNING, phase="data")
    w = s.add("worker", 0, worker=1, **STALLED, phase="fetch", item="17", metrics={"file": "/tmp/run/fault.txt"})
    s.stack(w.name, dump(("/home/u/train.py", 41, "__getitem__"),))
    s.facts["procs"] = {w.pid: ProcFacts("S", "hrtimer_nanosleep", "clock_nanosleep", None, 1024, 12)}


@case(stuck_workers, "a worker gone at the end of an epoch while its rank goes on: nothing wrong", None, then="healthy")
def _(s: Scene) -> None:
    s.add("rank", 0, **RUNNING)
    s.add("worker", 0, worker=0, **DEAD)


# ---- dead
@case(dead, "rank 1 (pid 1001) gone 2 min ago while its record says running", "dead", who="rank 1",
      words=("rank 1 (pid 1001) is gone while its record says running, last phase train",),
      evidence=("no fatal-signal traceback",))
def _(s: Scene) -> None:
    s.add("rank", 0, **RUNNING)
    s.add("rank", 1, **DEAD)


@case(dead, "rank 0 / worker 0 gone while rank 0 goes on: the loader let it go", None, then="healthy")
def _(s: Scene) -> None:
    s.add("rank", 0, **RUNNING)
    s.add("worker", 0, worker=0, **DEAD)


@case(dead, "rank 1 gone 3 s ago: settling first", "dead", who="rank 1", then="settling")
def _(s: Scene) -> None:
    s.add("rank", 0, **RUNNING)
    s.add("rank", 1, health=Health.DEAD, reason="pid 1001 is gone", heartbeat=NOW - 3)


# ---- busy_pause, and what the launcher sees (ups.launch.proof, in its record's metrics.observed)
def observing(s: Scene, **observed) -> None:
    """A live launcher whose record publishes what it sees of the processes it watches."""
    s.add("launcher", None, health=Health.OK, reason="supervising", phase="supervise", step=0,
          metrics={"observed": observed})


def window(verdict: str, text: str, **figures) -> dict:
    return {"state": verdict, "proven": figures.pop("proven", False), "last": {"verdict": verdict, "text": text, **figures}}


@case(busy_pause, "rank 0 writes a checkpoint alone while rank 1 waits in all_reduce: busy, not stuck", "busy",
      who="rank 0", words=("rank 0 is busy writing a checkpoint (torch.save → RemoteStream)", "rank 1 waits for it in all_reduce"))
def _(s: Scene) -> None:
    s.add("rank", 0, health=Health.OK, reason="phase checkpoint", phase="checkpoint", phase_at=NOW - 30,
          progress=NOW - 30, item="torch.save → RemoteStream")
    s.add("rank", 1, health=Health.OK, reason="waits for rank 0, writing a checkpoint (phase checkpoint)", progress=NOW - 28,
          collective={"op": "all_reduce", "seq": 41, "site": "train.py:80", "since": NOW - 28})
    observing(s)


@case(busy_pause, "rank 0 evaluates alone (the launcher saw it compute) while rank 1 waits: busy", "busy", who="rank 0",
      words=("rank 0 is busy computing (CPU 97%, a thread busy 99% of the time)", "so far; rank 1 waits for it"))
def _(s: Scene) -> None:
    r0 = s.add("rank", 0, **STALLED)
    s.add("rank", 1, **STALLED)
    observing(s, **{r0.name: window("busy", "CPU 97% (a thread busy 99% of the time) over 5 s", demand=0.99, cpu=0.97)})


@case(busy_pause, "rank 0 uploads through its child curl (the launcher saw the socket move): busy", "busy", who="rank 0",
      words=("rank 0 is busy sending or receiving data through curl (pid 77) (133 KB/s on its sockets)",))
def _(s: Scene) -> None:
    r0 = s.add("rank", 0, **STALLED)
    s.add("rank", 1, **STALLED)
    observing(s, **{r0.name: window("busy", "CPU 0% (...), network 133 KB/s, with curl (pid 77) over 5 s",
                                    tcp_bps=133_000, children=["curl (pid 77)"])})


@case(busy_pause, "a checkpoint phase that the launcher saw idle (a save hung on a dead mount) is no busy pause", None,
      then="settling")
def _(s: Scene) -> None:
    r0 = s.add("rank", 0, health=Health.STALLED, reason="no progress for 700 s in phase checkpoint", phase="checkpoint",
               progress=NOW - 700, phase_at=NOW - 700)
    s.add("rank", 1, **STALLED)
    observing(s, **{r0.name: window("idle", "CPU 0%, kernel wait nfs_wait_bit_killable over 5 s", d_state=True)})


@case(busy_pause, "one rank's long step while the other goes on: no pause of the run", None, then="healthy")
def _(s: Scene) -> None:
    r0 = s.add("rank", 0, health=Health.OK, reason="step 10", progress=NOW - 6)
    s.add("rank", 1, **RUNNING)
    observing(s, **{r0.name: window("busy", "CPU 99% over 5 s", demand=0.99)})


# ---- what a rank its peers wait for is doing (collectives, ddp_backward, hung)
@case(collectives, "rank 1 waits in all_reduce, rank 0 outside it, the launcher still checking: nobody named", "waiting",
      who=None, words=("rank 1 waits for rank 0 in all_reduce", "checking whether it is working"))
def _(s: Scene) -> None:
    s.add("rank", 0, **STALLED)
    s.add("rank", 1, **STALLED, collective={"op": "all_reduce", "seq": 41, "site": "train.py:80", "since": NOW - 40})
    s.stack("rank-0", OWN_HANG)
    observing(s)


@case(collectives, "rank 0 seen idle by the launcher: stuck in its own code", "rank_stuck_peers_wait", who="rank 0",
      words=("rank 0 is stuck in its own code while rank 1 waits for it in all_reduce",))
def _(s: Scene) -> None:
    r0 = s.add("rank", 0, **STALLED)
    s.add("rank", 1, **STALLED, collective={"op": "all_reduce", "seq": 41, "site": "train.py:80", "since": NOW - 40})
    s.stack("rank-0", OWN_HANG)
    observing(s, **{r0.name: window("idle", "CPU 0% (a thread busy 0% of the time), kernel wait hrtimer_nanosleep over 5 s")})


@case(ddp_backward, "rank 1 in backward, rank 0 busy computing elsewhere: busy, not stuck", "busy", who="rank 0",
      words=("rank 0 is busy computing", "rank 1 waits for it in DDP's gradient all-reduce (backward)"), then="busy")
def _(s: Scene) -> None:
    r0 = s.add("rank", 0, **STALLED)
    r1 = s.add("rank", 1, **STALLED)
    s.stack(r0.name, OWN_HANG)
    s.stack(r1.name, IN_BACKWARD)
    observing(s, **{r0.name: window("busy", "CPU 98% (a thread busy 99% of the time) over 5 s", demand=0.99)})


@case(hung, "a lone stalled process the launcher is still checking: nobody named yet", "waiting", who=None,
      words=("rank 0 has made no progress for 45 s in phase train; checking whether it is working",))
def _(s: Scene) -> None:
    s.manifest["kind"] = "python"
    s.add("rank", 0, **STALLED)
    observing(s)


@case(hung, "rank 1 in backward, rank 0 within its own limit but quiet 30 s, seen uploading through curl: busy",
      "busy", who="rank 0", words=("rank 0 is busy sending or receiving data through curl (pid 77)",
                                   "rank 1 waits for it in DDP's gradient all-reduce (backward)"))
def _(s: Scene) -> None:
    r0 = s.add("rank", 0, health=Health.OK, reason="phase train", progress=NOW - 30, phase_at=NOW - 30)
    r1 = s.add("rank", 1, **STALLED)
    s.stack(r1.name, IN_BACKWARD)
    observing(s, **{r0.name: window("busy", "CPU 0% (...), network 93 KB/s, with curl (pid 77) over 5 s",
                                    tcp_bps=93_000, children=["curl (pid 77)"])})


@case(hung, "the same quiet rank 0 seen idle: no one is called busy; settling until rank 0's own limit", "settling",
      who=None, words=("rank 1 has made no progress", "settling"))
def _(s: Scene) -> None:
    r0 = s.add("rank", 0, health=Health.OK, reason="phase train", progress=NOW - 30, phase_at=NOW - 30)
    r1 = s.add("rank", 1, **STALLED)
    s.stack(r1.name, IN_BACKWARD)
    observing(s, **{r0.name: window("idle", "CPU 0% (a thread busy 0% of the time), kernel wait hrtimer_nanosleep over 5 s")})


# ---- no_signal
NO_SIGNAL = dict(health=Health.NO_SIGNAL, reason="no progress signal for 11 min (no steps, batches ...), phase start",
                 step=0, phase="start", progress=NOW - 600)


@case(no_signal, "a script with no progress signal, nothing seen yet: neither healthy nor stalled", "no_signal",
      who="rank 0", words=("rank 0 reports no progress signal", "not judged either way"))
def _(s: Scene) -> None:
    s.manifest["kind"] = "python"
    s.add("rank", 0, **NO_SIGNAL)


@case(no_signal, "no progress signal, and its pool workers compute: busy", "busy", who="rank 0",
      words=("rank 0 is busy computing", "it reports no progress signal"))
def _(s: Scene) -> None:
    s.manifest["kind"] = "python"
    r0 = s.add("rank", 0, **NO_SIGNAL)
    observing(s, **{r0.name: window("busy", "CPU 180% (a thread busy 99% of the time), with python (pid 80) over 5 s",
                                    demand=0.99, cpu=1.8)})


@case(no_signal, "no progress signal, proven idle (twice, the same stack): a hang", "hung", who="rank 0",
      words=("rank 0 shows no progress signal and is idle", "the same stack in two dumps"))
def _(s: Scene) -> None:
    s.manifest["kind"] = "python"
    r0 = s.add("rank", 0, **NO_SIGNAL)
    s.stack(r0.name, OWN_HANG)
    observing(s, **{r0.name: window("idle", "CPU 0%, kernel wait hrtimer_nanosleep over 5 s", proven=True)})


@case(no_signal, "a script that reports progress is not one with no signal", None, then="healthy")
def _(s: Scene) -> None:
    s.manifest["kind"] = "python"
    s.add("rank", 0, **RUNNING)


# ---- hung
@case(hung, "rank 0 waits in next(it) while its worker re-warms (worker_init_fn computing): busy, not stalled", "busy",
      who="rank 0 / worker 0", words=("rank 0 waits for its DataLoader rank 0 / worker 0, busy starting (computing",))
def _(s: Scene) -> None:
    s.add("rank", 0, phase="data", **STALLED)
    w = s.add("worker", 0, worker=0, health=Health.OK, reason="phase idle", phase="idle", step=0)
    observing(s, **{w.name: window("busy", "CPU 99% (a thread busy 100% of the time) over 5 s", demand=1.0, cpu=0.99)})


@case(hung, "rank 0 waits in next(it) while its worker starts, not seen yet: checking, not stalled", "waiting",
      words=("rank 0 waits for its DataLoader rank 0 / worker 0, which is starting; checking",))
def _(s: Scene) -> None:
    s.add("rank", 0, phase="data", **STALLED)
    s.add("worker", 0, worker=0, health=Health.OK, reason="phase idle", phase="idle", step=0)
    observing(s)


@case(hung, "rank 0 waits in next(it) while its starting worker sleeps (seen idle): stalled", "stalled", who="rank 0",
      words=("rank 0 is stalled in phase data",))
def _(s: Scene) -> None:
    r = s.add("rank", 0, phase="data", **STALLED)
    w = s.add("worker", 0, worker=0, health=Health.OK, reason="phase idle", phase="idle", step=0)
    observing(s, **{w.name: window("idle", "CPU 0%, kernel wait hrtimer_nanosleep over 5 s"),
                    r.name: window("idle", "CPU 0%, kernel wait futex_wait over 5 s")})


@case(hung, "rank 0 stalled in phase train, blocked in read() on the NFS mount (host fact)", "stalled", who="rank 0",
      words=("rank 0 is stalled in phase train",),
      evidence=("kernel: blocked in read() on /mnt/nfs/data.bin, kernel wait nfs_wait_bit_killable, uninterruptible",))
def _(s: Scene) -> None:
    r = s.add("rank", 0, **STALLED)
    s.facts["procs"] = {r.pid: ProcFacts("D", "nfs_wait_bit_killable", "read", "/mnt/nfs/data.bin", 1024, 40)}


@case(hung, "rank 0 unresponsive (no heartbeat: a C call holds the GIL)", "unresponsive", who="rank 0",
      words=("rank 0 is unresponsive in phase train",))
def _(s: Scene) -> None:
    s.add("rank", 0, **UNRESPONSIVE)


@case(hung, "a rank of another host: this host's kernel facts are not its", "stalled", who="rank 0",
      words=("rank 0 is stalled",), not_evidence=("kernel:",))
def _(s: Scene) -> None:
    r = s.add("rank", 0, **STALLED, host=THERE)
    s.facts["procs"] = {r.pid: ProcFacts("D", "nfs_wait_bit_killable", "read", "/mnt/nfs/data.bin", 1024, 40)}


@case(hung, "rank 1 stalled, rank 0 not yet, no stack dump: settling, no one blamed", "settling", who=None,
      words=("rank 1 has made no progress for 45 s in phase train and has no stack dump yet; settling… (rank 0 not in trouble yet)",))
def _(s: Scene) -> None:
    s.add("rank", 0, **RUNNING)
    s.add("rank", 1, **STALLED)


@case(hung, "only the launcher is slow to write: no process of the job in trouble", None, then="healthy")
def _(s: Scene) -> None:
    s.add("launcher", None, **STALLED)
    s.add("rank", 0, **RUNNING)


# ---- gpu_straggler
def _slow_rank_1(s: Scene, throttle: tuple[str, ...], host: str = HERE) -> None:
    s.add("rank", 0, **RUNNING)
    s.add("rank", 1, host=host, health=Health.SLOW, reason="2.1 steps/s, 40% of its peers' median")
    s.facts["gpus"] = _gpu(throttle=throttle, index=1)


@case(gpu_straggler, "rank 1 is a straggler: GPU 1 throttled (thermal)", "gpu_throttled", who="rank 1",
      words=("rank 1 is a straggler: GPU 1 is throttled (thermal)",), evidence=("GPU 1 at 91 C",))
def _(s: Scene) -> None:
    _slow_rank_1(s, ("thermal",))


@case(gpu_straggler, "rank 1 slow, its GPU not throttled: no GPU to blame", None, then="healthy")
def _(s: Scene) -> None:
    _slow_rank_1(s, ())


@case(gpu_straggler, "a throttled GPU here, the slow rank on another host", None, then="healthy")
def _(s: Scene) -> None:
    _slow_rank_1(s, ("thermal",), host=THERE)


# ---- straggler
def _parts(data: float, bwd: float, other: float) -> dict:
    step = 0.014
    return {"step_parts": {"n": 200, "window_s": 5.0, "step_mean": step, "runq": 0.02, "cpu": 0.5,
                           **{k: [v, v] for k, v in (("step", step), ("data", data), ("collective", 0.0),
                                                     ("backward", bwd), ("other", other))}}}


@case(straggler, "rank 1 waits 5 ms for its DataLoader; rank 0 waits for it in backward", "straggler_input", who="rank 1",
      words=("rank 1 is the straggler (score 0.55)", "DataLoader", "GPU-hours a day on 2 ranks"),
      evidence=("rank 0: step 14 ms = own 6 ms", "named below score 0.85"))
def _(s: Scene) -> None:
    s.add("rank", 0, **RUNNING, metrics=_parts(0.001, 0.012, 0.001))
    s.add("rank", 1, health=Health.STRAGGLER, reason="score 0.55, input", metrics=_parts(0.006, 0.004, 0.001))


@case(straggler, "the same numbers but no rank's health says straggler: nothing named", None, then="healthy")
def _(s: Scene) -> None:
    s.add("rank", 0, **RUNNING, metrics=_parts(0.001, 0.012, 0.001))
    s.add("rank", 1, **RUNNING, metrics=_parts(0.006, 0.004, 0.001))


# ---- live_training
def _nan(s: Scene, peer_step: int) -> None:
    s.add("rank", 0, **RUNNING, metrics={"loss": 0.9, "loss_step": peer_step})
    s.add("rank", 1, **RUNNING, metrics={"loss": "nan", "loss_step": 41,
                                          "loss_nonfinite": {"step": 40, "value": "nan", "at": NOW - 1}})


@case(live_training, "the loss became nan on rank 1 at step 40", "loss_nonfinite", who="rank 1",
      words=("the loss became nan on rank 1 at step 40",))
def _(s: Scene) -> None:
    _nan(s, 41)


@case(live_training, "ranks 0 and 1 NaN at the same step: said as such, no rank before the other", "loss_nonfinite",
      who=None, words=("the loss became nan on ranks 0, 1 at the same step 40",))
def _(s: Scene) -> None:
    for r in (0, 1):
        s.add("rank", r, **RUNNING, metrics={"loss": "nan", "loss_step": 41,
                                              "loss_nonfinite": {"step": 40, "value": "nan", "at": NOW - 2 + r}})


@case(live_training, "rank 0 wrote its NaN first, but at step 41: rank 1's step 40 is named", "loss_nonfinite",
      who="rank 1", words=("the loss became nan on rank 1 at step 40",), evidence=("then rank 0 from step 41",))
def _(s: Scene) -> None:
    s.add("rank", 0, **RUNNING, metrics={"loss": "nan", "loss_step": 42,
                                          "loss_nonfinite": {"step": 41, "value": "nan", "at": NOW - 5}})
    s.add("rank", 1, **RUNNING, metrics={"loss": "nan", "loss_step": 42,
                                          "loss_nonfinite": {"step": 40, "value": "nan", "at": NOW - 1}})


@case(live_training, "rank 1 says NaN at step 40, rank 0 has not read step 40 yet: no one named", None, then="healthy")
def _(s: Scene) -> None:
    _nan(s, 39)


CALM = [{"t": NOW - 100 + i, "step": i * 10, "loss": 1.0 - 0.001 * i, "rate": 10.0} for i in range(60)]


@case(live_training, "the loss diverged on rank 1 at step 450", "loss_diverged", who="rank 1",
      words=("the loss diverged on rank 1 at step 450: 40",))
def _(s: Scene) -> None:
    s.ranks(2, **RUNNING)
    s.series("rank-0", CALM)
    s.series("rank-1", [dict(p, loss=40.0) if p["step"] == 450 else p for p in CALM])


@case(live_training, "rank 1 slowed down from step 400 while its peers keep their rate", "step_rate_dropped",
      who="rank 1", words=("rank 1 slowed down from step 400: 10 -> 2 steps/s while its peers keep their rate",))
def _(s: Scene) -> None:
    s.ranks(2, **RUNNING)
    s.series("rank-0", CALM)
    s.series("rank-1", [dict(p, rate=10.0 if i < 40 else 2.0) for i, p in enumerate(CALM)])


@case(live_training, "a dip of 5 s (an eval): no rate drop", None, then="healthy")
def _(s: Scene) -> None:
    s.ranks(2, **RUNNING)
    s.series("rank-0", CALM)
    s.series("rank-1", [dict(p, rate=10.0 if i < 55 else 2.0) for i, p in enumerate(CALM)])


@case(live_training, "an ended run: its metrics are ended_training's", None, then="exception")
def _(s: Scene) -> None:
    s.ended("failed", failure={"rank": 1})
    s.add("rank", 0, **DONE)
    s.add("rank", 1, health=Health.FAILED, state="failed", error="ValueError: loss is nan (at train.py:50)",
          metrics={"loss_nonfinite": {"step": 40, "value": "nan", "at": NOW - 100}})


# ---- oom_skipped
def _skipped(s: Scene) -> None:
    s.add("rank", 0, **RUNNING, metrics={"skipped_steps": 2})
    s.add("rank", 1, **RUNNING, step=38, metrics={"skipped_steps": 2})  # every rank skips the step
    s.log("job", "step 36\nrank 1: CUDA out of memory at step 37; the step is skipped on every rank\n")


@case(oom_skipped, "rank 1 ran out of memory at step 37, the step skipped on every rank", "out_of_memory",
      who="rank 1", words=("rank 1 ran out of memory at step 37 (the step was skipped on every rank (2 so far); "
                           "training goes on)",))
def _(s: Scene) -> None:
    _skipped(s)


@case(oom_skipped, "a run that succeeded after a skipped step: the run succeeded", "out_of_memory",
      who="rank 1", then="succeeded")
def _(s: Scene) -> None:
    _skipped(s)
    s.ended("succeeded", summary="every rank exited 0")


@case(oom_skipped, "no step skipped: nothing wrong", None, then="healthy")
def _(s: Scene) -> None:
    s.ranks(2, **RUNNING)


# ---- healthy (what the table says when no rule speaks)
@case(healthy, "nothing: healthy, 2 processes, 10/100 steps", "healthy",
      words=("nothing: healthy, 2 processes, 10/100 steps, 5 steps/s",), then="healthy")
def _(s: Scene) -> None:
    s.ranks(2, **RUNNING, total=100, rate=5.0)


@case(healthy, "nothing wrong yet: the run is starting", "starting", words=("nothing wrong yet: the run is starting",),
      then="starting")
def _(s: Scene) -> None:
    s.add("launcher", None, health=Health.STARTING)
    s.add("rank", 0, health=Health.STARTING, step=0)


# --------------------------------------------------------------------------- the tests
@pytest.mark.parametrize("c", CASES, ids=[c.id for c in CASES])
def test_rule(c: Case, tmp_path: Path) -> None:
    scene = Scene(tmp_path / "run")
    c.build(scene)
    ev = scene.evidence()
    v: Verdict | None = c.rule(ev)
    if c.mode is None:
        assert v is None, v.text(NOW)
    else:
        assert v is not None, f"{c.rule.__name__} said nothing"
        assert v.mode == c.mode, v.text(NOW)
        assert v.mode in MODES
        label = (v.who or {}).get("label")
        assert label == c.who, v.text(NOW)
        for words in c.words:
            assert words in v.headline, v.headline
        for words in c.evidence:
            assert any(words in line for line in v.evidence), v.evidence
        for words in c.not_evidence:
            assert not any(words in line for line in v.evidence), v.evidence
        assert v.ok is (v.mode in ("healthy", "starting", "succeeded", "busy", "waiting", "no_signal"))
    expected = c.then or c.mode  # what `ups why` says: the first rule of the table that speaks
    if expected is not None:
        table = first_verdict(scene.evidence())
        assert table.mode == expected, table.text(NOW)
        if c.then is None or c.then == c.mode:
            assert table.headline == v.headline


def test_each_rule_of_the_table_has_a_case_where_it_speaks_and_a_near_miss() -> None:
    covered = {c.rule for c in CASES}
    assert set(RULES) | {healthy} == covered
    for rule in RULES:
        mine = [c for c in CASES if c.rule is rule]
        assert any(not c.near_miss for c in mine), f"{rule.__name__}: no case where it speaks"
        assert any(c.near_miss for c in mine), f"{rule.__name__}: no near miss"


def test_the_host_facts_are_given_not_read() -> None:
    """A given host answers only what it was given: nothing of this machine leaks in."""
    host = GivenHost(hostname=HERE, oom_kills=3, listeners={29500: (7, "x")})
    assert (host.hostname, host.oom_kills, host.shm, host.gpus) == (HERE, 3, None, None)
    assert host.port_holder(29500) == (7, "x") and host.port_holder(22) is None
    assert host.proc(1) is None and host.free_bytes("/") is None


def test_a_rule_that_needs_no_host_fact_asks_none(tmp_path: Path) -> None:
    """The facts are lazy: the verdict on a run that succeeded reads no /proc, cgroup or GPU."""
    from ups.why.host import HostFacts

    scene = Scene(tmp_path / "run")
    scene.ended("succeeded", summary="every rank exited 0")
    scene.add("rank", 0, **DONE)
    asked: list[str] = []

    class Counting(HostFacts):
        def __getattribute__(self, name: str):
            if not name.startswith("_"):
                asked.append(name)
            return super().__getattribute__(name)

    view = scene.evidence().view
    v = first_verdict(Evidence(view, now=NOW, host=Counting()))
    assert v.mode == "succeeded" and asked == []
