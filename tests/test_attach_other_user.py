"""Root attaches another user's job: nothing the job's owner could not read reaches the run
(issue 46).

A real second user (nobody, uid 65534, through ``setpriv``) runs a job that looks like a rank by
its environment (RANK, LOCAL_RANK, WORLD_SIZE: how ``ups attach`` recognises one), a plain
Python loop printing ``tick N`` into ``train.log`` in a folder of theirs. Root runs ``ups attach
PID``; then the owner, from outside the job, swaps what the log's path names:

1. a link to a root-only file;
2. a FIFO;
3. a link to ``/dev/zero``;
4. the log itself truncated up to 1 TB (a sparse file);
5. the log's folder renamed away, and a new one holding a link to the root-only file.

Each time: no byte of root's file reaches the run folder, the observer never stalls (the job's
later lines keep arriving in ``logs/job.log``), and the run folder's files are never wider than
the job's own file (its folder root's alone, the copy 0600 like the 0600 log). And a log the job
writes into a root-only file (its stdout handed to it by root) is not read at all; a writer
without end fills no more than the cap.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import run_ups, wait_for

NOBODY = 65534
SECRET = b"ROOT-ONLY-SECRET-0f3c9a"
TICKS = """\
import itertools, sys, time
for i in itertools.count():
    sys.stdout.write(f"tick {i}\\n")
    sys.stdout.flush()
    time.sleep(0.1)
