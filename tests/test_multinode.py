"""One run across nodes: two real torchrun agents (c10d rendezvous on 127.0.0.1), each started
by its own `ups launch torchrun --nnodes 2 --node-rank R`, with distinct host names
(UPS_HOSTNAME) as two boxes would have. One node is then lost (its ranks, agent and
launcher SIGKILLed): what a user checks is `ups status` (every rank of every node, grouped
by node; the lost node named unreachable, not its ranks dead or unresponsive) and the
run's merged state (failed, naming the node).
"""

from __future__ import annotations

import json
import os
import signal
import socket
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


def launch_node(runs_dir: Path, rank: int, port: int, run_id: str, cwd: Path, *, extra_env: dict | None = None):
    env = {**NODE_ENV, "UPS_HOSTNAME": f"node{rank}", "UPS_RUNS_DIR": str(runs_dir), **(extra_env or {})}
    res = run_ups("launch", "torchrun", "--run-id", run_id, "--unresponsive-after", "3", "--detach", "--json",
                  "--nnodes", "2", "--node-rank", str(rank), "--rdzv-backend", "c10d",
                  "--rdzv-endpoint", f"127.0.0.1:{port}", "--nproc-per-node", "1",
                  DDP, "--steps", "100000", "--workers", "0", "--step-time", "0.05", env=env, cwd=cwd)
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
    shared = json.loads(run.manifest_path.read_text())
    assert shared["multinode"]["nnodes"] == 2 and "launcher" not in shared  # per-node keys live in nodes/
    text = run_ups("status", str(run.path), "--wide")
    assert "node node0" in text.stdout and "node node1" in text.stdout and "launcher@node1" in text.stdout

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
