"""One run across nodes: two real torchrun agents (c10d rendezvous on 127.0.0.1), each started
by its own `ups launch torchrun --nnodes 2 --node-rank R`, with distinct host names
(UPS_HOSTNAME) as two boxes would have. One node is then lost (its ranks, agent and
launcher SIGKILLed): what a user checks is `ups status` (every rank of every node, grouped
by node; the lost node named unreachable, not its ranks dead or unresponsive) and the
run's merged state (failed, naming the node).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
from pathlib import Path

import pytest
from helpers import run_ups, wait_for

from ups.runs.rundir import RunDir
from ups.status.procs import process_start_time, same_start
from ups.status.reader import read_status_dir

DDP = str(Path(__file__).parent / "programs" / "ddp_train.py")
NODE_ENV = {"UPS_HEARTBEAT_INTERVAL": "0.3"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_node(runs_dir: Path, rank: int, port: int, run_id: str, cwd: Path, *, extra_env: dict | None = None,
                args: tuple[str, ...] = ()):
    """Node ``rank`` of a two-node run. c10d's rendezvous ignores --node-rank: it ranks the nodes
    by (address, agent pid), and on one box the pid alone decides, which wraps (pid_max 32768)
    on a busy CI box. Each node gets its own loopback address (--local-addr 127.0.0.R+1), as two
    boxes have their own, so node R holds global rank R."""
    env = {**NODE_ENV, "UPS_HOSTNAME": f"node{rank}", "UPS_RUNS_DIR": str(runs_dir), **(extra_env or {})}
    res = run_ups("launch", "torchrun", "--run-id", run_id, "--unresponsive-after", "3", "--detach", "--json",
                  "--nnodes", "2", "--node-rank", str(rank), "--rdzv-backend", "c10d",
                  "--rdzv-endpoint", f"127.0.0.1:{port}", "--nproc-per-node", "1", "--local-addr", f"127.0.0.{rank + 1}",
                  DDP, "--steps", "100000", "--workers", "0", "--step-time", "0.05", *args, env=env, cwd=cwd)
    assert res.returncode == 0, res.stderr
    return RunDir(json.loads(res.stdout)["run_dir"])


def kill_node(run: RunDir, host: str) -> list[str]:
    """The node is lost: SIGKILL every process its records name (ranks, agent, launcher)."""
    killed = []
    for rec in read_status_dir(run.status_dir).records:
        if rec.host == host and same_start(process_start_time(rec.pid), rec.pid_start):
            os.kill(rec.pid, signal.SIGKILL)
            killed.append(rec.name)
    return killed


def kill_everything(*runs: RunDir) -> None:
    """Teardown: no process of these runs may outlive the test (the runs are not this host's
    to `ups kill`: their nodes have other names)."""
    for run in runs:
        pids = [(r.pid, r.pid_start) for r in read_status_dir(run.status_dir).records]
        for node in run.read_nodes().values():
            launcher = node.get("launcher") or {}
            pids.append((launcher.get("pid"), launcher.get("pid_start")))
        for pid, start in pids:
            if pid and same_start(process_start_time(pid), start):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


async def console_rows(runs_dir: Path, run_id: str) -> list[str]:
    """The keys of the console's process table on the run's screen: nodes head their groups."""
    from console.app import UpsConsole

    app = UpsConsole(runs_dir, run_id=run_id, poll=False, gpu_provider=None)
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.pause(0.2)
        keys = app.screen.query_one("#ranks").row_keys
    assert keys.index("node:node1") < keys.index("rank-1") and keys.index("rank-0") < keys.index("node:node1"), keys
    return keys


def status_json(run_ref: str, *args: str, env: dict | None = None) -> dict:
    res = run_ups("status", run_ref, "--json", *args, env=env)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def training(data: dict) -> bool:
    procs = {p["name"]: p for p in data["processes"]}
    ranks = [procs.get(f"rank-{r}") for r in (0, 1)]
    return all(r and r["step"] > 2 and r["health"] == "ok" for r in ranks) and len(data["nodes"]) == 2


@pytest.fixture
def shared_run(tmp_path):
    runs = tmp_path / "shared-runs"
    port = free_port()
    run = launch_node(runs, 0, port, "exp-a", tmp_path)
    # node0 first: its agent hosts the rendezvous store, as the endpoint's host does on a cluster
    wait_for(lambda: (run.status_dir / "agent@node0.json").exists(), 20, message="node0's agent record")
    launch_node(runs, 1, port, "exp-a", tmp_path)
    yield run
    kill_everything(run)


@pytest.mark.slow
def test_shared_runs_dir_one_run_every_node_then_a_lost_node(shared_run):
    run = shared_run
    data = wait_for(lambda: (d := status_json(str(run.path))) and training(d) and d, 45, interval=0.3,
                    message="both nodes' ranks training")
    procs = {p["name"]: p for p in data["processes"]}
    # one run, named so that nothing collides: a launcher and an agent per node, global ranks
    assert {"launcher@node0", "launcher@node1", "agent@node0", "agent@node1", "rank-0", "rank-1"} <= set(procs)
    assert (procs["rank-0"]["host"], procs["rank-1"]["host"]) == ("node0", "node1")
    assert [(n["host"], n["node_rank"], n["state"], n["reachable"]) for n in data["nodes"]] == [
        ("node0", 0, "running", True), ("node1", 1, "running", True)]
    assert sorted(p.name for p in run.nodes_dir.iterdir()) == ["node0.json", "node1.json"]
    command = run.read_nodes()["node1"]["command"]  # torchrun's rendezvous id is the run's (none was given)
    assert command[command.index("--rdzv-id") + 1] == "exp-a"
    shared = json.loads(run.manifest_path.read_text())
    assert shared["multinode"]["nnodes"] == 2 and "launcher" not in shared  # per-node keys live in nodes/
    text = run_ups("status", str(run.path), "--wide")
    assert "node node0" in text.stdout and "node node1" in text.stdout and "launcher@node1" in text.stdout
    assert asyncio.run(console_rows(run.path.parent, "exp-a"))[:2] == ["node:node0", "rank-0"]

    assert sorted(kill_node(run, "node1")) == ["agent@node1", "launcher@node1", "rank-1"]

    def ended(d: dict) -> bool:
        return d["state"] == "failed" and d["run"]["state"] == "failed"

    data = wait_for(lambda: (d := status_json(str(run.path))) and ended(d) and d, 40, interval=0.3,
                    message="the run to end failed")
    nodes = {n["host"]: n for n in data["nodes"]}
    assert nodes["node1"]["health"] == "unreachable" and not nodes["node1"]["reachable"]
    assert nodes["node0"]["state"] == "failed"  # its ranks lost their peer; its launcher ended its node
    lost = [p for p in data["processes"] if p["host"] == "node1"]
    assert lost and all(p["health"] == "unreachable" for p in lost)  # the node, not 3 dead/unresponsive ranks
    assert data["run"]["summary"].startswith("node node1 unreachable")
    assert data["run"]["failure"]["node"] == "node1" and "node1" in data["run"]["unreachable_nodes"]
    # every reader says the same: `ups runs` and a reader on the surviving node
    runs = run_ups("runs", "--json", "--runs-dir", str(run.path.parent))
    row = next(r for r in json.loads(runs.stdout)["runs"] if r["id"] == "exp-a")
    assert row["state"] == "failed" and "node node1 unreachable" in row["summary"]
    on_node0 = status_json(str(run.path), env={"UPS_HOSTNAME": "node0"})
    assert on_node0["state"] == "failed" and on_node0["run"]["summary"].startswith("node node1 unreachable")
    text = run_ups("status", str(run.path), "--wide").stdout
    assert "node node1 unreachable" in text
    why = json.loads(run_ups("why", str(run.path), "--json").stdout)["verdict"]
    assert why["mode"] == "node_unreachable" and why["headline"].startswith("node node1 is unreachable")


# ------------------------------------------------------------------ no shared folder: SSH
@pytest.fixture
def sshd(tmp_path):
    """A real sshd on 127.0.0.1 (a free port), a throwaway host key and user key: `ssh
    127.0.0.1 CMD` works as it does between two boxes. The environment for ups: UPS_SSH."""
    import shutil
    import subprocess

    sshd_bin = shutil.which("sshd") or ("/usr/sbin/sshd" if Path("/usr/sbin/sshd").exists() else None)
    if sshd_bin is None or shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
        pytest.skip("needs openssh-server and openssh-client (sshd, ssh, ssh-keygen): apt-get install openssh-server")
    d = tmp_path / "sshd"
    d.mkdir()
    for key in ("host_key", "user_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / key)], check=True)
    (d / "authorized_keys").write_text((d / "user_key.pub").read_text())
    port = free_port()
    config = d / "sshd_config"
    config.write_text(f"""Port {port}
