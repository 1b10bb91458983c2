"""Any PyTorch program, watched with no code change: `ups launch torchrun|python`.

Real torchrun ranks and real DataLoader workers (fork and spawn) running the scripts in
tests/programs/, which know nothing of ups. What is checked is what a user checks:
`ups status --json`, `ups stacks`, run.json's state and summary, the event log.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import run_ups, status_now, wait_for

from ups.instrument import SITE_DIR
from ups.runs.rundir import RunDir
from ups.status.reader import read_status_dir

PROGRAMS = Path(__file__).parent / "programs"
DDP = str(PROGRAMS / "ddp_train.py")
FINAL = ("succeeded", "partial", "failed", "killed")
FAST_HEARTBEAT = {"UPS_HEARTBEAT_INTERVAL": "0.3"}


def launched(res: subprocess.CompletedProcess) -> RunDir:
    """The run a `ups launch ... --json` created."""
    assert res.stdout.strip(), res.stderr
    return RunDir(json.loads(res.stdout)["run_dir"])


def records(run: RunDir) -> dict:
    return {r.name: r for r in read_status_dir(run.status_dir).records}


def status(run: RunDir) -> dict:
    res = run_ups("status", str(run.path), "--json")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def by_name(data: dict) -> dict:
    return {p["name"]: p for p in data["processes"]}


def wait_final(run: RunDir, timeout: float = 120) -> dict:
    wait_for(lambda: run.read_manifest()["state"] in FINAL, timeout, interval=0.2, message="the run to end")
    return run.read_manifest()


# ---------------------------------------------------------------------- torchrun
@pytest.mark.slow
@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_ddp_script_is_watched_with_no_code_change(runs_root, tmp_path, start_method):
    ckpt = tmp_path / "model.pt"
    res = run_ups("launch", "torchrun", "--total-steps", "24", "--json", "--nproc-per-node", "2", DDP,
                  "--steps", "24", "--workers", "2", "--start-method", start_method, "--step-time", "0.1",
                  "--ckpt", str(ckpt), env=FAST_HEARTBEAT, timeout=240, cwd=tmp_path)
    run = launched(res)
    assert res.returncode == 0, res.stderr + run.log_path("job").read_text()[-3000:]
    m = run.read_manifest()
    assert m["state"] == "succeeded" and m["kind"] == "torchrun"
    assert "--standalone" in m["command"] and m["cwd"] == str(tmp_path)
    line = ["--nproc-per-node", "2", DDP, "--steps", "24", "--workers", "2", "--start-method", start_method,
            "--step-time", "0.1", "--ckpt", str(ckpt)]
    assert m["command"][-len(line):] == line  # the user's line, untouched, after our additions
    procs = by_name(status(run))
    assert procs["agent"]["role"] == "agent" and procs["agent"]["health"] == "done"
    for rank in (0, 1):
        r = procs[f"rank-{rank}"]
        assert (r["role"], r["rank"], r["world_size"], r["health"]) == ("rank", rank, 2, "done")
        assert (r["step"], r["total"], r["unit"]) == (24, 24, "steps")  # optimizer steps, total from --total-steps
        assert r["metrics"]["epoch"] >= 0  # DistributedSampler.set_epoch
        workers = [p for p in procs.values() if p["role"] == "worker" and p["rank"] == rank]
        assert sorted(w["worker"] for w in workers) == [0, 1]
        assert all(w["step"] > 0 and w["item"].startswith("index") for w in workers)  # samples fetched, index in flight
    recs = records(run)
    assert recs["rank-0"].coll_seq >= 24 and recs["rank-0"].collective is None  # one logged all_reduce per step
    assert ckpt.exists()
    ends = [e for e in run.read_events() if e["event"] == "process.exit"]
    assert {e["name"] for e in ends} >= {"rank-0", "rank-1", "agent"} and all(e["clean"] for e in ends)


@pytest.mark.slow
def test_live_run_shows_phases_collectives_workers_and_stacks(runs_root, tmp_path):
    res = run_ups("launch", "torchrun", "--detach", "--json", "--nproc-per-node", "2", DDP, "--steps", "400",
                  "--workers", "2", "--step-time", "0.05", env=FAST_HEARTBEAT, cwd=tmp_path)
    run = launched(res)

    def training():
        procs = by_name(status_now(run))
        ranks = [procs.get(f"rank-{r}") for r in (0, 1)]
        workers = [p for p in procs.values() if p["role"] == "worker"]
        ok = all(r and r["unit"] == "steps" and r["step"] > 3 and r["health"] == "ok" for r in ranks) and len(workers) == 4
        return ok and procs

    procs = wait_for(training, 90, interval=0.3, message="both ranks training, four workers")
    assert procs["rank-0"]["phase"] in ("train", "data", "collective:all_reduce")
    assert all(w["health"] == "ok" and w["heartbeat_age"] < 3 for w in procs.values() if w["role"] == "worker")
    stacks = run_ups("stacks", str(run.path), "--rank", "1", "--worker", "0")
    assert stacks.returncode == 0, stacks.stderr
    assert "(most recent call first)" in stacks.stdout and "ups-reporter" not in stacks.stdout.split("---")[0]
    assert run_ups("kill", str(run.path), "--grace", "3").returncode == 0
    assert wait_final(run)["state"] == "killed"


# Failures of a watched program (an exception on one rank, os._exit mid-run, a rank stuck in
# its own code, a DataLoader worker stuck in an HDF5 open) are the drills of tests/why_drills.py:
# tests/test_why_modes.py checks there what status, stacks, run.json and `ups why` say of each.


@pytest.mark.slow
def test_relaunch_with_num_workers_0_gets_past_workers_that_deadlock(runs_root, tmp_path):
    script = str(PROGRAMS / "cached_reader.py")
    res = run_ups("launch", "python", "--detach", "--json", "--stalled-after", "2", script, "--workers", "2",
                  env=FAST_HEARTBEAT, cwd=tmp_path)
    old = launched(res)

    def stuck():  # what the operator sees before relaunching: a worker that sits in fetch (it turns
        procs = by_name(status_now(old))  # 'stalled' only after the 30 s start-up grace: no need to wait it out)
        return any(p["role"] == "worker" and p["phase"] == "fetch" and p["step"] == 0 and p["progress_age"] > 2
                   and p["health"] in ("starting", "stalled") for p in procs.values())

    wait_for(stuck, 60, interval=0.3, message="a DataLoader worker stuck in fetch")
    res = run_ups("relaunch", str(old.path), "--num-workers", "0", "--json", env=FAST_HEARTBEAT, timeout=120)
    assert res.returncode == 0, res.stderr
    new = launched(res)
    assert old.read_manifest()["state"] == "killed"
    m = new.read_manifest()
    assert m["state"] == "succeeded" and m["relaunched_from"] == old.run_id and m["cwd"] == str(tmp_path)
    assert "sum 480.0" in new.log_path("job").read_text()
    assert "DataLoader num_workers=2 forced to 0" in new.log_path("job").read_text()
    recs = records(new)
    assert recs["rank-0"].metrics["forced_num_workers"] == 0 and not [r for r in recs.values() if r.role == "worker"]
    assert any(e["event"] == "relaunch" and e["new_run"] == new.run_id for e in old.read_events())
    assert any(e["event"] == "relaunched_from" and e["run"] == old.run_id for e in new.read_events())


def test_exit_code_and_os_exit_of_a_python_program(runs_root, tmp_path):
    script = tmp_path / "job.py"
    script.write_text("import os, sys\nprint('working')\nif sys.argv[1] == 'exit3':\n    sys.exit(3)\nos._exit(0)\n")
    res = run_ups("launch", "python", "--json", str(script), "exit3", cwd=tmp_path)
    run = launched(res)
    assert res.returncode == 1 and run.read_manifest()["summary"] == "exited with code 3 in phase start"
    res = run_ups("launch", "python", "--json", str(script), "os_exit", cwd=tmp_path)
    run = launched(res)
    m = run.read_manifest()
    assert res.returncode == 1 and m["state"] == "failed"
    assert m["summary"].startswith("ended without a normal interpreter exit (os._exit or a signal), exit code 0")


def test_options_before_the_line_are_ups_options_and_the_rest_passes_untouched(runs_root, tmp_path):
    script = tmp_path / "echo.py"
    script.write_text("import sys, json\nprint('ARGS=' + json.dumps(sys.argv[1:]))\n")
    res = run_ups("launch", "python", "--name", "echo-run", "--json", "-u", str(script), "--name", "x", "--json",
                  "--", "-v", cwd=tmp_path)
    run = launched(res)
    assert res.returncode == 0, res.stderr
    assert run.run_id.split("-")[2:4] == ["echo", "run"]
    assert 'ARGS=["--name", "x", "--json", "--", "-v"]' in run.log_path("job").read_text()


def test_bad_lines_are_refused_before_anything_starts(runs_root, tmp_path):
    for args, message in (
        (("torchrun", "--nproc-per-node", "2"), "no training script"),
        (("torchrun", "--bogus-option", "x.py"), "--bogus-option is not a torchrun option"),
        (("python", str(tmp_path / "missing.py")), "missing.py: no such script"),
        (("python",), "nothing to run"),
        (("python", "--stalled-after", "0", "x.py"), "--stalled-after must be > 0"),
    ):
        res = run_ups("launch", *args, cwd=tmp_path)
        assert res.returncode == 2, (args, res.stderr)
        assert message in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert list(runs_root.iterdir()) == []


# ------------------------------------------------------------ never breaks a program
def instrumented_python(code: str, run_dir: Path, **env: str) -> subprocess.CompletedProcess:
    full = dict(os.environ, UPS_RUN_DIR=str(run_dir), UPS_TOP_ROLE="rank",
                PYTHONPATH=os.pathsep.join([SITE_DIR, env.pop("EXTRA_PATH", ""), os.environ.get("PYTHONPATH", "")]))
    full.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, timeout=60)


def test_a_broken_instrumentation_is_one_warning_and_the_program_runs(tmp_path):
    run = RunDir.create(tmp_path / "runs", "test")
    res = instrumented_python("print('result', 6 * 7)", run.path, UPS_HEARTBEAT_INTERVAL="not-a-number")
    assert res.returncode == 0 and res.stdout == "result 42\n"
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("ups: instrumentation off in this process")


def test_instrumentation_off_and_the_users_own_sitecustomize_still_runs(tmp_path):
    run = RunDir.create(tmp_path / "runs", "test")
    user_site = tmp_path / "usersite"
    user_site.mkdir()
    (user_site / "sitecustomize.py").write_text("import builtins\nbuiltins.USER_SITE_RAN = True\n")
    code = "import sys\nprint(USER_SITE_RAN, 'torch' in sys.modules)"
    res = instrumented_python(code, run.path, EXTRA_PATH=str(user_site))
    assert res.returncode == 0 and res.stdout == "True False\n", res.stderr  # torch is never imported for us
    assert records(run)["rank-0"].state == "done"
    off = RunDir.create(tmp_path / "runs", "test")
    res = instrumented_python(code, off.path, EXTRA_PATH=str(user_site), UPS_INSTRUMENT="0")
    assert res.returncode == 0 and res.stdout == "True False\n" and records(off) == {}


# ---------------------------------------------------------------- the line, parsed
def test_torchrun_option_table_matches_torchs_parser():
    from torch.distributed.run import get_args_parser

    from ups.launch.programs import TORCHRUN_FLAGS, TORCHRUN_VALUE_OPTIONS

    actions = [a for a in get_args_parser()._actions if a.option_strings]
    assert {s for a in actions if a.nargs == 0 for s in a.option_strings} == TORCHRUN_FLAGS
    assert {s for a in actions if a.nargs != 0 for s in a.option_strings} == TORCHRUN_VALUE_OPTIONS


def test_torchrun_lines_split_where_torchrun_splits_them():
    from ups.launch.programs import parse_torchrun, torchrun_command

    line = parse_torchrun(["--nproc_per_node=2", "--max-restarts", "1", "-m", "pkg.train", "--lr", "3e-4"])
    assert (line.target, line.args, line.name) == (["pkg.train"], ["--lr", "3e-4"], "train")
    cmd = torchrun_command(line)
    assert "--standalone" in cmd and cmd[-6:] == ["--max-restarts", "1", "-m", "pkg.train", "--lr", "3e-4"]
    line = parse_torchrun(["--nproc", "2", "--rdzv-endpoint", "h:29400", "--log-dir", "/x", "-t3", "train.py", "--", "-v"])
    assert line.target == ["train.py"] and line.args == ["--", "-v"]
    cmd = torchrun_command(line)
    assert "--standalone" not in cmd and cmd.count("--log-dir") == 1 and "--tee" not in cmd  # the user's own kept


def test_helper_processes_of_a_rank_get_records_of_their_own(runs_root, tmp_path):
    script = tmp_path / "helpers.py"
    script.write_text(
        "import multiprocessing as mp, subprocess, sys\n"
        "def work(n):\n"
        "    return sum(range(n))\n"
        "if __name__ == '__main__':\n"
        "    p = mp.get_context('spawn').Process(target=work, args=(10,))\n"
        "    p.start(); p.join()\n"
        "    subprocess.run([sys.executable, '-c', 'print(42)'], check=True)\n"
        "    print('exit codes', p.exitcode)\n"
    )
    res = run_ups("launch", "python", "--json", str(script), cwd=tmp_path)
    run = launched(res)
    assert res.returncode == 0, res.stderr
    recs = records(run)
    helpers = [r for r in recs.values() if r.role == "helper"]
    assert len(helpers) == 2 and all(h.rank == 0 and h.state == "done" for h in helpers), recs
    assert any("multiprocessing" in (h.command or "") for h in helpers)
    assert any("print(42)" in (h.command or "") for h in helpers)
    assert {h.name for h in helpers} == {f"rank-0-helper-{h.pid}" for h in helpers}
    assert not [r for r in recs.values() if "resource_tracker" in (r.command or "")]
