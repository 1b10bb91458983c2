"""`ups attach PID --inject`: ups's in-process reporter started inside an attached job through
PEP 768's `sys.remote_exec` (Python >= 3.14 in the job), on request only; refused in one line
where it cannot work, the job attached anyway.

The job is tests/programs/attach_inject.py, a plain script started as one rank (RANK=0
WORLD_SIZE=1), knowing nothing of ups. Where no Python >= 3.14 is on this host, the real
`sys.remote_exec` test skips (as GPU tests do); the script it would send is then run by the job
itself, in its main thread and `__main__`'s namespace as `sys.remote_exec` runs one."""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import run_ups, wait_for

PROGRAM = Path(__file__).parent / "programs" / "attach_inject.py"
REFUSED = ("--inject needs Python >= 3.14 in the job (PEP 768 sys.remote_exec); this job runs Python {v}: "
           "attached without injection, from outside only")


def python_314() -> str | None:
    """An interpreter of this host with sys.remote_exec (CPython >= 3.14), or None."""
    found = [shutil.which(f"python3.{m}") for m in range(14, 20)]
    found += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.1[4-9]*/bin/python3")))
    for exe in filter(None, found):
        res = subprocess.run([exe, "-I", "-S", "-c", "import sys; print(hasattr(sys, 'remote_exec'))"],
                             capture_output=True, text=True, timeout=30)
        if res.stdout.strip() == "True":
            return exe
    return None


class Job:
    """The job's python process, started from a shell as a user starts it (the shell stays its
    parent: a job's top is found below a shell, never in the test runner)."""

    def __init__(self, shell: subprocess.Popen, pid: int) -> None:
        self.shell, self.pid = shell, pid

    def poll(self) -> int | None:
        return None if os.path.exists(f"/proc/{self.pid}") and self.shell.poll() is None else 1


@pytest.fixture
def start_job(tmp_path):
    started: list[subprocess.Popen] = []

    def start(exe: str = sys.executable, **env: str) -> tuple[Job, Path]:
        from ups.attach.find import children_map

        log = tmp_path / f"job-{len(started)}.log"
        full = {k: v for k, v in os.environ.items() if not k.startswith("UPS_")}
        full.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", **env)
        with open(log, "wb") as out:
            shell = subprocess.Popen(["/bin/sh", "-c", f'"{exe}" -u "{PROGRAM}"; status=$?'], stdout=out,
                                     stderr=subprocess.STDOUT, env=full, start_new_session=True, cwd=tmp_path)
        started.append(shell)
        wait_for(lambda: "step 0" in log.read_text(), 60, interval=0.1, message="the job's first line")
        return Job(shell, children_map()[shell.pid][0]), log

    yield start
    for shell in started:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(shell.pid, signal.SIGKILL)  # the shell's session: the job with it
        shell.wait(timeout=10)


def record(runs_root: Path, run_id: str) -> dict | None:
    try:
        return json.loads((runs_root / run_id / "status" / "rank-0.json").read_text())
    except (OSError, ValueError):
        return None


def events(runs_root: Path, run_id: str) -> list[dict]:
    return [json.loads(line) for line in (runs_root / run_id / "events.jsonl").read_text().splitlines()]


def reports_from_inside(runs_root: Path, run_id: str, pid: int) -> dict:
    """The job's own reporter writes rank 0's record (no observer's mark) and its heartbeat
    thread moves it on; the observer has handed the record over."""
    def own():
        r = record(runs_root, run_id)
        return r if r and r["pid"] == pid and "attached" not in (r.get("metrics") or {}) else None
    first = wait_for(own, 60, interval=0.2, message="a record written from inside the job")
    wait_for(lambda: (own() or first)["heartbeat_at"] > first["heartbeat_at"] + 1.5, 30, interval=0.2,
             message="its in-process heartbeat moving on")
    handed = wait_for(lambda: [e for e in events(runs_root, run_id) if e["event"] == "attach.injected"], 30,
                      message="the observer's hand-over event")
    assert handed[0]["pid"] == pid and handed[0]["name"] == "rank-0"
    # One writer from then on: the observer's marked record never comes back.
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        r = record(runs_root, run_id)
        assert r is None or "attached" not in (r.get("metrics") or {}), r
        time.sleep(0.2)
    return own()


