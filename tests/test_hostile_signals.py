"""Signals only reach the job (issue 18, item 4), tried as a hostile neighbour would.

A record is the job's word, and anyone who can write a file can name any pid with its true
start time. Each case: no traceback, an answer within 10 s, one line that names the reason,
nothing signalled outside the job, nothing written where it must not be.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from helpers import record_job, run_ups, wait_for

from ups.runs.rundir import RunDir
from ups.status.host import hostname
from ups.status.procs import process_start_time
from ups.status.record import StatusRecord

OTHER_USER = "ups_other"


def forge(run: RunDir, name: str, rank: int, pid: int, *, stale: bool = True) -> None:
    """Plant a record naming ``pid`` with its true start time, as a neighbour could."""
    now = time.time()
    age = 30.0 if stale else 0.0
    rec = StatusRecord(run_id=run.run_id, role="rank", name=name, pid=pid, pid_start=process_start_time(pid) or 0.0,
                       host=hostname(), rank=rank, world_size=1, phase="train", state="running", step=3,
                       started_at=now - 60, progress_at=now - age, heartbeat_at=now - age, phase_at=now - 60,
                       heartbeat_interval=1.0, stack_file=f"stacks/{name}.txt", stack_signal=10)
    (run.status_dir / f"{name}.json").write_text(rec.to_json())


def one_line_refusal(res: subprocess.CompletedProcess, *needles: str) -> None:
    assert res.returncode != 0, res.stdout
    assert "Traceback" not in res.stderr, res.stderr
    text = res.stderr + res.stdout
    for needle in needles:
        assert needle in text, text


def other_user() -> pwd.struct_passwd:
    if os.geteuid() != 0:
        pytest.skip("needs root to make a second local user and run a process as it")
    try:
        return pwd.getpwnam(OTHER_USER)
    except KeyError:
        pass
    res = subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", OTHER_USER],
                         capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot create a second local user: {res.stderr.strip()}")
    return pwd.getpwnam(OTHER_USER)


def as_user(procs, user: pwd.struct_passwd, *cmd: str) -> subprocess.Popen:
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv is not installed")
    return procs.popen(["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups", *cmd])


def signalled(run: RunDir, pid: int) -> list[dict]:
    return [e for e in run.read_events() if e["event"] == "signal" and e.get("pid") == pid]


SLEEPER = "import time\nprint('up', flush=True)\ntime.sleep(120)\n"


def test_forged_records_in_a_live_run_never_reach_strangers(procs, runs_root, tmp_path):
    """A live run (real launcher) with planted records naming another user's process and one
    of our own user's processes outside the job: neither the launcher's automatic stack dump
    nor `ups kill` signals them; the job itself is still stopped."""
    user = other_user()
    theirs = as_user(procs, user, "sleep", "120")
    ours = procs.popen(["sleep", "120"])  # the same user's, but not the job's
    wait_for(lambda: process_start_time(theirs.pid) and process_start_time(ours.pid), 10, message="strangers up")
    prog = tmp_path / "sleeper.py"
    prog.write_text(SLEEPER)
    res = run_ups("launch", "python", "--detach", "--json", "--unresponsive-after", "1", str(prog), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    run = RunDir(json.loads(res.stdout)["run_dir"])
    wait_for(lambda: (run.status_dir / "rank-0.json").exists(), 30, message="the job's record")
    forge(run, "rank-5", 5, theirs.pid)
    forge(run, "rank-6", 6, ours.pid)

    # The launcher's automatic action sees them stale (unresponsive) and must refuse both.
    def auto(name: str) -> dict | None:
        return next((e for e in run.read_events() if e["event"] == "stacks.auto" and e["target"] == name), None)

    e5 = wait_for(lambda: auto("rank-5"), 30, message="the automatic dump's decision on rank-5")
    e6 = wait_for(lambda: auto("rank-6"), 30, message="the automatic dump's decision on rank-6")
    assert "not dumped" in e5["result"] and OTHER_USER in e5["result"], e5
    assert "not dumped" in e6["result"] and "not provably this run's" in e6["result"], e6

    for rank, needle in ((5, OTHER_USER), (6, "not provably this run's")):
        started = time.monotonic()
        res = run_ups("kill", str(run.path), "--rank", str(rank), "--force")
        assert time.monotonic() - started < 10
        one_line_refusal(res, needle)
        assert len(res.stderr.strip().splitlines()) == 1, res.stderr

    res = run_ups("kill", str(run.path), "--grace", "2")  # the whole run: the job goes, the strangers stay
    assert "Traceback" not in res.stderr
    wait_for(lambda: run.read_manifest()["state"] == "killed", 30, message="the run killed")
    assert theirs.poll() is None and ours.poll() is None, "a stranger was killed"
    assert not signalled(run, theirs.pid) and not signalled(run, ours.pid)
    assert [e for e in run.read_events() if e["event"] == "signal"], "the job itself was not signalled"


def test_pid_1_is_never_signalled(tmp_path, runs_root):
    """A forged record naming pid 1 with its true start time. Tried inside a pid namespace of
    its own, so that even a broken ups could only hit that namespace's pid 1."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare for a pid namespace of its own")
    run = RunDir.create(runs_root, "test")
    inner = textwrap.dedent(
        f"""
        import json, subprocess, sys, time
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_hostile_signals import forge
        from ups.runs.rundir import RunDir
        run = RunDir({str(run.path)!r})
        forge(run, "rank-0", 0, 1, stale=False)
        out = {{}}
        for args in (["kill", str(run.path), "--rank", "0", "--force"], ["kill", str(run.path), "--force"],
                     ["stacks", str(run.path)]):
            t = time.monotonic()
            res = subprocess.run([sys.executable, "-m", "ups", *args], capture_output=True, text=True, timeout=60)
            out[" ".join(args[:1] + args[2:])] = [res.returncode, res.stdout, res.stderr, time.monotonic() - t]
        print(json.dumps(out))
        """
    )
    res = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", inner],
                         capture_output=True, text=True, timeout=120)
    if res.returncode != 0 and not res.stdout.strip():
        pytest.skip(f"no pid namespace here: {res.stderr.strip()[-200:]}")
    results = json.loads(res.stdout.strip().splitlines()[-1])
    for what, (rc, out, err, took) in results.items():
        assert rc != 0 and took < 10 and "Traceback" not in err, (what, out, err)
        assert "never signals pid 1" in out + err, (what, out, err)
    assert not [e for e in run.read_events() if e["event"] == "signal"]


