"""`ups why` and `ups stacks --group` on real processes: what an operator reads.

The ten failure modes, each built for real, are in tests/test_why_modes.py; here: the
pieces they stand on (stack files parsed, stacks folded, the automatic dumps and their
observe-only mode, the verdict kept at the end of a run, exit codes).
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from helpers import run_ups, wait_for

from ups.runs.rundir import RunDir
from ups.why import stacks

PROGRAMS = Path(__file__).parent / "programs"
FAST = {"UPS_HEARTBEAT_INTERVAL": "0.3"}


def launched(res) -> RunDir:
    assert res.returncode in (0, 1) and res.stdout.strip(), res.stderr
    return RunDir(json.loads(res.stdout)["run_dir"])


def why(run: RunDir) -> dict:
    res = run_ups("why", str(run.path), "--json")
    assert res.returncode in (0, 1), res.stderr
    return json.loads(res.stdout)["verdict"]


def test_a_real_dump_is_parsed_to_the_programs_own_frame(runs_root, tmp_path):
    script = tmp_path / "prep.py"
    script.write_text(textwrap.dedent("""\
        import time

        def load_everything():
            time.sleep(120)  # a slow step the operator wants to see

        load_everything()
        """))
    res = run_ups("launch", "python", "--detach", "--json", str(script), env=FAST, cwd=tmp_path)
    run = launched(res)
    wait_for(lambda: (run.status_dir / "rank-0.json").exists(), 20, message="the record")
    dump = run_ups("stacks", str(run.path), "--rank", "0")
    assert dump.returncode == 0, dump.stderr
    section = stacks.latest((run.path / "stacks" / "rank-0.txt").read_text())
    assert section.kind == "dump" and section.own_frame.function == "load_everything"
    assert section.own_frame.site == "prep.py:4" and section.main.frames[-1].function == "<module>"
    assert not section.main.ours  # never our heartbeat thread
    grouped = run_ups("stacks", str(run.path), "--group")
    assert grouped.stdout.strip() == "rank 0: load_everything at prep.py:4"


def test_fold_labels_reads_like_a_training_team_writes_it():
    assert stacks.fold_labels(["rank 0", "rank 2", "rank 3", "rank 4", "rank 7"]) == "ranks 0, 2-4, 7"
    assert stacks.fold_labels(["rank 1"]) == "rank 1"
    assert stacks.fold_labels(["rank 0", "rank 1", "rank 0 / worker 1"]) == "ranks 0, 1, rank 0 / worker 1"


@pytest.mark.slow
def test_observe_only_logs_the_automatic_dump_and_sends_nothing(runs_root, tmp_path):
    script = tmp_path / "stuck.py"  # a few optimizer steps, then stuck in its own code
    script.write_text(textwrap.dedent("""\
        import time, torch
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            model(torch.ones(4)).sum().backward()
            opt.step()
        while True:
            time.sleep(1)
        """))
    res = run_ups("launch", "python", "--observe-only", "--stalled-after", "1", "--detach", "--json", str(script),
                  env=FAST, cwd=tmp_path)
    run = launched(res)
    assert run.read_manifest()["automatic"] == "observe"
    event = wait_for(lambda: next((e for e in run.read_events() if e["event"] == "stacks.auto"), None), 60,
                     message="the automatic action, logged")
    assert event["result"] == "observe-only: not signalled" and event["health"] == "stalled"
    assert "no progress" in event["reason"]
    assert not [e for e in run.read_events() if e["event"] == "signal"]  # nothing was sent
    assert not (run.path / "stacks" / "rank-0.txt").read_text().strip()


def test_an_ended_run_keeps_its_verdict_and_why_exits_by_it(runs_root, tmp_path):
    ok = tmp_path / "ok.py"
    ok.write_text("print('fine')\n")
    bad = tmp_path / "bad.py"
    bad.write_text("def parse(row):\n    return int(row)\n\nparse('x7')\n")
    good = launched(run_ups("launch", "python", "--json", str(ok), cwd=tmp_path))
    res = run_ups("why", str(good.path))
    assert res.returncode == 0 and "nothing wrong: the run succeeded" in res.stdout
    failed = launched(run_ups("launch", "python", "--json", str(bad), cwd=tmp_path))
    m = failed.read_manifest()
    assert m["verdict"]["mode"] == "exception" and m["verdict"]["where"]["site"] == "bad.py:2"
    res = run_ups("why", str(failed.path))
    assert res.returncode == 1
    assert "rank 0 raised ValueError: invalid literal for int() with base 10: 'x7'" in res.stdout
    assert "bad.py:2 in parse" in res.stdout and "Next: ups logs" in res.stdout
    assert run_ups("why", str(tmp_path / "nope")).returncode == 2


@pytest.mark.slow
def test_why_on_a_healthy_live_run_says_nothing_is_wrong(runs_root, tmp_path):
    script = tmp_path / "fit.py"
    script.write_text(textwrap.dedent("""\
        import time, torch
        model = torch.nn.Linear(8, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for step in range(400):
            loss = model(torch.randn(16, 8)).square().mean()
            opt.zero_grad(); loss.backward(); opt.step()
            time.sleep(0.05)
        """))
    run = launched(run_ups("launch", "python", "--detach", "--json", str(script), env=FAST, cwd=tmp_path))
    v = wait_for(lambda: (w := why(run))["mode"] == "healthy" and w, 60, message="a healthy verdict")
    assert v["ok"] is True and v["headline"].startswith("nothing: healthy") and "steps" in v["headline"]


def test_why_remote_names_an_unreachable_node_first(runs_root, tmp_path):
    """`ups why --remote NODE` reads the other node as `ups status --remote` does; a node that
    cannot be reached, never heard from, comes before whatever this node's records say."""
    script = tmp_path / "wait.py"
    script.write_text("import time\nfor _ in range(600):\n    time.sleep(0.1)\n")
    run = launched(run_ups("launch", "python", "--detach", "--json", str(script), env=FAST, cwd=tmp_path))
    try:
        wait_for(lambda: (run.status_dir / "rank-0.json").exists(), 30, message="the record")
        # Nothing listens for ssh at 127.0.0.2: a node that is down.
        res = run_ups("why", run.run_id, "--json", "--remote", "127.0.0.2:/scratch/runs", "--remote-timeout", "5")
        assert res.returncode == 1, res.stderr
        v = json.loads(res.stdout)["verdict"]
        assert v["mode"] == "node_unreachable", v
        assert v["headline"] == "node 127.0.0.2 is unreachable: never heard from (no record of it reached this node)"
        assert any("127.0.0.2" in e for e in v["evidence"]) and v["next"].startswith("ssh 127.0.0.2")
        assert run_ups("why", run.run_id, "--remote", "-x").returncode == 2  # bad input: one line
    finally:
        run_ups("kill", str(run.path), "--grace", "2")
    # A run that ended failed here while the other node was never heard from: its end names
    # the lost node first, then what this node saw.
    bad = tmp_path / "bad.py"
    bad.write_text("raise ConnectionResetError('Connection reset by peer')\n")
    failed = launched(run_ups("launch", "python", "--json", str(bad), cwd=tmp_path))
    res = run_ups("status", failed.run_id, "--json", "--remote", "127.0.0.2", "--remote-timeout", "5")
    summary = json.loads(res.stdout)["run"]["summary"]
    assert summary.startswith("node 127.0.0.2 unreachable (") and "Connection reset by peer" in summary, summary
    v = json.loads(run_ups("why", failed.run_id, "--json", "--remote", "127.0.0.2", "--remote-timeout", "5").stdout)["verdict"]
    assert v["mode"] == "node_unreachable" and v["headline"].startswith("node 127.0.0.2 is unreachable")