ListenAddress 127.0.0.1
HostKey {d / 'host_key'}
AuthorizedKeysFile {d / 'authorized_keys'}
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
StrictModes no
UsePAM no
PidFile {d / 'sshd.pid'}
LogLevel ERROR
""")
    try:
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # sshd's privilege-separation folder (as root)
    except OSError:
        pass  # not root: sshd runs unprivileged for this user, without it
    proc = subprocess.Popen([sshd_bin, "-D", "-e", "-f", str(config)], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=open(d / "sshd.log", "wb"))
    ssh = (f"ssh -i {d / 'user_key'} -p {port} -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null "
           "-o LogLevel=ERROR")

    def answers() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"sshd exited: {(d / 'sshd.log').read_text()[-500:]}")
        return subprocess.run([*ssh.split(), "-o", "BatchMode=yes", "127.0.0.1", "true"], capture_output=True,
                              timeout=10).returncode == 0

    try:
        wait_for(answers, 15, interval=0.2, message="sshd to accept a login")
        yield ssh
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.mark.slow
def test_two_runs_dirs_read_over_ssh_then_a_lost_node(tmp_path, sshd, monkeypatch):
    import subprocess

    from console.snapshots import Poller
    from ups.runs.remote import RemoteSpec

    a, b = tmp_path / "node0-runs", tmp_path / "node1-runs"
    port = free_port()
    run0 = launch_node(a, 0, port, "exp-b", tmp_path)
    wait_for(lambda: (run0.status_dir / "agent@node0.json").exists(), 20, message="node0's agent record")
    run1 = launch_node(b, 1, port, "exp-b", tmp_path)
    try:
        # This shell is node0's; node1 is reached over ssh, where `ups` is this checkout's.
        remote_ups = f"env UPS_HOSTNAME=node1 PYTHONPATH={os.environ['PYTHONPATH']} {sys.executable} -m ups"
        env = {"UPS_HOSTNAME": "node0", "UPS_RUNS_DIR": str(a), "UPS_SSH": sshd, "UPS_REMOTE_UPS": remote_ups}
        node1 = f"127.0.0.1:{b}"
        data = wait_for(lambda: (d := status_json("exp-b", "--remote", node1, env=env)) and training(d) and d, 45,
                        interval=0.3, message="both nodes' ranks training, node1's over ssh")
        assert [(n["host"], n["state"], n["reachable"]) for n in data["nodes"]] == [
            ("node0", "running", True), ("node1", "running", True)]
        procs = {p["name"]: p for p in data["processes"]}
        assert (procs["rank-0"]["host"], procs["rank-1"]["host"]) == ("node0", "node1")
        assert {"launcher@node0", "launcher@node1", "agent@node1"} <= set(procs)
        assert data["remotes"] == [{"remote": node1, "host": "node1", "status": "ok", "reason": ""}]

        # The console on node0 with --remote: node1's processes under node1, read in a thread.
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        poller = Poller(a, gpu_provider=None, remotes=[RemoteSpec.parse(node1)])
        try:
            def grouped():
                view = poller.snapshot("exp-b", None).detail.view
                return [(n.host, n.reachable) for n in view.nodes] == [("node0", True), ("node1", True)] and \
                    view.process("rank-1") is not None and view
            view = wait_for(grouped, 20, interval=0.2, message="the console's view of both nodes")
            assert view.process("rank-1").record.host == "node1" and view.process("rank-1").verdict.health.value == "ok"
        finally:
            poller.close()

        # The stream itself: NDJSON, one snapshot a line, node1's records judged on node1.
        stream = subprocess.Popen([*sshd.split(), "127.0.0.1", f"{remote_ups} status exp-b --json --follow "
                                   f"--interval 0.3 --runs-dir {b}"], stdout=subprocess.PIPE, text=True)
        lines = [json.loads(stream.stdout.readline()) for _ in range(2)]
        stream.terminate()
        stream.wait(timeout=10)
        assert all(ln["host"] == "node1" and {r["host"] for r in ln["records"]} == {"node1"} for ln in lines)

        # Actions go over the same ssh to node1's ups.
        stacks = run_ups("stacks", "exp-b", "--rank", "1", "--remote", node1, env=env)
        assert stacks.returncode == 0, stacks.stderr
        assert "--- rank 1" in stacks.stdout and "(most recent call first)" in stacks.stdout

        # A node that cannot be reached is shown as such, never as dead ranks.
        cut = status_json("exp-b", "--remote", f"127.0.0.2:{b}", "--remote-timeout", "5", env=env)
        nodes = {n["host"]: n for n in cut["nodes"]}
        assert nodes["127.0.0.2"]["health"] == "unreachable" and "127.0.0.2" in nodes["127.0.0.2"]["reason"]
        assert nodes["node0"]["reachable"] and cut["state"] == "running"
        assert not any(p["health"] == "dead" for p in cut["processes"])

        assert sorted(kill_node(run1, "node1")) == ["agent@node1", "launcher@node1", "rank-1"]

        def ended(d: dict) -> bool:
            return d["state"] == "failed" and {n["host"]: n["state"] for n in d["nodes"]}.get("node1") in FINAL

        data = wait_for(lambda: (d := status_json("exp-b", "--remote", node1, env=env)) and ended(d) and d, 40,
                        interval=0.3, message="the run to end failed, node1 settled")
        nodes = {n["host"]: n for n in data["nodes"]}
        assert nodes["node0"]["state"] == "failed"
        assert "node node1" in data["run"]["summary"] and "node1" in data["run"]["failed_nodes"]
        text = run_ups("status", "exp-b", "--remote", node1, "--wide", env=env).stdout
        assert "node node0 (here)" in text and "node node1" in text
    finally:
        kill_everything(run0, run1)


FINAL = ("succeeded", "partial", "failed", "killed", "lost")

# Where ddp_train.py's rank sleeps for --fail sleep.
SLEEP_SITE = "ddp_train.py:" + str(next(n for n, line in enumerate(Path(DDP).read_text().splitlines(), 1)
                                         if "time.sleep(0.5)" in line))


@pytest.mark.slow
def test_a_rank_stuck_on_another_node_is_named_with_its_line_over_ssh(tmp_path, sshd):
    """No shared folder: rank 1 sleeps in its own code on node1; node1's launcher dumps its stack
    into node1's folder; `ups why --remote` on node0 names it with its file:line."""
    a, b = tmp_path / "node0-runs", tmp_path / "node1-runs"
    port = free_port()
    fail = ("--fail", "sleep", "--fail-step", "20")
    run0 = launch_node(a, 0, port, "exp-c", tmp_path, args=fail)
    wait_for(lambda: (run0.status_dir / "agent@node0.json").exists(), 20, message="node0's agent record")
    run1 = launch_node(b, 1, port, "exp-c", tmp_path, args=fail)
    try:
        remote_ups = f"env UPS_HOSTNAME=node1 PYTHONPATH={os.environ['PYTHONPATH']} {sys.executable} -m ups"
        env = {"UPS_HOSTNAME": "node0", "UPS_RUNS_DIR": str(a), "UPS_SSH": sshd, "UPS_REMOTE_UPS": remote_ups}

        def named():  # once node1's launcher has dumped its stalled rank's stack
            res = run_ups("why", "exp-c", "--remote", f"127.0.0.1:{b}", "--json", env=env)
            v = json.loads(res.stdout)["verdict"] if res.stdout.strip() else {}
            return v.get("mode") == "rank_stuck_peers_wait" and (v.get("where") or {}).get("site") and v

        v = wait_for(named, 90, interval=1.0, message="ups why on node0 to name rank 1 on node1 with its line")
        assert (v["who"]["rank"], v["who"]["host"]) == (1, "node1") and v["where"]["site"] == SLEEP_SITE, v
        assert "rank 0 waits for it" in v["headline"], v["headline"]
        assert (b / "exp-c" / "stacks" / "rank-1.txt").is_file() and not (a / "exp-c" / "stacks" / "rank-1.txt").exists()
    finally:
        kill_everything(run0, run1)