"""
REOPENS = """\
import itertools, os, sys, time
for i in itertools.count():
    if i == 30:  # the job itself turns its stdout to another file of its own
        os.dup2(os.open("other.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), 1)
    sys.stdout.write(f"tick {i}\\n")
    sys.stdout.flush()
    time.sleep(0.1)
"""
FLOOD = """\
import sys, time
block = "".join(f"flood {i} {'x' * 57}\\n" for i in range(1000))
for _ in range(60):  # 4 MiB in 6 s, a little slower than the copy's 1 MiB a second, then quiet
    sys.stdout.write(block)
    sys.stdout.flush()
    time.sleep(0.1)
time.sleep(3600)
"""


def setpriv() -> list[str]:
    if os.geteuid() != 0:
        pytest.skip("needs root to run a job as a second user")
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv is not installed (util-linux)")
    return ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]


def as_nobody(cwd: Path, *cmd: str) -> None:
    """``cmd`` as uid 65534, in ``cwd`` (a folder of theirs)."""
    subprocess.run([*setpriv(), *cmd], cwd=cwd, check=True, capture_output=True, timeout=30)


def their_python() -> str:
    """An interpreter the second user can run from their shell (this one may live under root's home)."""
    for exe in (sys.executable, "/usr/bin/python3", shutil.which("python3")):
        if exe and subprocess.run([*setpriv(), "/bin/sh", "-c", '"$0" -c pass', exe], capture_output=True,
                                  timeout=30).returncode == 0:
            return exe
    pytest.skip("no Python that uid 65534 can run")


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A folder of nobody's, reachable by them (the test's folders above it made traversable)."""
    setpriv()
    for folder in [tmp_path, *tmp_path.parents]:
        if folder == Path(os.sep) or folder == Path("/tmp"):
            break
        folder.chmod(folder.stat().st_mode | 0o111)
    home = tmp_path / "home"
    home.mkdir()
    os.chown(home, NOBODY, NOBODY)
    return home


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    path = tmp_path / "secret.txt"
    path.write_bytes(SECRET + b"\n")
    path.chmod(0o600)
    return path


def start_job(procs, folder: Path, log: Path, program: str = TICKS, *, owner: int = NOBODY, mode: int = 0o600) -> Job:
    """nobody's job, a rank by its environment, writing its stdout to ``log`` (made ``owner``'s,
    ``mode``, when it does not exist), in ``folder``; started from a shell of theirs, as a user
    starts it (the shell stays its parent: a job's top is found below a shell, never in the
    test runner)."""
    from ups.attach.find import children_map

    if not log.exists():
        log.touch()
        os.chown(log, owner, owner)
        log.chmod(mode)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UPS_", "PYTHON"))}
    env.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29977")
    with open(log, "ab") as out:
        shell = procs.popen([*setpriv(), "/bin/sh", "-c", '"$0" -u -c "$1"; status=$?', their_python(), program],
                            stdout=out, stderr=subprocess.STDOUT, env=env, cwd=folder)
    wait_for(lambda: log.stat().st_size > 0, 30, message="the job's first line")
    return Job(shell, wait_for(lambda: children_map().get(shell.pid), 10, message="the job under its shell")[0])


class Job:
    def __init__(self, shell: subprocess.Popen, pid: int) -> None:
        self.shell, self.pid = shell, pid

    def poll(self) -> int | None:
        return None if os.path.exists(f"/proc/{self.pid}") and self.shell.poll() is None else 1


def attach(pid: int, *args: str) -> Path:
    res = run_ups("attach", str(pid), "--json", *args)
    assert res.returncode == 0, res.stderr
    return Path(json.loads(res.stdout)["run_dir"])


def copy(run: Path) -> bytes:
    try:
        return (run / "logs" / "job.log").read_bytes()
    except FileNotFoundError:
        return b""


def last_tick(data: bytes) -> int:
    found = re.findall(rb"tick (\d+)\n", data)
    return int(found[-1]) if found else -1


def events(run: Path, name: str) -> list[dict]:
    return [e for e in map(json.loads, (run / "events.jsonl").read_text().splitlines()) if e["event"] == name]


def every_file(run: Path) -> list[Path]:
    return [Path(d) / f for d, _, files in os.walk(run) for f in files]


def leaked(data: bytes) -> str | None:
    if SECRET in data:
        return "root's secret was copied into the run's log"
    if b"\0" * 4096 in data:
        return "zeros the job never wrote (a device, a hole) were copied into the run's log"
    return None


def keeps_reading_and_never_leaks(run: Path, job: Job) -> bytes:
    """After the swap: the job's later lines keep arriving in the copy (the observer read on,
    through the file the job holds), and no byte of root's file is anywhere in the run folder;
    whichever comes first is looked at, so a leak fails here, not on a timeout."""
    swapped_at = last_tick(copy(run))
    data = wait_for(lambda: (d := copy(run)) and (leaked(d) or last_tick(d) >= swapped_at + 15) and d, 30,
                    interval=0.2, message="the job's lines written after the swap, in the copy")
    assert not leaked(data), leaked(data)
    for path in every_file(run):
        assert SECRET not in path.read_bytes(), f"root's secret is in {path}"
    assert job.poll() is None, "the job goes on"
    # the observer still writes its own record (never stalled on what the path names now)
    rec = json.loads((run / "status" / "launcher.json").read_text())
    wait_for(lambda: json.loads((run / "status" / "launcher.json").read_text())["heartbeat_at"] > rec["heartbeat_at"],
             10, interval=0.2, message="the observer's heartbeat moving on")
    return data


def no_wider_than_the_source(run: Path, source_mode: int = 0o600) -> None:
    """The run folder is root's alone; the copy no more readable than the job's own file."""
    assert stat.S_IMODE(run.stat().st_mode) & 0o077 == 0, oct(run.stat().st_mode)
    for path in (run / "logs").glob("job.log*"):
        assert stat.S_IMODE(path.stat().st_mode) & ~source_mode == 0, (path, oct(path.stat().st_mode))


def swapped(procs, home: Path, log: Path, swap: str) -> tuple[Path, bytes]:
    """nobody's job attached by root, its log copied; then ``swap`` (a shell line) run by
    nobody in their folder. The observer reads on and leaks nothing; the run's files are no
    wider than the job's log. The run folder, and the copy."""
    job = start_job(procs, home, log)
    run = attach(job.pid)
    wait_for(lambda: last_tick(copy(run)) >= 0, 30, message="the log copied")
    as_nobody(home, "sh", "-c", swap)
    data = keeps_reading_and_never_leaks(run, job)
    no_wider_than_the_source(run)
    return run, data


