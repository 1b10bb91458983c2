"""Writing into a shared runs folder never goes through another user's link, nor into their
folder (issue 40).

As root, in a 1777 folder, with the box's ``fs.protected_symlinks`` as it is, a real second user
(nobody, uid 65534, through ``setpriv``) plants links and folders where ``ups`` will write:

1. ``runs/exp7`` is their link to a folder of root's, and a node joins run exp7;
2. ``runs/theirs`` is their folder, and a node joins run theirs;
3. the working folder is 1777 and ``./runs`` is their link: a plain ``ups launch`` uses it;
4. ``runs/exp9`` is root's but mode 0777, and they planted a link on ``events.jsonl``,
   ``stacks`` or ``logs`` in it: a node joins run exp9.

Each is refused in one line that says whose link or folder it is (and where the link points)
before anything is written, and no folder outside the run folder changes: every folder a link
could reach is hashed before and after. The rightful uses go on: a link of your own (or of the
folder's owner) is followed as the kernel's rule allows, and two nodes of one user join a run.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import run_ups
from test_hostile_signals import one_line_refusal

from ups.errors import Refused
from ups.runs.rundir import RunDir

NOBODY = 65534
THEM = f"nobody (uid {NOBODY})"
JOIN = ["--nnodes", "2", "--node-rank", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:29499"]


def as_nobody(cwd: Path, *cmd: str) -> None:
    """Run ``cmd`` as uid 65534 in ``cwd`` (entered as root first: the test's own folders above
    it stay closed to that user, who works with names relative to it)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to act as a second user")
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv is not installed (util-linux)")
    subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *cmd], cwd=cwd,
                   check=True, capture_output=True, timeout=30)


def fingerprint(*folders: Path) -> dict[str, tuple]:
    """Every entry under the folders (the folders too): kind, mode, owner, and the content's
    hash or the link's target. Links are listed, never followed."""
    out: dict[str, tuple] = {}
    for top in folders:
        for dirpath, dirnames, filenames in os.walk(top):
            for name in [".", *dirnames, *filenames]:
                path = os.path.join(dirpath, name)
                st = os.lstat(path)
                if stat.S_ISLNK(st.st_mode):
                    body = os.readlink(path)
                elif stat.S_ISREG(st.st_mode):
                    body = hashlib.sha256(Path(path).read_bytes()).hexdigest()
                else:
                    body = None
                out[os.path.normpath(path)] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_uid, body)
    return out


def sticky(folder: Path, owner: int | None = None) -> Path:
    """A folder anyone can write, mode 1777 (like /tmp), root's or ``owner``'s."""
    folder.mkdir()
    if owner is not None:
        os.chown(folder, owner, owner)
    folder.chmod(0o1777)
    return folder


@pytest.fixture
def shared(tmp_path: Path) -> Path:
    """A 1777 runs folder, and a folder of root's (``secret``) a link could point at."""
    runs = sticky(tmp_path / "runs")
    secret = tmp_path / "secret"
    (secret / "logs").mkdir(parents=True)
    (secret / "precious.txt").write_text("precious\n")
    (secret / "events.jsonl").write_text('{"event": "mine"}\n')
    return runs


def join(runs: Path, run_id: str) -> subprocess.CompletedProcess:
    """``ups launch torchrun --run-id ID --nnodes 2 --node-rank 1 ... train.py``, run from the
    folder above ``runs`` (where train.py is)."""
    (runs.parent / "train.py").write_text("print('ran')\n")
    return run_ups("launch", "torchrun", "--run-id", run_id, "--detach", *JOIN, "train.py", cwd=runs.parent,
                   env={"UPS_RUNS_DIR": str(runs)})


def test_joining_through_a_link_another_user_planted_is_refused(shared, tmp_path):
    secret = tmp_path / "secret"
    as_nobody(shared, "ln", "-s", str(secret), "exp7")
    before = fingerprint(secret, shared)
    res = join(shared, "exp7")
    one_line_refusal(res, f"exp7 is a link of {THEM} to '{secret}'", "nothing written")
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert fingerprint(secret, shared) == before


def test_joining_another_users_folder_writes_nothing_in_it(shared, tmp_path):
    as_nobody(shared, "mkdir", "-m", "755", "theirs")
    as_nobody(shared / "theirs", "ln", "-s", str(tmp_path / "secret"), "stacks")  # theirs to redirect
    before = fingerprint(tmp_path / "secret", shared)
    res = join(shared, "theirs")
    one_line_refusal(res, f"belongs to {THEM}", "not to you", "nothing written")
    assert fingerprint(tmp_path / "secret", shared) == before  # no stacks/, nodes/ nor nodes/<host>.json


