"""Every way people start training, watched: Lightning, Hugging Face Trainer, accelerate,
``torch.multiprocessing.spawn``, srun, and nothing of a job left behind.

The programs in tests/programs/frameworks/ follow each framework's documented minimal
example (tiny models built in code, synthetic data, nothing downloaded) and know nothing of
ups. Each is drilled with a fault on rank 1 (raise, os._exit(0), hang), one run per
framework and fault that differs, and checked as a user would: `ups status --json` (two
ranks with steps and their workers), run.json's state, summary and verdict (`ups why`), and
/proc (no process of the job alive afterwards).
"""

from __future__ import annotations

import importlib.util
import json
import os
import stat
import sys
from pathlib import Path

import pytest
from helpers import job_processes, run_ups, status_now, wait_for, why_now

from ups.instrument import identity
from ups.runs.rundir import RunDir

FRAMEWORKS = Path(__file__).parent / "programs" / "frameworks"
FINAL = ("succeeded", "partial", "failed", "killed")
FAST = {"UPS_HEARTBEAT_INTERVAL": "0.3"}


def needs(module: str):
    return pytest.mark.skipif(importlib.util.find_spec(module) is None,
                              reason=f"{module} is not installed (pip install -e '.[test]')")


def launched(res) -> RunDir:
    assert res.stdout.strip(), res.stderr
    return RunDir(json.loads(res.stdout)["run_dir"])


def run_script(tmp_path: Path, name: str, text: str) -> RunDir:
    """Write a small program and run it to its end under `ups launch python`."""
    script = tmp_path / name
    script.write_text(text)
    return launched(run_ups("launch", "python", "--json", str(script), env=FAST, timeout=120, cwd=tmp_path))


def status(run: RunDir) -> dict[str, dict]:
    res = run_ups("status", str(run.path), "--json")
    assert res.returncode == 0, res.stderr
    return {p["name"]: p for p in json.loads(res.stdout)["processes"]}


def why(run: RunDir) -> dict:
    res = run_ups("why", str(run.path), "--json")
    assert res.returncode in (0, 1), res.stderr
    return json.loads(res.stdout)["verdict"]


def nothing_left(run: RunDir) -> None:
    left = wait_for(lambda: not job_processes(run) or None, 30, interval=0.3,
                    message="no process of the job alive") if job_processes(run) else None
    assert left is None


def line_of(program: Path, text: str) -> int:
    return next(i for i, line in enumerate(program.read_text().splitlines(), 1) if text in line)


def check_ranks(procs: dict[str, dict], *, min_step: int = 3) -> None:
    """Two ranks with their global ranks, steps done, and their DataLoader workers under them."""
    for r in (0, 1):
        rank = procs[f"rank-{r}"]
        assert (rank["role"], rank["rank"], rank["world_size"]) == ("rank", r, 2), rank
        assert rank["step"] >= min_step, rank
        workers = [p for p in procs.values() if p["role"] == "worker" and p["rank"] == r]
        assert len(workers) == 2 and all(w["step"] > 0 for w in workers), workers


def check_blame(run: RunDir, verdict: dict, program: Path, needle: str, *, step: int = 5) -> None:
    m = run.read_manifest()
    assert m["state"] == "failed", m["summary"]
    assert m["summary"].startswith("rank 1 "), m["summary"]
    assert (m["failure"]["rank"], m["failure"]["step"], m["failure"]["phase"]) == (1, step, "train"), m["failure"]
    assert verdict["who"]["rank"] == 1 and verdict["who"]["role"] == "rank", verdict
    assert verdict["where"]["site"] == f"{program.name}:{line_of(program, needle)}", verdict


# --------------------------------------------------------------------------- mp.spawn
MP = FRAMEWORKS / "mp_spawn_ddp.py"


@pytest.mark.slow
def test_mp_spawn_raise_names_the_rank_not_the_parent(runs_root, tmp_path):
    res = run_ups("launch", "python", "--json", str(MP), "--fail", "raise", env=FAST, timeout=240, cwd=tmp_path)
    run = launched(res)
    assert res.returncode == 1, run.log_path("job").read_text()[-3000:]
    procs = status(run)
    check_ranks(procs)
    parent = [p for p in procs.values() if p["role"] == "helper"]
    assert len(parent) == 1 and parent[0]["item"] == "mp.spawn parent of 2 processes", parent
    verdict = why(run)
    check_blame(run, verdict, MP, 'raise RuntimeError(f"loss is NaN')
    assert "ProcessRaisedException" not in run.read_manifest()["summary"]
    assert "RuntimeError: loss is NaN on rank 1 at step 5" in verdict["headline"]  # the text mp.spawn's wrapper caught
    # The parent's stack file moved with its record: rank 0's is rank 0's own.
    assert "ProcessRaisedException" in (run.path / parent[0]["stack_file"]).read_text()
    assert "ProcessRaisedException" not in (run.path / "stacks" / "rank-0.txt").read_text()
    nothing_left(run)