@pytest.mark.slow
def test_the_log_swapped_for_a_link_to_a_root_only_file_is_never_followed(runs_root, procs, home, secret):
    run, _ = swapped(procs, home, home / "train.log", f"mv train.log train.old && ln -s {secret} train.log")
    moved = wait_for(lambda: events(run, "attach.log_moved"), 10, message="the swap said")
    assert len(moved) == 1 and str(secret) in moved[0]["now"], moved
    attached = json.loads((run / "run.json").read_text())["attached"]
    assert attached["private"] is True and attached["log_file"]["owner"] == NOBODY
    assert attached["log_cap"] == 64 << 20  # the default cap, recorded


@pytest.mark.slow
def test_the_log_swapped_for_a_fifo_neither_stalls_nor_stops_the_copy(runs_root, procs, home):
    run, _ = swapped(procs, home, home / "train.log", "rm train.log && mkfifo -m 600 train.log")
    assert [e["now"] for e in events(run, "attach.log_moved")] == ["a FIFO"]


@pytest.mark.slow
def test_the_log_swapped_for_a_link_to_dev_zero_copies_no_zero(runs_root, procs, home):
    _, data = swapped(procs, home, home / "train.log", "rm train.log && ln -s /dev/zero train.log")
    assert b"\0" not in data and len(data) < 64 << 10, len(data)


@pytest.mark.slow
def test_a_1_tb_sparse_log_is_skipped_not_copied(runs_root, procs, home):
    # the job appends after the hole (its stdout is O_APPEND)
    run, _ = swapped(procs, home, home / "train.log", "truncate -s 1T train.log")
    assert (home / "train.log").stat().st_size >= 1 << 40
    total = sum(p.stat().st_size for p in (run / "logs").iterdir())
    assert total < 1 << 20, total  # the hole is skipped, never copied as zeros
    skipped = events(run, "attach.log_skipped")
    assert len(skipped) == 1 and skipped[0]["bytes"] > 1 << 39, skipped


@pytest.mark.slow
def test_a_log_in_a_folder_its_owner_renames_is_read_through_the_job_not_the_path(runs_root, procs, home, secret):
    (home / "out").mkdir()
    os.chown(home / "out", NOBODY, NOBODY)
    run, _ = swapped(procs, home, home / "out" / "train.log",
                     f"mv out out.old && mkdir out && ln -s {secret} out/train.log")
    assert len(events(run, "attach.log_moved")) == 1


@pytest.mark.slow
def test_a_job_that_turns_its_stdout_to_another_file_is_said_once_and_that_file_not_read(runs_root, procs, home):
    job = start_job(procs, home, home / "train.log", REOPENS)
    run = attach(job.pid)
    changed = wait_for(lambda: events(run, "attach.log_changed"), 30, message="the change said")
    assert changed[0]["pid"] == job.pid and changed[0]["fd"] == 1, changed
    wait_for(lambda: last_tick((home / "other.log").read_bytes()) >= 45, 30, message="the job's lines in its new file")
    assert last_tick(copy(run)) == 29, copy(run)[-100:]  # what it wrote to the proven file, and nothing after
    assert len(events(run, "attach.log_changed")) == 1
    assert job.poll() is None


def test_a_log_file_of_roots_handed_to_the_jobs_stdout_is_not_read(runs_root, procs, home, secret):
    """``sudo -u nobody job >> /root/secret.txt``: the job writes into a file of root's that its
    owner cannot read; what was there before (and since) never reaches the run."""
    job = start_job(procs, home, secret, owner=0)
    run = attach(job.pid)
    wait_for(lambda: events(run, "attach.log_refused") or SECRET in copy(run), 30, message="the refusal said")
    assert SECRET not in copy(run), "root's secret was copied into the run's log"
    refused = events(run, "attach.log_refused")
    assert "uid 0" in refused[0]["reason"], refused
    wait_for(lambda: json.loads((run / "status" / "rank-0.json").read_text()), 30, message="the rank watched all the same")
    for path in every_file(run):
        assert SECRET not in path.read_bytes(), f"root's secret is in {path}"