# ------------------------------------------------------------- bad input, merging rules
@pytest.mark.parametrize(("args", "says"), [
    (["launch", "torchrun", "--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:1", "s.py"],
     "needs the same run id on every node"),
    (["launch", "torchrun", "--run-id", "x", "--nnodes", "2", "s.py"], "needs a rendezvous"),
    (["launch", "torchrun", "--run-id", "a/b", "--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:1", "s.py"],
     "letters, digits"),
    (["status", "--follow"], "add --json"),
    (["status", "x", "--remote", "-x"], "expected HOST or HOST:RUNS_DIR"),
])
def test_multinode_bad_input_is_one_line(tmp_path, args, says):
    (tmp_path / "s.py").write_text("")
    (tmp_path / "runs").mkdir()
    res = run_ups(*args, env={"UPS_RUNS_DIR": str(tmp_path / "runs")}, cwd=tmp_path)
    assert res.returncode == 2 and says in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert not any((tmp_path / "runs").iterdir())


def test_node_manifests_merge_and_a_node_joins_once(tmp_path, monkeypatch):
    from ups.errors import UpsError
    from ups.runs.rundir import merge_node_states

    monkeypatch.setenv("UPS_HOSTNAME", "node0")
    run = RunDir.create(tmp_path, "torchrun", run_id="exp-c", multinode={"nnodes": 2, "node_rank": 0})
    monkeypatch.setenv("UPS_HOSTNAME", "node1")
    assert RunDir.create(tmp_path, "torchrun", run_id="exp-c", multinode={"nnodes": 2, "node_rank": 1}) == run
    with pytest.raises(UpsError, match="node node1 has already joined run exp-c"):
        RunDir.create(tmp_path, "torchrun", run_id="exp-c", multinode={"nnodes": 2, "node_rank": 1})
    run.set_state("running")
    assert run.read_manifest()["state"] == "running" and set(run.read_nodes()) == {"node0", "node1"}
    run.set_state("succeeded", summary="ok")  # node1's own manifest: node0 still runs
    m = run.read_manifest()
    assert m["state"] == "running" and m["nodes"]["node1"]["state"] == "succeeded"  # node0 has not ended
    monkeypatch.setenv("UPS_HOSTNAME", "node0")
    run.set_state("failed", summary="rank 0 failed", failure={"name": "rank-0", "rank": 0})
    m = run.read_manifest()
    assert (m["state"], m["failed_nodes"], m["failure"]["node"]) == ("failed", ["node0"], "node0")
    assert m["summary"] == "node node0 failed: rank 0 failed"
    assert json.loads(run.manifest_path.read_text())["state"] == "running"  # run.json: only what all nodes share
    assert merge_node_states({"a": {"state": "succeeded"}, "b": {"state": "succeeded"}})["state"] == "succeeded"
    assert merge_node_states({"a": {"state": "killed"}, "b": {"state": "failed"}})["state"] == "killed"
    monkeypatch.setenv("UPS_HOSTNAME", "elsewhere")  # a host that is no node of the run cannot write its state
    with pytest.raises(UpsError, match="elsewhere is not a node of multi-node run exp-c"):
        run.set_state("killed")