@pytest.mark.slow
def test_mp_spawn_hang_is_stalled_and_kill_leaves_nothing(runs_root, tmp_path):
    res = run_ups("launch", "python", "--detach", "--json", "--stalled-after", "3", str(MP), "--fail", "hang",
                  "--steps", "400", env=FAST, cwd=tmp_path)
    run = launched(res)

    def stalled():
        procs = {p["name"]: p for p in status_now(run)["processes"]}
        rank1 = procs.get("rank-1", {})
        return procs if rank1.get("health") == "stalled" and rank1.get("step") == 5 else None

    procs = wait_for(stalled, 180, interval=0.5, message="rank 1 stalled at step 5")
    check_ranks(procs)
    # Both ranks stop progressing; which one is stuck in its own code shows once their stacks
    # are dumped (automatically, a few seconds into the stall).
    verdict = wait_for(lambda: (v := why_now(run))["who"] and v["who"]["rank"] == 1 and v["where"]["site"] and v, 120,
                       interval=1.0, message="the verdict to name rank 1")
    assert verdict["mode"] != "stalled" or "rank 1" in verdict["headline"], verdict
    assert verdict["where"]["site"] == f"{MP.name}:{line_of(MP, 'time.sleep(3600)')}", verdict
    assert run_ups("kill", str(run.path), "--grace", "3").returncode == 0
    wait_for(lambda: run.read_manifest()["state"] in FINAL, 60, interval=0.2, message="the run to end")
    assert run.read_manifest()["state"] == "killed"
    nothing_left(run)


# -------------------------------------------------------------------------- Lightning
LIT = FRAMEWORKS / "lit.py"


@pytest.mark.slow
@needs("lightning")
def test_lightning_started_ranks_exit_is_blamed_on_the_rank_that_left(runs_root, tmp_path):
    """`ups launch python lit.py`: Lightning re-executes the script for rank 1 itself."""
    res = run_ups("launch", "python", "--json", str(LIT), "--fail", "exit", env=FAST, timeout=240, cwd=tmp_path)
    run = launched(res)
    assert res.returncode == 1, run.log_path("job").read_text()[-3000:]
    procs = status(run)
    check_ranks(procs)
    assert not [p for p in procs.values() if p["role"] == "helper"], procs  # rank 0 is Lightning's launcher too
    check_blame(run, why(run), LIT, "os._exit(0)")
    nothing_left(run)


@pytest.mark.slow
@needs("lightning")
def test_lightning_hang_is_named_and_kill_ends_everything(runs_root, tmp_path):
    """Lightning's SIGTERM handler keeps a rank alive after SIGTERM: `ups kill` (its default
    grace) still ends every process, the launcher writes the run's end itself."""
    res = run_ups("launch", "python", "--detach", "--json", "--stalled-after", "3", str(LIT), "--fail", "hang",
                  "--steps", "400", env=FAST, cwd=tmp_path)
    run = launched(res)
    verdict = wait_for(lambda: (v := why_now(run))["who"] and v["who"]["rank"] == 1 and v["where"]["site"] and v, 180,
                       interval=1.0, message="the verdict to name rank 1")
    assert verdict["where"]["site"] == f"{LIT.name}:{line_of(LIT, 'time.sleep(3600)')}", verdict
    check_ranks(status(run))
    assert run_ups("kill", str(run.path), timeout=90).returncode == 0
    m = run.read_manifest()
    assert m["state"] == "killed" and m["summary"].startswith("stopped"), m["summary"]  # the launcher's words
    nothing_left(run)


@pytest.mark.slow
@needs("lightning")
def test_lightning_under_torchrun_raise(runs_root, tmp_path):
    res = run_ups("launch", "torchrun", "--json", "--nproc-per-node", "2", str(LIT), "--fail", "raise", env=FAST,
                  timeout=240, cwd=tmp_path)
    run = launched(res)
    assert res.returncode == 1, run.log_path("job").read_text()[-3000:]
    check_ranks(status(run))
    verdict = why(run)
    check_blame(run, verdict, LIT, 'raise RuntimeError(f"loss is NaN')
    assert "loss is NaN on rank 1" in verdict["headline"]
    nothing_left(run)