@pytest.mark.slow
def test_a_writer_without_end_fills_no_more_than_the_cap(runs_root, procs, home):
    log = home / "train.log"
    job = start_job(procs, home, log, FLOOD)
    run = attach(job.pid, "--log-cap", "1")
    wait_for(lambda: events(run, "attach.log_rotated") and log.stat().st_size >= 60 * 67_000, 60, interval=0.2,
             message="the copy rotated, the job's log past 4 MB")
    wait_for(lambda: b"flood 999 " in (run / "logs" / "job.log").read_bytes()[-200:], 30, interval=0.2,
             message="the copy caught up with the job")
    assert job.poll() is None
    sizes = {p.name: p.stat().st_size for p in (run / "logs").iterdir()}
    assert set(sizes) == {"job.log", "job.log.1", "launcher.log"}, sizes
    assert sizes["job.log"] <= 1 << 20 and sizes["job.log.1"] <= 1 << 20, sizes
    assert json.loads((run / "run.json").read_text())["attached"]["log_cap"] == 1 << 20
    no_wider_than_the_source(run)


def test_the_copy_is_never_wider_than_its_source_as_its_owner_narrows_it(runs_root, procs, home):
    job = start_job(procs, home, home / "train.log", mode=0o644)
    run = attach(job.pid)
    out = run / "logs" / "job.log"
    wait_for(lambda: last_tick(copy(run)) >= 0, 30, message="the log copied")
    assert stat.S_IMODE(out.stat().st_mode) == 0o644  # others could read the job's file: the copy too
    as_nobody(home, "chmod", "600", "train.log")
    wait_for(lambda: stat.S_IMODE(out.stat().st_mode) == 0o600, 10, interval=0.2, message="the copy narrowed too")


def test_shared_on_request_the_copy_still_no_wider_and_others_see_a_private_run_closed(runs_root, procs, home, tmp_path):
    """--share leaves the run folder readable (0755) while the copy stays 0600; without it, a
    user listing the runs folder sees the private run as a row saying whose it is, no traceback."""
    first = start_job(procs, home, home / "a.log")
    second = start_job(procs, home, home / "b.log")
    private = attach(first.pid)
    shared = attach(second.pid, "--share")
    wait_for(lambda: last_tick(copy(shared)) >= 0, 30, message="the shared run's copy")
    assert stat.S_IMODE(shared.stat().st_mode) == 0o755
    assert stat.S_IMODE((shared / "logs" / "job.log").stat().st_mode) == 0o600
    assert json.loads((shared / "run.json").read_text())["attached"]["private"] is False
    # ups.runs's list as another user sees it (modules imported first: this Python is under root's home)
    code = ("import os, sys; from ups.runs.rundir import list_runs; os.setgid(65534); os.setuid(65534); "
            "print(*[f'{s.path.name} {s.problem}' for s in list_runs(sys.argv[1])], sep='\\n')")
    res = subprocess.run([sys.executable, "-c", code, str(runs_root)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    rows = dict(line.split(" ", 1) for line in res.stdout.splitlines())
    assert rows[private.name].startswith("not readable by you (a folder of root"), rows
    assert rows[shared.name] == "None", rows


def test_inject_into_another_users_job_is_refused_in_one_line_and_the_job_attached(runs_root, procs, home):
    job = start_job(procs, home, home / "train.log")
    res = run_ups("attach", str(job.pid), "--inject")
    assert res.returncode == 0, res.stderr
    assert "runs as another user (uid 65534)" in res.stdout + res.stderr, res.stdout + res.stderr
    assert "Traceback" not in res.stderr