def test_a_runs_link_another_user_planted_in_a_shared_working_folder_is_refused(tmp_path):
    work = sticky(tmp_path / "work")
    as_nobody(work, "mkdir", "-m", "777", "their-runs")
    as_nobody(work, "ln", "-s", "their-runs", "runs")
    (work / "loop.py").write_text("print('ran')\n")
    before = fingerprint(work)
    env = {k: v for k, v in os.environ.items() if k != "UPS_RUNS_DIR"}  # the default: ./runs
    res = subprocess.run([sys.executable, "-m", "ups", "launch", "python", "loop.py"], cwd=work, env=env,
                         capture_output=True, text=True, timeout=60)
    one_line_refusal(res, f"{work / 'runs'} is a link of {THEM} to 'their-runs'", "nothing written")
    assert fingerprint(work) == before
    # A run of yours reached through their link (it may be anywhere they point) is not written either.
    mine = RunDir.create(work / "their-runs", "python")
    before = fingerprint(work)
    with pytest.raises(OSError, match=f"is a link of {re.escape(THEM)}"):
        RunDir(work / "runs" / mine.path.name).append_event("probe", actor="test")
    assert fingerprint(work) == before


@pytest.mark.parametrize("planted", ["events.jsonl", "stacks", "logs"])
def test_a_run_folder_of_yours_that_others_can_write_is_not_joined(shared, tmp_path, planted):
    secret = tmp_path / "secret"
    target = secret / ("events.jsonl" if planted == "events.jsonl" else "logs")
    run = shared / "exp9"
    run.mkdir()
    run.chmod(0o777)
    as_nobody(run, "ln", "-s", str(target), planted)
    before = fingerprint(secret, shared)
    with pytest.raises(Refused, match=r"exp9 is writable by other users \(mode 777\).*nothing written"):
        RunDir.create(shared, "torchrun", run_id="exp9", multinode={"nnodes": 2, "node_rank": 1})
    if planted == "stacks":  # and through the command line, once
        res = join(shared, "exp9")
        one_line_refusal(res, "writable by other users (mode 777)")
    assert fingerprint(secret, shared) == before


@pytest.mark.parametrize("planted", ["stacks", "logs/torchrun"])
def test_a_planted_subfolder_of_your_run_is_refused_on_join(shared, tmp_path, monkeypatch, planted):
    """A run folder of yours whose ``stacks/`` another user owns, or where torchrun's log folder
    is their link (each was writable once)."""
    monkeypatch.setenv("UPS_HOSTNAME", "node-a")
    first = RunDir.create(shared, "torchrun", run_id="exp10", multinode={"nnodes": 2, "node_rank": 0})
    if planted == "stacks":
        os.chown(first.stacks_dir, NOBODY, NOBODY)
        refusal = "exp10/stacks belongs to " + re.escape(THEM)
    else:
        (first.logs_dir / "torchrun").symlink_to(tmp_path / "secret" / "logs")
        os.lchown(first.logs_dir / "torchrun", NOBODY, NOBODY)
        refusal = "exp10/logs/torchrun is a link of " + re.escape(THEM)
    before = fingerprint(tmp_path / "secret", shared)
    monkeypatch.setenv("UPS_HOSTNAME", "node-b")
    with pytest.raises(Refused, match=refusal):
        RunDir.create(shared, "torchrun", run_id="exp10", multinode={"nnodes": 2, "node_rank": 1})
    assert fingerprint(tmp_path / "secret", shared) == before


def test_links_the_kernel_rule_allows_are_followed_and_nodes_of_one_user_join(tmp_path, monkeypatch):
    work = sticky(tmp_path / "work")
    mine = tmp_path / "my-runs"
    mine.mkdir()
    (work / "runs").symlink_to(mine)  # root's own link: followed
    run = RunDir.create(work / "runs", "python")
    assert (mine / run.path.name / "run.json").is_file()
    # A link of the sticky folder's owner is followed too (the kernel's rule: fs.protected_symlinks=1).
    theirs = sticky(tmp_path / "theirs", owner=NOBODY)
    as_nobody(theirs, "mkdir", "-m", "1777", "scratch")
    as_nobody(theirs, "ln", "-s", "scratch", "runs")
    assert (theirs / "scratch" / RunDir.create(theirs / "runs", "python").path.name / "run.json").is_file()
    # Two nodes of one user on one shared folder: the second joins the first's run.
    for host, rank in (("node-a", 0), ("node-b", 1)):
        monkeypatch.setenv("UPS_HOSTNAME", host)
        joined = RunDir.create(work / "runs", "torchrun", run_id="exp-two", multinode={"nnodes": 2, "node_rank": rank})
    assert sorted(os.listdir(joined.nodes_dir)) == ["node-a.json", "node-b.json"]


def test_a_process_of_the_job_never_makes_its_folders_through_a_link(shared, tmp_path):
    """The Reporter in every process of a job makes ``status/`` and ``stacks/`` when they are
    missing: a link under either name is refused (no record, no stack file), never followed."""
    run = RunDir.create(shared, "python")
    secret = tmp_path / "secret"
    for sub in ("status", "stacks"):
        os.rmdir(run.path / sub)
        (run.path / sub).symlink_to(secret / "logs")
    before = fingerprint(secret)
    code = ("import signal, sys; from ups.status.reporter import Reporter; "
            "r = Reporter(sys.argv[1], role='rank', rank=0, world_size=1, stack_signal=signal.SIGUSR1); "
            "print(r.flush())")
    res = subprocess.run([sys.executable, "-c", code, str(run.path)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and res.stdout.strip() == "False", res.stdout + res.stderr
    assert "could not register stack dumps" in res.stderr and "stacks is a link of root" in res.stderr, res.stderr
    assert fingerprint(secret) == before