# ---------------------------------------------------------------- HF Trainer, accelerate
HF = FRAMEWORKS / "hf_trainer.py"
ACCEL = FRAMEWORKS / "accel.py"


@pytest.mark.slow
@needs("transformers")
def test_hf_trainer_os_exit_says_the_step_and_phase_it_left_in(runs_root, tmp_path):
    """HF's own loop, accelerate's wrapped optimizer: os._exit at step 5 says step 5, train
    (it said "ddp.wrap, step 0": the record lagged the program)."""
    res = run_ups("launch", "torchrun", "--json", "--nproc-per-node", "2", str(HF), "--fail", "exit", env=FAST,
                  timeout=300, cwd=tmp_path)
    run = launched(res)
    assert res.returncode == 1, run.log_path("job").read_text()[-3000:]
    check_ranks(status(run))
    check_blame(run, why(run), HF, "os._exit(0)")
    nothing_left(run)


@pytest.mark.slow
@needs("accelerate")
def test_accelerate_launch_os_exit(runs_root, tmp_path):
    res = run_ups("launch", "accelerate", "--json", "launch", "--multi_gpu", "--num_processes", "2",
                  "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "0", str(ACCEL),
                  "--fail", "exit", env=FAST, timeout=300, cwd=tmp_path)
    run = launched(res)
    assert res.returncode == 1, run.log_path("job").read_text()[-3000:]
    m = run.read_manifest()
    assert m["kind"] == "accelerate" and m["world_size"] == 2
    procs = status(run)
    assert procs["agent"]["role"] == "agent"
    check_ranks(procs)
    check_blame(run, why(run), ACCEL, "os._exit(0)")
    nothing_left(run)


# ------------------------------------------------------- the rest of the drill matrix
# Every framework x fault on rank 1 at step 5 that the tests above do not already drill, each
# one run, judged as the ones above are. (Above: mp.spawn raise/hang, Lightning's own ranks
# os._exit/hang, Lightning under torchrun raise, HF os._exit, accelerate os._exit.)
# --main_process_port 0: accelerate picks a free port (its default, 29500, is shared by every
# test that runs beside this one)
ACCELERATE_2 = ["launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no",
                "--dynamo_backend", "no", "--main_process_port", "0"]
LAUNCHERS = {"python": [], "torchrun": ["--nproc-per-node", "2"], "accelerate": ACCELERATE_2}
NEEDLE = {"raise": 'raise RuntimeError(f"loss is NaN', "exit": "os._exit(0)", "hang": "time.sleep(3600)"}


def drill(tmp_path: Path, launcher: str, program: Path, fault: str, *ups_options: str, timeout: float = 300):
    """`ups launch LAUNCHER [ups options] [launcher's own options] PROGRAM --fail FAULT`."""
    return run_ups("launch", launcher, "--json", *ups_options, *LAUNCHERS[launcher], str(program), "--fail", fault,
                   env=FAST, timeout=timeout, cwd=tmp_path)