def test_a_run_planted_by_another_user_in_a_shared_folder_is_read_never_acted_on(procs, tmp_path):
    user = other_user()
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    tmp_path.chmod(0o755)
    run = RunDir.create(shared, "test")
    victim = procs.popen(["sleep", "120"])  # root's own process, named by their record
    wait_for(lambda: process_start_time(victim.pid), 10, message="victim up")
    forge(run, "rank-0", 0, victim.pid, stale=False)
    run.update_manifest(job={"pid": victim.pid, "pid_start": process_start_time(victim.pid), "sid": victim.pid})
    for dirpath, _, files in os.walk(run.path):
        os.chown(dirpath, user.pw_uid, user.pw_gid)
        for f in files:
            os.chown(os.path.join(dirpath, f), user.pw_uid, user.pw_gid)

    for args in (["kill", str(run.path)], ["kill", str(run.path), "--rank", "0", "--force"]):
        started = time.monotonic()
        res = run_ups(*args)
        assert time.monotonic() - started < 10
        one_line_refusal(res, f"belongs to {OTHER_USER}", "never acts on them")
        assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    res = run_ups("stacks", str(run.path))
    one_line_refusal(res, "never acts on them")
    assert victim.poll() is None
    assert not run.events_path.exists(), "something was written into another user's run"
    assert not (run.path / "stacks" / "rank-0.txt").exists()
    res = run_ups("status", str(run.path), "--json")  # still read
    assert res.returncode == 0 and json.loads(res.stdout)["processes"][0]["pid"] == victim.pid


