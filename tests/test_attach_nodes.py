"""`ups attach` on a job of several nodes, and on ranks whose torchrun agent died.

Several nodes: two plain torchrun agents (`--nnodes 2`, c10d rendezvous on 127.0.0.1, one rank
each) stand for two boxes, each attached by its own `ups attach AGENT --run-id ID` with a host
name of its own (UPS_HOSTNAME), into one shared runs folder, as two boxes would with a shared
file system. Orphans: a plain `torchrun --standalone --nproc-per-node 2` whose agent is
SIGKILLed; its ranks (each a session of its own) live on under init, and `ups attach` on one
of them watches both.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from helpers import run_ups, wait_for
from test_attach import PROGRAM, SLEEP_LINE, PlainJobs, idle_rank, needs_pyspy, torchrun
from test_multinode import free_port, sshd  # noqa: F401 - sshd: the fixture

from ups.status.procs import process_start_time, same_start


@pytest.fixture
def jobs(tmp_path):
    j = PlainJobs(tmp_path)
    yield j
    j.cleanup()


def ups_json(*args: str, env: dict | None = None) -> dict:
    res = run_ups(*args, "--json", env=env)
    assert res.returncode in (0, 1), res.stderr
    return json.loads(res.stdout)


def stuck_rank_1(run_id: str, *args: str, env: dict | None = None) -> dict | None:
    v = ups_json("why", run_id, *args, env=env)["verdict"]
    return v if v["mode"] == "rank_stuck_peers_wait" else None


def start_node(jobs: PlainJobs, port: int, name: str) -> tuple[subprocess.Popen, object]:
    """One 'node' of a two-node plain torchrun job (one rank; rank 1 sleeps in its own code at step 3)."""
    log = jobs.tmp / f"{name}.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("UPS_")}
    env["ATTACH_DDP_FAULT"] = "sleep:3"
    with open(log, "wb") as out:
        proc = subprocess.Popen([*torchrun(), "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                                 "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "plain", str(PROGRAM)],
                                stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True, cwd=jobs.tmp)
    jobs.procs.append(proc)
    return proc, log


def stop_observers(run_dir) -> None:
    """Teardown: an observer whose job a failed assertion left running ends with it; make sure."""
    for node in (run_dir / "nodes").glob("*.json") if (run_dir / "nodes").is_dir() else [run_dir / "run.json"]:
        obs = json.loads(node.read_text()).get("launcher") or {}
        if obs.get("pid") and same_start(process_start_time(obs["pid"]), obs.get("pid_start")):
            os.kill(obs["pid"], signal.SIGKILL)


def attach_two_nodes(jobs: PlainJobs, run_id: str, env_of) -> dict[int, tuple[int, dict]]:
    """A two-node plain job whose rank 1 sleeps in its own code, attached on each node (its
    env: ``env_of(node)``) with one --run-id; {node rank: (its agent's pid, its dry-run)}."""
    port = free_port()
    agents = [start_node(jobs, port, "a"), start_node(jobs, port, "b")]
    wait_for(lambda: any("rank 1 waits at step 3" in log.read_text() for _, log in agents), 120, interval=0.3,
             message="rank 1 asleep")
    jobs.remember()
    # Which agent is node 1 is the rendezvous's choice: each node's ranks say (GROUP_RANK).
    found = {}
    for agent, _ in agents:
        job = ups_json("attach", str(agent.pid), "--dry-run")
        assert job["nnodes"] == 2 and job["world_size"] == 2 and len(job["processes"]) == 2, job
        found[job["node_rank"]] = (agent.pid, job)
    assert sorted(found) == [0, 1]
    for node in (0, 1):  # each node's own `ups attach`, with the same --run-id
        res = run_ups("attach", str(found[node][0]), "--run-id", run_id, env=env_of(node))
        assert res.returncode == 0, res.stderr
        assert f"node node{node} (node rank {node} of 2) joined run {run_id}" in res.stdout, res.stdout
    return found


@pytest.mark.slow
@needs_pyspy
def test_two_nodes_attached_with_one_run_id_make_one_run_that_names_the_stuck_rank_on_node_1(runs_root, jobs):
    run_dir = runs_root / "exp-plain"
    try:
        found = attach_two_nodes(jobs, "exp-plain", lambda node: {"UPS_HOSTNAME": f"node{node}"})
        again = run_ups("attach", str(found[1][0]), "--run-id", "exp-plain", env={"UPS_HOSTNAME": "node1"})
        assert again.returncode == 2 and "already attached" in again.stderr, again.stderr

        v = wait_for(lambda: stuck_rank_1("exp-plain"), 60, interval=1.0, message="ups why to name rank 1")
        rank1 = next(p for p in found[1][1]["processes"] if p["role"] == "rank")
        assert v["who"]["rank"] == 1 and v["who"]["pid"] == rank1["pid"]
        assert v["where"]["site"] == f"attach_ddp.py:{SLEEP_LINE}"
        assert "rank 0 waits for it" in v["headline"], v["headline"]

        data = ups_json("status", "exp-plain")
        procs = {p["name"]: p for p in data["processes"]}
        assert {"launcher@node0", "launcher@node1", "agent@node0", "agent@node1", "rank-0", "rank-1"} == set(procs)
        assert (procs["rank-0"]["host"], procs["rank-1"]["host"]) == ("node0", "node1")
        assert procs["agent@node1"]["pid"] == found[1][0]
        assert [(n["host"], n["node_rank"], n["state"]) for n in data["nodes"]] == [
            ("node0", 0, "running"), ("node1", 1, "running")]
        # Each node's observer wrote its own node's manifest: its job, its observer.
        nodes = {h: json.loads((run_dir / "nodes" / f"{h}.json").read_text()) for h in ("node0", "node1")}
        assert [nodes[f"node{n}"]["job"]["pid"] for n in (0, 1)] == [found[0][0], found[1][0]]
        assert nodes["node0"]["launcher"]["pid"] != nodes["node1"]["launcher"]["pid"]

        # Node 1's job killed from node 1: node 0's rank loses its peer and ends; the run ends
        # once each node's observer has seen its own job end.
        res = run_ups("kill", "exp-plain", env={"UPS_HOSTNAME": "node1"}, timeout=120)
        assert res.returncode == 0, res.stderr
        data = wait_for(lambda: (d := ups_json("status", "exp-plain")) and d["run"]["state"] not in ("launching", "running")
                        and d, 90, interval=1.0, message="the run's end on both nodes")
        assert {n["host"]: n["state"] for n in data["nodes"]} == {"node0": "failed", "node1": "killed"}, data["nodes"]
        assert data["run"]["state"] == "killed"
    finally:
        jobs.cleanup()
        stop_observers(run_dir)


@pytest.mark.slow
@needs_pyspy
def test_two_nodes_attached_into_their_own_runs_folders_read_over_ssh_name_rank_1_with_its_line(tmp_path, jobs, sshd):  # noqa: F811
    """No shared folder: each node attaches into its own runs folder; node0 reads node1 over ssh
    (`--remote`), and `ups why` there names rank 1 on node1 with its file:line, though its stacks
    are read on node1 (py-spy, by node1's observer)."""
    folders = {node: tmp_path / f"node{node}-runs" for node in (0, 1)}
    try:
        found = attach_two_nodes(jobs, "exp-ssh", lambda node: {"UPS_HOSTNAME": f"node{node}",
                                                                 "UPS_RUNS_DIR": str(folders[node])})
        remote_ups = f"env UPS_HOSTNAME=node1 PYTHONPATH={os.environ['PYTHONPATH']} {sys.executable} -m ups"
        env = {"UPS_HOSTNAME": "node0", "UPS_RUNS_DIR": str(folders[0]), "UPS_SSH": sshd, "UPS_REMOTE_UPS": remote_ups}
        assert not (folders[0] / "exp-ssh" / "stacks" / "rank-1.txt").exists()  # node1's stacks stay on node1
        v = wait_for(lambda: stuck_rank_1("exp-ssh", "--remote", f"127.0.0.1:{folders[1]}", env=env), 120, interval=1.0,
                     message="ups why on node0 to name rank 1 on node1")
        rank1 = next(p for p in found[1][1]["processes"] if p["role"] == "rank")
        assert (v["who"]["rank"], v["who"]["pid"], v["who"]["host"]) == (1, rank1["pid"], "node1"), v["who"]
        assert v["where"]["site"] == f"attach_ddp.py:{SLEEP_LINE}", v["where"]
        assert "rank 0 waits for it" in v["headline"], v["headline"]
    finally:
        jobs.cleanup()
        for folder in folders.values():
            stop_observers(folder / "exp-ssh")


@pytest.mark.slow
@needs_pyspy
def test_attaching_one_orphaned_rank_watches_every_rank_its_dead_agent_left(runs_root, jobs):
    agent, log = jobs.start_ready("rank 1 waits at step 3", fault="sleep:3")
    ranks = {p["rank"]: p["pid"] for p in ups_json("attach", str(agent.pid), "--dry-run")["processes"] if p["role"] == "rank"}
    jobs.remember()
    os.kill(agent.pid, signal.SIGKILL)  # the agent dies; its ranks, each a session of its own, live on
    agent.wait(timeout=10)
    wait_for(lambda: all(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1] == "1" for pid in ranks.values()),
             30, interval=0.2, message="the ranks re-parented to init")

    text = run_ups("attach", str(ranks[1]), "--dry-run")
    assert text.returncode == 0 and "its torchrun agent is gone: the 2 rank(s)" in text.stdout, text.stdout
    job = ups_json("attach", str(ranks[1]))
    assert job["orphan"] and {p["rank"]: p["pid"] for p in job["processes"] if p["role"] == "rank"} == ranks
    assert job["given"] == ranks[1] and sorted(job["roots"]) == sorted(ranks.values())
    run_id = job["run_id"]
    try:
        v = wait_for(lambda: stuck_rank_1(run_id), 60, interval=1.0, message="ups why to name rank 1")
        assert v["who"]["rank"] == 1 and v["who"]["pid"] == ranks[1] and v["where"]["site"] == f"attach_ddp.py:{SLEEP_LINE}"
        events = [json.loads(line) for line in (runs_root / run_id / "events.jsonl").read_text().splitlines()]
        assert events[0]["event"] == "attach" and "agent is gone" in events[0]["orphan"]

        # Both ranks lead a session of their own: each is proven the job's by its own (a root).
        res = run_ups("kill", run_id, timeout=120)
        assert res.returncode == 0, res.stderr
        wait_for(lambda: all(process_start_time(pid) is None for pid in ranks.values()), 60, message="the ranks' end")
        proofs = {e["target"]: e["proof"] for e in (json.loads(line) for line in
                  (runs_root / run_id / "events.jsonl").read_text().splitlines()) if e["event"] == "signal"}
        assert proofs["rank-0"] == f"in the job's session {ranks[0]}" and proofs["rank-1"] == f"in the job's session {ranks[1]}"
    finally:
        jobs.cleanup()
        stop_observers(runs_root / run_id)


@pytest.mark.slow
def test_ranks_whose_agent_dies_while_attached_stay_watched_and_killable(runs_root, jobs, tmp_path):
    """Attached while its agent lives, then the agent is SIGKILLed: its ranks live on under init,
    outside the top's tree; the observer keeps them (each a root of the job in run.json) and
    `ups kill` proves each by its own session."""
    idle = idle_rank(tmp_path)
    agent, log = jobs.start_ready("rank 0", "rank 1", program=idle)
    jobs.remember()
    job = ups_json("attach", str(agent.pid))
    ranks = {p["name"]: p["pid"] for p in job["processes"] if p["role"] == "rank"}
    run = runs_root / job["run_id"]
    try:
        os.kill(agent.pid, signal.SIGKILL)
        agent.wait(timeout=10)
        events = run / "events.jsonl"
        wait_for(lambda: "attach.orphaned" in events.read_text(), 30, interval=0.3, message="the orphaned ranks noted")
        roots = json.loads((run / "run.json").read_text())["job"]["roots"]
        assert {r["pid"] for r in roots} >= set(ranks.values()) and all(r["sid"] == r["pid"] for r in roots[1:])
        # in the same look, the agent's end is logged after the orphans, once its exit status is heard
        wait_for(lambda: '"process.gone"' in events.read_text(), 30, interval=0.3, message="the agent's end logged")
        gone = [json.loads(line)["name"] for line in events.read_text().splitlines()
                if json.loads(line)["event"] == "process.gone"]
        assert gone == ["agent"], gone  # the ranks are not taken for gone
        status = ups_json("status", job["run_id"])
        assert status["state"] == "running" and {p["name"] for p in status["processes"]} >= set(ranks)

        res = run_ups("kill", job["run_id"], timeout=120)
        assert res.returncode == 0, res.stdout + res.stderr
        wait_for(lambda: all(process_start_time(pid) is None for pid in ranks.values()), 60, message="the ranks' end")
        proofs = {e["target"]: e["proof"] for e in map(json.loads, events.read_text().splitlines()) if e["event"] == "signal"}
        assert {proofs[name] for name in ranks} == {f"in the job's session {pid}" for pid in ranks.values()}, proofs
    finally:
        jobs.cleanup()
        stop_observers(run)