@pytest.mark.skipif(sys.version_info >= (3, 14), reason="this interpreter has sys.remote_exec: nothing to refuse")
def test_inject_on_an_older_python_is_refused_in_one_line_and_the_job_is_attached_anyway(runs_root, start_job):
    job, _ = start_job()
    res = run_ups("attach", str(job.pid), "--inject")
    assert res.returncode == 0, res.stderr
    v = ".".join(map(str, sys.version_info[:3]))
    said = [line for line in res.stdout.splitlines() if "--inject" in line]
    assert said == [REFUSED.format(v=v)], res.stdout
    run_id = res.stdout.split("attached as run ", 1)[1].split()[0]
    assert json.loads((runs_root / run_id / "run.json").read_text())["inject"] is True
    ev = events(runs_root, run_id)
    assert [e["event"] for e in ev] == ["attach", "attach.inject"]
    assert ev[1]["processes"] == [{"pid": job.pid, "name": "rank-0", "sent": False, "reason": REFUSED.format(v=v)}]
    r = wait_for(lambda: record(runs_root, run_id), 30, message="the observer's record")
    assert r["metrics"].get("attached") is True and job.poll() is None  # watched from outside; never signalled


def test_an_interpreter_others_can_replace_is_never_run(runs_root, start_job, tmp_path):
    """--inject runs the job's own interpreter (its version, then the call): never one that a
    user other than root and you could have written. The job's python is a copy in a folder
    anyone can write (no sticky bit): refused in one line, before anything of it runs."""
    folder = tmp_path / "shared-bin"
    folder.mkdir()
    exe = folder / "python3"
    shutil.copy2(os.path.realpath(sys.executable), exe)
    folder.chmod(0o777)
    job, _ = start_job(str(exe))
    res = run_ups("attach", str(job.pid), "--inject", "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    (said,) = out["inject"]
    assert said["sent"] is False and f"others can write the folder {folder}: ups does not run {exe}" in said["reason"], said
    assert said["reason"].endswith("attached without injection, from outside only")
    assert not (runs_root / out["run_id"] / "inject").exists()  # no script was written for it either
    assert job.poll() is None


@pytest.mark.slow
def test_the_script_remote_exec_would_run_starts_the_reporter_inside_the_job(runs_root, start_job, tmp_path):
    """Everything of --inject but the kernel-level delivery: the script written for the job's
    rank, run in its main thread in __main__'s namespace, starts the in-process reporter, and the
    observer hands that process's record over to it."""
    from ups.attach.find import find_job
    from ups.attach.inject import script_for
    from ups.runs.rundir import RunDir

    trigger = tmp_path / "run-this"
    job, log = start_job(ATTACH_INJECT_RUN=str(trigger))
    res = run_ups("attach", str(job.pid), "--inject", "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    run_id = out["run_id"]
    rank = next(p for p in find_job(job.pid).procs if p.role == "rank")
    script = script_for(RunDir(runs_root / run_id), rank)
    assert len(Path(script).read_text().splitlines()) == 1
    trigger.write_text(script)
    wait_for(lambda: "new globals:" in log.read_text(), 30, interval=0.1, message="the job to run the script")
    assert "new globals: []" in log.read_text(), log.read_text()  # nothing bound in the program's __main__
    r = reports_from_inside(runs_root, run_id, job.pid)
    assert r["role"] == "rank" and r["rank"] == 0 and r["run_id"] == run_id and r["state"] == "running"
    assert "no in-process reporter" not in log.read_text() and job.poll() is None


def test_an_owner_who_turned_remote_debugging_off_is_honoured():
    from ups.attach.find import Proc
    from ups.attach.inject import refusal

    py314 = ((3, 14, 0), "3.14.0")
    for env, args, said in (({"PYTHON_DISABLE_REMOTE_DEBUG": "1"}, [], "PYTHON_DISABLE_REMOTE_DEBUG is set"),
                            ({}, ["-X", "disable_remote_debug"], "-X disable_remote_debug")):
        proc = subprocess.Popen([sys.executable, *args, "-c", "import time; print('up', flush=True); time.sleep(60)"],
                                env={**os.environ, **env}, stdout=subprocess.PIPE)
        try:
            assert proc.stdout.readline() == b"up\n"  # running: its /proc entries are its own
            p = Proc(pid=proc.pid, ppid=os.getpid(), start=None, role="rank", name="rank-0", argv=[], rank=0)
            line = refusal(p, py314)
            assert line is not None and said in line and "honoured" in line and "\n" not in line
            assert line.endswith("attached without injection, from outside only")
        finally:
            proc.kill()
            proc.wait()


@pytest.mark.skipif(python_314() is None, reason="no Python >= 3.14 on this host (sys.remote_exec, PEP 768)")
@pytest.mark.slow
def test_inject_through_sys_remote_exec_starts_the_reporter_inside_a_python_314_job(runs_root, start_job):
    job, log = start_job(python_314())
    res = run_ups("attach", str(job.pid), "--inject", "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["inject"] == [{"pid": job.pid, "name": "rank-0", "sent": True, "reason": None}], out
    r = reports_from_inside(runs_root, out["run_id"], job.pid)
    assert r["role"] == "rank" and r["run_id"] == out["run_id"]
    assert "no in-process reporter" not in log.read_text() and job.poll() is None