def test_symlinked_events_log_is_never_followed(procs, runs_root, tmp_path):
    run = RunDir.create(runs_root, "test")
    proc = procs.python("import time; time.sleep(120)")
    record_job(run, proc)
    forge(run, "rank-0", 0, proc.pid, stale=False)
    victim = tmp_path / "root-owned.conf"
    victim.write_text("precious\n")
    os.symlink(victim, run.events_path)
    res = run_ups("kill", str(run.path), "--rank", "0", "--force")
    one_line_refusal(res, "events.jsonl is not a regular file")
    assert proc.poll() is None
    assert victim.read_text() == "precious\n"
    from ups.runs.rundir import RunDir as Plain

    with pytest.raises(OSError):
        Plain(run.path).append_event("probe", actor="test")  # O_NOFOLLOW: the primitive refuses the link too
    assert victim.read_text() == "precious\n"


@pytest.mark.parametrize("where", ["/etc", "tmp"])
def test_kill_of_a_folder_that_is_no_run_writes_nothing(tmp_path, runs_root, where):
    folder = Path(where) if where == "/etc" else tmp_path / "not-a-run"
    folder.mkdir(exist_ok=True)
    before = sorted(os.listdir(folder))
    started = time.monotonic()
    res = run_ups("kill", str(folder), "--force")
    assert time.monotonic() - started < 10
    one_line_refusal(res, "is not a run folder")
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert sorted(os.listdir(folder)) == before


def test_a_record_cannot_turn_a_stack_dump_into_sigterm(procs, runs_root, tmp_path):
    """A forged record naming a job process (provably the job's, catching SIGTERM to save a
    checkpoint and exit, as trainers do) with SIGTERM as its "stack-dump signal"."""
    run = RunDir.create(runs_root, "test")
    marker = tmp_path / "got-sigterm"
    proc = procs.python(textwrap.dedent(f"""
        import signal, time
        signal.signal(signal.SIGTERM, lambda *a: open({str(marker)!r}, "w").close())
        print("up", flush=True)
        time.sleep(120)
        """), stdout=subprocess.PIPE, text=True)
    record_job(run, proc)
    assert proc.stdout.readline().strip() == "up"
    forge(run, "rank-0", 0, proc.pid, stale=False)
    rec = StatusRecord.from_json((run.status_dir / "rank-0.json").read_text())
    (run.status_dir / "rank-0.json").write_text(rec.with_changes(stack_signal=15).to_json())
    res = run_ups("stacks", str(run.path), "--rank", "0")
    one_line_refusal(res, "SIGTERM as its stack-dump signal")
    assert not marker.exists() and proc.poll() is None
    assert not signalled(run, proc.pid)


def test_a_multi_node_run_proves_its_ranks_from_this_hosts_node_manifest_only_when_trusted(procs, tmp_path, monkeypatch):
    """A multi-node run keeps each node's launcher and job in ``nodes/<host>.json``, not in
    run.json: `ups stacks --remote` on node 1 was refused for node 1's own rank. The node file is
    trusted like run.json: the acting user's, writable by no one else."""
    monkeypatch.setenv("UPS_HOSTNAME", "node1")
    run = RunDir.create(tmp_path / "runs", "torchrun")
    run.update_manifest(multinode={"nnodes": 2, "node_rank": 1}, state="running")
    job = procs.popen([sys.executable, "-c", "import subprocess, sys; subprocess.run([sys.executable, '-c', "
                       "'import time; time.sleep(60)'])"])
    rank = wait_for(lambda: next((int(c) for c in (Path(f"/proc/{job.pid}/task/{job.pid}/children")
                                                   .read_text().split())), None), 20, message="the job's rank")
    node = run.path / "nodes" / "node1.json"
    node.parent.mkdir(exist_ok=True)
    node.write_text(json.dumps({"host": "node1", "job": {"pid": job.pid, "pid_start": process_start_time(job.pid)}}))
    os.chmod(node, 0o644)

    def prove() -> str:  # from a process of its own, as `ups` over ssh is (this one is the job's parent)
        code = (f"from ups.runs.ownership import JobScope\nfrom ups.errors import RefusedSignal\ntry:\n"
                f"    print(JobScope.of_run({str(run.path)!r}).prove({rank}, {process_start_time(rank)!r}, 'rank 1'))\n"
                "except RefusedSignal as exc:\n    print('refused:', exc)")
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout

    assert "a descendant of the job's top process" in prove()
    os.chmod(node, 0o666)  # anyone could have named that "job": it proves nothing
    assert "refused:" in prove() and "not provably this run's" in prove()