ENDS = [  # (launcher, program, fault, framework package)
    pytest.param("python", MP, "exit", "torch", id="mp.spawn-os._exit"),
    pytest.param("python", LIT, "raise", "lightning", id="lightning-own-ranks-raise"),
    pytest.param("torchrun", HF, "raise", "transformers", id="hf-trainer-raise"),
    pytest.param("accelerate", ACCEL, "raise", "accelerate", id="accelerate-launch-raise"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("launcher", "program", "fault", "package"), ENDS)
def test_a_rank_that_raises_or_leaves_is_named_with_its_line(runs_root, tmp_path, launcher, program, fault, package):
    pytest.importorskip(package, reason=f"{package} is not installed (pip install -e '.[test]')")
    res = drill(tmp_path, launcher, program, fault)
    run = launched(res)
    assert res.returncode == 1, run.log_path("job").read_text()[-3000:]
    procs = status(run)
    check_ranks(procs)
    logged = {LIT: "train_loss", HF: "loss"}.get(program)  # Lightning's self.log, the HF Trainer's own log
    unexplained = None
    if logged:
        # The rank that raised samples its metrics as it fails (Reporter.fail); its peer, stopped by
        # that failure, has what its heartbeat last sampled: on a busy box that may be before
        # anything was logged, and then it has none, but never a wrong one.
        failed = procs["rank-1"]["metrics"]
        if program is LIT and not {"logged", "loss", "lr"} & set(failed):
            # Known and not yet understood (CI on 2026-12-02, 1 run of 4 under load): no torch
            # metric at all in either rank's last record, though both counted 5 steps.
            unexplained = f"no loss, lr or logged value in either Lightning rank's record: {procs}"
        else:
            assert isinstance(failed["logged"][logged], float), procs
        peer = procs["rank-0"]["metrics"].get("logged")
        assert peer is None or isinstance(peer[logged], float), procs
    verdict = why(run)
    check_blame(run, verdict, program, NEEDLE[fault])
    if fault == "raise":
        assert "loss is NaN on rank 1 at step 5" in verdict["headline"], verdict
    else:
        assert "without a normal interpreter exit" in run.read_manifest()["summary"], run.read_manifest()["summary"]
    nothing_left(run)
    if unexplained:
        pytest.xfail(unexplained)  # reported as such (x), never as a pass: the rest of the drill held


HANGS = [
    pytest.param("torchrun", LIT, "lightning", id="lightning-torchrun-hang"),
    pytest.param("torchrun", HF, "transformers", id="hf-trainer-hang"),
    pytest.param("accelerate", ACCEL, "accelerate", id="accelerate-launch-hang"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("launcher", "program", "package"), HANGS)
def test_a_rank_that_hangs_is_named_with_its_frame_and_kill_ends_everything(runs_root, tmp_path, launcher, program,
                                                                            package):
    pytest.importorskip(package, reason=f"{package} is not installed (pip install -e '.[test]')")
    run = launched(drill(tmp_path, launcher, program, "hang", "--detach", "--stalled-after", "3", timeout=60))
    verdict = wait_for(lambda: (v := why_now(run))["who"] and v["who"]["rank"] == 1 and v["where"]["site"] and v, 180,
                       interval=1.0, message="the verdict to name rank 1")
    assert verdict["where"]["site"] == f"{program.name}:{line_of(program, NEEDLE['hang'])}", verdict
    check_ranks(status(run))
    assert run_ups("kill", str(run.path), "--grace", "3", timeout=90).returncode == 0
    m = wait_for(lambda: (m := run.read_manifest())["state"] in FINAL and m, 60, interval=0.2, message="the run's end")
    assert m["state"] == "killed", m["summary"]
    nothing_left(run)


COMPILED = FRAMEWORKS / "compiled.py"


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["raise", "exit"])
def test_a_torch_compile_program_is_named_with_its_line_and_leaves_nothing(runs_root, tmp_path, fault):
    """One process, ``torch.compile`` (inductor may start compile workers), 2 DataLoader workers."""
    res = run_ups("launch", "python", "--json", str(COMPILED), "--fail", fault, env=FAST, timeout=300, cwd=tmp_path)
    run = launched(res)
    assert res.returncode == 1, run.log_path("job").read_text()[-3000:]
    m = run.read_manifest()
    assert m["state"] == "failed" and (m["failure"]["rank"], m["failure"]["step"], m["failure"]["phase"]) == (0, 5, "train"), m
    procs = status(run)
    assert procs["rank-0"]["step"] == 5 and len([p for p in procs.values() if p["role"] == "worker"]) == 2, procs
    verdict = why(run)
    assert verdict["who"]["rank"] == 0 and verdict["where"]["site"] == \
        f"{COMPILED.name}:{line_of(COMPILED, NEEDLE[fault] if fault == 'raise' else 'os._exit(0)')}", verdict
    nothing_left(run)


# ---------------------------------------------------------------- a helper's workers
def test_a_helpers_dataloader_workers_are_its_own(runs_root, tmp_path):
    """A helper process with a DataLoader of its own: its workers are named under it, and
    rank 0's workers keep their records (they were overwritten by the helper's)."""
    run = run_script(tmp_path, "prefetch.py",
        "import multiprocessing as mp\n"
        "import torch\n"
        "from torch.utils.data import DataLoader, TensorDataset\n\n"
        "def load():\n"
        "    for _ in DataLoader(TensorDataset(torch.arange(64.0)), batch_size=4, num_workers=2):\n"
        "        pass\n\n"
        "if __name__ == '__main__':\n"
        "    helper = mp.get_context('fork').Process(target=load)\n"
        "    helper.start()\n"
        "    load()\n"
        "    helper.join()\n")
    assert run.read_manifest()["state"] == "succeeded", run.read_manifest()["summary"]
    procs = status(run)
    helper = next(p["name"] for p in procs.values() if p["role"] == "helper")
    workers = sorted(name for name, p in procs.items() if p["role"] == "worker")
    assert workers == sorted(["rank-0-worker-0", "rank-0-worker-1", f"{helper}-worker-0", f"{helper}-worker-1"])
    assert all(procs[w]["step"] > 0 for w in workers)


@pytest.mark.slow
def test_a_helper_that_joins_a_process_group_becomes_that_rank(runs_root, tmp_path):
    """A script that starts its peer itself, the rank on the command line and nothing in the
    environment (as hand-made launchers do): the peer starts as rank 0's helper and is rank 1
    from init_process_group on, with its steps; its helper record is gone."""
    run = run_script(tmp_path, "pair.py",
        "import subprocess, sys\n"
        "import torch, torch.distributed as dist\n\n"
        "rank = int(sys.argv[1]) if len(sys.argv) > 1 else 0\n"
        "peer = subprocess.Popen([sys.executable, __file__, '1']) if rank == 0 else None\n"
        "dist.init_process_group('gloo', init_method='file://' + __file__ + '.rdzv', rank=rank, world_size=2)\n"
        "model = torch.nn.Linear(4, 1)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for _ in range(3):\n"
        "    opt.zero_grad(); model(torch.ones(2, 4)).sum().backward(); opt.step()\n"
        "    dist.all_reduce(torch.ones(1))\n"
        "dist.destroy_process_group()\n"
        "if peer is not None:\n"
        "    sys.exit(peer.wait())\n")
    m = run.read_manifest()
    assert m["state"] == "succeeded", m["summary"] + run.log_path("job").read_text()[-2000:]
    procs = status(run)
    assert sorted(procs) == ["launcher", "rank-0", "rank-1"], sorted(procs)
    assert (procs["rank-1"]["role"], procs["rank-1"]["world_size"], procs["rank-1"]["step"]) == ("rank", 2, 3)
    assert procs["rank-1"]["metrics"]["was"].startswith("rank-0-helper-")


# ------------------------------------------------------------------------------- srun
def test_srun_tasks_are_ranks_by_their_slurm_env(runs_root, tmp_path):
    """No SLURM here: an `srun` that does what srun does for one node (N copies of the
    command, each with SLURM_PROCID/SLURM_LOCALID/SLURM_NTASKS), plain python tasks."""
    fake = tmp_path / "bin" / "srun"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\n# srun -n N CMD...\nn=$2; shift 2\ni=0\nwhile [ $i -lt $n ]; do\n'
                    '  SLURM_PROCID=$i SLURM_LOCALID=$i SLURM_NTASKS=$n "$@" &\n  i=$((i+1))\ndone\nwait\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    script = tmp_path / "task.py"
    script.write_text("import os, sys, time\ntime.sleep(0.5)\nsys.exit(3 if os.environ['SLURM_PROCID'] == '1' else 0)\n")
    env = {**FAST, "PATH": f"{fake.parent}{os.pathsep}{os.environ['PATH']}"}
    res = run_ups("launch", "srun", "--json", "-n", "2", sys.executable, str(script), env=env, timeout=120, cwd=tmp_path)
    run = launched(res)
    m = run.read_manifest()
    assert (m["kind"], m["world_size"]) == ("srun", 2)
    procs = status(run)
    assert {(p["rank"], p["world_size"]) for p in procs.values() if p["role"] == "rank"} == {(0, 2), (1, 2)}
    assert m["state"] == "failed" and m["summary"].startswith("rank 1 failed"), m["summary"]


def test_launchers_that_are_not_installed_are_named(runs_root, tmp_path):
    env = {"PATH": str(tmp_path)}  # nothing on PATH
    res = run_ups("launch", "deepspeed", "--num_gpus", "2", "train.py", env=env)
    assert res.returncode == 2 and "deepspeed is not on PATH" in res.stderr and "Traceback" not in res.stderr
    res = run_ups("launch", "accelerate", "train.py", env=env)
    assert res.returncode == 2 and "accelerate launch" in res.stderr
    assert not list(runs_root.iterdir())


# ------------------------------------------------------------------------ leftovers
LEAVES = ("import os, subprocess, sys, time\n"
          "ready = os.path.abspath('leaf-ready')\n"
          "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
          "subprocess.Popen([sys.executable, '-c', 'import os, sys, time\\nif os.fork() == 0:\\n"
          "    os.setsid(); os.close(os.open(sys.argv[1], os.O_CREAT | os.O_WRONLY)); time.sleep(300)', ready])\n"
          "deadline = time.monotonic() + 60\n"
          "while not os.path.exists(ready) and time.monotonic() < deadline:  # the grandchild in its own session\n"
          "    time.sleep(0.05)\n")


def test_processes_left_by_the_job_are_ended_at_the_run_end(runs_root, tmp_path):
    """A child left running and a double-forked grandchild in a session of its own (what
    compile workers, resource trackers and daemons do): gone when the run ends, and said so."""
    run = run_script(tmp_path, "leaves.py", LEAVES)
    assert run.read_manifest()["state"] == "succeeded", run.read_manifest()["summary"]
    assert not job_processes(run)
    events = [e for e in run.read_events() if e["event"] == "leftovers"]
    assert len(events) == 1 and len(events[0]["processes"]) >= 2 and not events[0]["survivors"], events
    assert {p["why"] for p in events[0]["processes"]} == {"session", "descendant"}


@pytest.mark.slow
def test_observe_only_names_what_is_left_and_leaves_it(runs_root, tmp_path):
    script = tmp_path / "leaves.py"
    script.write_text(LEAVES)
    run = launched(run_ups("launch", "python", "--observe-only", "--json", str(script), env=FAST, timeout=120,
                           cwd=tmp_path))
    try:
        m = run.read_manifest()
        assert m["state"] == "succeeded" and "2 process(es) of the job still alive after its end" in m["summary"], m
        (event,) = [e for e in run.read_events() if e["event"] == "leftovers"]
        assert event["action"].startswith("observe-only") and len(job_processes(run)) == 2
    finally:
        for line in job_processes(run):  # this test's own job's processes, found by their run
            os.kill(int(line.split()[0]), 9)


# --------------------------------------------------------------------- rank identity
@pytest.mark.parametrize(("env", "parent", "top", "expected"), [
    ({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"}, ("agent", 1, 0), "agent", (3, 1, 4)),  # torchrun
    ({"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1"}, None, "rank", (5, 1, 8)),  # srun task
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2"}, None, "agent", None),  # torchrun's agent inside an allocation
    ({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4"}, None, "rank", (2, None, 4)),  # mpirun
    ({"PMI_RANK": "1", "PMI_SIZE": "2"}, None, "rank", (1, None, 2)),  # MPICH / Intel MPI
    ({"LOCAL_RANK": "1", "NODE_RANK": "0", "WORLD_SIZE": "2"}, ("rank", 1, 0), "rank", (1, 1, 2)),  # Lightning
    ({"LOCAL_RANK": "0", "NODE_RANK": "0", "WORLD_SIZE": "2"}, ("rank", 1, 0), "rank", None),  # rank 0's helper
    ({"LOCAL_RANK": "1", "NODE_RANK": "1"}, ("rank", 1, 0), "rank", None),  # another node: the group will say
    ({"RANK": "1", "UPS_RANK_ENV": "1"}, ("helper", 1, 1), "agent", None),  # a compile worker of rank 1
    ({"RANK": "1", "UPS_RANK_ENV": "-"}, ("helper", 1, 0), "agent", (1, None, None)),  # DeepSpeed's node launcher
    ({"RANK": "0"}, ("worker", 1, 0), "agent", None),
])
def test_rank_identity_from_the_environment(monkeypatch, env, parent, top, expected):
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "NODE_RANK", "GROUP_RANK", "UPS_RANK_ENV", "SLURM_PROCID",
                 "SLURM_NTASKS", "SLURM_LOCALID", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                 "OMPI_COMM_WORLD_LOCAL_RANK", "PMI_RANK", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALRANKID"):
        monkeypatch.delenv(name, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    found = identity.own_rank(parent, top_role=top)
    assert (None if found is None else (found.rank, found.local_rank, found.world_size)) == expected


def test_launcher_programs_are_agents():
    assert identity.is_launcher_program(["/usr/bin/python", "/venv/bin/torchrun", "--nproc-per-node", "2", "t.py"])
    assert identity.is_launcher_program(["python", "-m", "torch.distributed.run", "t.py"])
    assert identity.is_launcher_program(["/venv/bin/python", "/venv/bin/accelerate", "launch", "t.py"])
    assert not identity.is_launcher_program(["python", "train.py", "--launcher", "torchrun"])
