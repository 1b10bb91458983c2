"""PyTorch's Flight Recorder as evidence: the ranks' own record of their last collectives.

torch 2.13's gloo backend records into the Flight Recorder when its buffer is on
(``TORCH_FR_BUFFER_SIZE``), as NCCL does; gloo has no watchdog that writes it out, so the
instrumentation does (ups.instrument.flight). The real run is tests/programs/ddp_train.py
under `ups launch torchrun` whose rank 1 broadcasts "skip this step" at step 5, a broadcast
rank 0 never makes: `ups why` names the sequence number where the ranks part, and who was
where. The reader's own rules (JSON preferred; a pickle only from a run folder proven yours)
are checked on NCCL's pickled form, as torch writes it on a watchdog timeout.
"""

from __future__ import annotations

import json
import os
import pickle
import re
from pathlib import Path

import pytest
from helpers import run_ups, wait_for

from ups.runs.rundir import RunDir
from ups.why.flight import evidence_lines, parting, read_run_dumps

DDP = str(Path(__file__).parent / "programs" / "ddp_train.py")


@pytest.mark.slow
def test_a_real_gloo_job_dumps_its_flight_recorder_and_why_names_where_the_ranks_part(runs_root, tmp_path):
    res = run_ups("launch", "torchrun", "--detach", "--json", "--stalled-after", "3", "--nproc-per-node", "2", DDP,
                  "--steps", "100", "--workers", "0", "--fail", "broadcast", "--fail-step", "5",
                  env={"UPS_HEARTBEAT_INTERVAL": "0.3", "TORCH_FR_BUFFER_SIZE": "200"}, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    run = RunDir(json.loads(res.stdout)["run_dir"])

    def named():
        out = run_ups("why", str(run.path), "--json")
        v = json.loads(out.stdout)["verdict"] if out.stdout.strip() else {}
        return v if any("Flight Recorder" in e for e in v.get("evidence") or []) else None

    v = wait_for(named, 120, interval=0.5, message="a verdict with the Flight Recorder's evidence")
    line = next(e for e in v["evidence"] if "Flight Recorder" in e)
    assert v["mode"] == "one_sided_collective" and v["who"]["rank"] == 1, v
    # rank 0 is in DDP's gradient all-reduce, rank 1 in its broadcast: the same sequence number
    m = re.search(r"the ranks part at collective #(\d+), different collectives: rank 0: all_reduce .*; "
                  r"rank 1: broadcast \[\[1\]\]", line)
    assert m, line
    dumps = read_run_dumps(run.path)
    assert {d.rank for d in dumps.dumps} == {0, 1} and {d.form for d in dumps.dumps} == {"json"}, dumps
    assert sorted(os.listdir(run.path / "flight")) == ["rank-0.json", "rank-1.json"]
    p = parting(dumps.dumps)
    assert p is not None and p.seq == int(m.group(1)) and p.kind == "mismatch"
    run_ups("kill", str(run.path), "--force", timeout=60)


def _nccl_entry(seq: int, op: str, state: str = "completed") -> dict:
    """An entry as NCCL's Flight Recorder writes it (version 2.x: profiling_name "nccl:<op>",
    collective_seq_id per process group, process_group (name, description))."""
    return {"record_id": seq - 1, "pg_id": 0, "process_group": ("0", "default_pg"), "collective_seq_id": seq,
            "p2p_seq_id": 0, "op_id": seq, "profiling_name": f"nccl:{op}", "time_created_ns": 1_000 + seq,
            "input_sizes": [[1024]], "input_dtypes": ["Float"], "output_sizes": [[1024]], "output_dtypes": ["Float"],
            "state": state, "time_discovered_started_ns": None, "time_discovered_completed_ns": None,
            "retired": state == "completed", "timeout_ms": 600_000, "is_p2p": False,
            "frames": [{"name": "all_reduce", "filename": "train.py", "line": 54}]}


def _nccl_dump(last: int, stuck: str | None = None) -> dict:
    entries = [_nccl_entry(s, "all_reduce") for s in range(1, last + 1)]
    if stuck:
        entries.append(_nccl_entry(last + 1, stuck, "started"))
    return {"version": "2.10", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2]"}},
            "pg_status": {"0": {"last_enqueued_collective": last + (1 if stuck else 0)}}, "entries": entries}


def _run_folder(tmp_path: Path, mode: int = 0o755) -> Path:
    run = RunDir.create(tmp_path / "runs", "torchrun")
    flight = run.path / "flight"
    flight.mkdir()
    flight.chmod(mode)
    return run.path


def test_nccl_pickles_are_read_only_from_a_run_folder_that_is_yours(tmp_path):
    run = _run_folder(tmp_path)
    # NCCL's watchdog names each file TORCH_NCCL_DEBUG_INFO_TEMP_FILE + rank
    for rank, dump in ((0, _nccl_dump(41, "all_reduce")), (1, _nccl_dump(41)), (2, _nccl_dump(41, "all_reduce"))):
        (run / "flight" / f"nccl_trace_rank_{rank}").write_bytes(pickle.dumps(dump))
    reading = read_run_dumps(run)
    assert not reading.problems and {d.form for d in reading.dumps} == {"pickle"}
    [line] = evidence_lines(reading)
    assert ("the ranks part at collective #42: rank 0 entered all_reduce #42 (started); rank 2 entered all_reduce #42 "
            "(started); rank 1 never did (its last: all_reduce #41)") in line, line

    # a pickle that names a class is refused, whatever folder it is in
    (run / "flight" / "nccl_trace_rank_3").write_bytes(pickle.dumps({"entries": [], "x": Path("/")}))
    assert "refused: the pickle names" in read_run_dumps(run).problems["flight/nccl_trace_rank_3"]
    (run / "flight" / "nccl_trace_rank_3").unlink()

    # a flight folder others may write: its pickles are never opened (its JSON still is)
    (run / "flight").chmod(0o777)
    reading = read_run_dumps(run)
    assert not reading.dumps and all("only you can write" in why for why in reading.problems.values()), reading.problems
    (run / "flight" / "rank-0.json").write_text(json.dumps(_nccl_dump(41, "all_reduce")))
    assert [d.rank for d in read_run_dumps(run).dumps] == [0]

    # a run folder that is not a run of yours (no run.json): the proof refuses, nothing is unpickled
    other = tmp_path / "elsewhere"
    (other / "flight").mkdir(parents=True)
    (other / "flight" / "nccl_trace_rank_0").write_bytes(pickle.dumps(_nccl_dump(3)))
    reading = read_run_dumps(other)
    assert not reading.dumps and "not a run folder" in reading.problems["flight/nccl_trace_rank_0"]


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_a_pickle_another_user_owns_is_never_opened(tmp_path):
    run = _run_folder(tmp_path)
    path = run / "flight" / "nccl_trace_rank_1"
    path.write_bytes(pickle.dumps(_nccl_dump(3)))
    os.chown(path, 65534, 65534)
    reading = read_run_dumps(run)
    assert not reading.dumps and "belongs to" in reading.problems["flight/nccl_trace_rank_1"], reading.problems