def test_a_nodes_stream_sends_a_stack_file_when_it_changes_from_its_latest_section_on(tmp_path):
    """What `ups status --follow` sends a reader on another node of a stack file: its latest
    section (not the whole file), and again only once the file changed."""
    from ups.runs.payload import stream_payload
    from ups.runs.read import open_run
    from ups.status.procs import this_process_start
    from ups.status.record import StatusRecord

    run = RunDir.create(tmp_path, "torchrun", run_id="exp-s")
    rec = StatusRecord(run_id="exp-s", role="rank", name="rank-1", pid=os.getpid(), pid_start=this_process_start(),
                       host="node1", rank=1, stack_file="stacks/rank-1.txt")
    run.write_file("status/rank-1.json", rec.to_json().encode())
    old = "=== stack dump of rank 1 pid 7 requested by launcher at 10:00:00 ===\nCurrent thread 0x1 (most recent call first):\n"
    new = old.replace("10:00:00", "10:00:10") + '  File "train.py", line 42 in wait_for_the_answer\n'
    (run.path / "stacks" / "rank-1.txt").write_text(old * 50 + new)
    sent: dict = {}
    assert stream_payload(open_run(run), sent)["stacks"] == {"rank-1": new}
    assert stream_payload(open_run(run), sent)["stacks"] == {}  # unchanged: not sent again
    with open(run.path / "stacks" / "rank-1.txt", "a") as f:
        f.write(new.replace("line 42", "line 43"))
    assert stream_payload(open_run(run), sent)["stacks"] == {"rank-1": new.replace("line 42", "line 43")}


@pytest.mark.slow
def test_launch_train_on_two_nodes_succeeds_as_one_run(tmp_path):
    """Our own train job, across two nodes into a shared runs folder: one run, both nodes
    end succeeded, each node's launcher judging its own ranks."""
    import subprocess

    from ups.data.synth import synthesize
    from ups.faults import Faults
    from ups.jobs import precompute as pre
    from ups.launch.config import PrecomputeConfig
    from ups.status.reporter import NullReporter

    synthesize(tmp_path / "data", "burgers1d", "train", 8, seed=2, timesteps=4, resolution=16)
    config = tmp_path / "quick.yaml"
    config.write_text("batch_size: 4\nhidden: 16\ncheckpoint_every: 100\nlog_every: 5\nwandb_mode: disabled\n"
                      "heartbeat_interval: 0.3\n")
    cfg = PrecomputeConfig(root=str(tmp_path / "data"), tasks=["burgers1d"], cache_dir=str(tmp_path / "cache"),
                           num_workers=0, device="cpu").validate()
    pre.PrecomputeJob(cfg, NullReporter(), Faults()).execute()
    runs, port = tmp_path / "runs", free_port()

    def node(rank: int):
        return subprocess.Popen(
            [sys.executable, "-m", "ups", "launch", "train", "--run-id", "exp-t", "--nnodes", "2", "--node-rank", str(rank),
             "--rdzv-endpoint", f"127.0.0.1:{port}", "--nproc", "1", "--cache-dir", str(tmp_path / "cache"),
             "--tasks", "burgers1d", "--steps", "4", "--config", str(config), "--detach", "--json"],
            env={**os.environ, **NODE_ENV, "UPS_HOSTNAME": f"node{rank}", "UPS_RUNS_DIR": str(runs)},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    launches = [node(0), node(1)]  # both nodes at once, as a cluster's scheduler starts them
    outs = [p.communicate(timeout=60) for p in launches]
    assert all(p.returncode == 0 for p in launches), [err for _, err in outs]
    run = RunDir(json.loads(outs[0][0])["run_dir"])
    assert json.loads(outs[1][0])["run_dir"] == str(run.path)
    try:
        data = wait_for(lambda: (d := status_json(str(run.path))) and d["state"] not in ("launching", "running") and d,
                        90, interval=0.5, message="the train run to end")
        assert data["state"] == "succeeded", data["run"].get("summary")
        assert data["run"]["summary"] == "every node (2) succeeded"
        assert [(n["host"], n["state"]) for n in data["nodes"]] == [("node0", "succeeded"), ("node1", "succeeded")]
        procs = {p["name"]: p for p in data["processes"]}
        assert (procs["rank-0"]["step"], procs["rank-1"]["step"], procs["rank-1"]["world_size"]) == (4, 4, 2)
        command = run.read_nodes()["node1"]["command"]
        assert command[command.index("--rdzv-id") + 1] == "exp-t" and command[command.index("--node-rank") + 1] == "1"
    finally:
        kill_everything(run)
