"""torchrun's line prefixes, read in one place (ups.status.lineprefix), on real logs recorded by
scripts/make_prefix_logs.py (tests/data/torchrun_prefixes/): with and without --tee, on one node
and on two, and with torchrun's "[rank${rank}]:" template. Each user of the prefixes (`ups why
--log`, `ups logs --rank` of an attached run, an attached run's end) names the global rank."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from ups.status.lineprefix import global_rank, read_prefixes, strip_prefixes

DATA = Path(__file__).resolve().parent / "data" / "torchrun_prefixes"
MANIFEST = json.loads((DATA / "manifest.json").read_text())
FORMS = {e["form"]: e for e in MANIFEST["logs"]}


def _lines(form: str) -> list[str]:
    return (DATA / FORMS[form]["log"]).read_text().splitlines()


def test_the_recordings_cover_each_prefix_form():
    assert set(FORMS) == {"tee_1node", "plain_1node", "tee_2nodes", "plain_2nodes", "template_2nodes"}
    assert all(any("--tee 3" in c for c in FORMS[f]["commands"]) for f in ("tee_1node", "tee_2nodes"))
    assert all(len(FORMS[f]["commands"]) == 2 and all("--nnodes 2" in c for c in FORMS[f]["commands"])
               for f in ("tee_2nodes", "plain_2nodes", "template_2nodes"))


@pytest.mark.parametrize("form", sorted(FORMS))
def test_the_failing_ranks_traceback_names_its_global_rank(form: str):
    failing = FORMS[form]["failing_rank"]
    raised = [ln for ln in _lines(form) if "ValueError: shard" in ln]
    assert raised, form
    for ln in raised:
        found = read_prefixes(ln)
        assert found is not None and found.rank == failing, (form, ln)
        assert strip_prefixes(ln).startswith("ValueError: shard"), ln
    frames = [ln for ln in _lines(form) if 'File "' in ln and "shard_job.py" in ln]
    assert frames and all(strip_prefixes(ln).startswith("  File ") for ln in frames)  # the frame's indent is its own


def test_tee_prefixes_name_the_local_rank_and_both_nodes_have_each():
    """--tee on two nodes: "[default0]:" is rank 0 on node 0 and rank 2 on node 1."""
    pairs = set()
    for ln in _lines("tee_2nodes"):
        found = read_prefixes(ln)
        if found is not None and found.rank is not None:
            pairs.add((found.local_rank, found.rank))
        said = re.search(r"^\[default(\d)\]:rank (\d) of 4 \(local (\d)\)", ln)
        if said:
            assert read_prefixes(ln).local_rank == int(said.group(3)) and read_prefixes(ln).rank is None
    assert {(0, 0), (1, 1), (0, 2), (1, 3)} <= pairs
    # one node's table from local rank to rank (an attach's), the global prefix first
    assert global_rank(read_prefixes("[default1]:[rank3]: ValueError"), {1: 1}) == 3
    assert global_rank(read_prefixes("[default1]:step 1"), {1: 3}) == 3
    assert global_rank(read_prefixes("[default1]:step 1")) is None


def test_what_is_not_a_prefix():
    report = [ln for ln in _lines("tee_2nodes") if re.match(r"^\[\d\]:$", ln)]
    assert report and all(read_prefixes(ln) is None for ln in report)  # the failure report's "[0]:"
    for text in ("[W1201 19:55:49.45 TCPStore.cpp:138] [c10d] failed", "[2026-12-01 10:00:00] step", "plain text"):
        assert read_prefixes(text) is None and strip_prefixes(text) == text
    assert strip_prefixes("[rank3]:[rank3]: x") == "x"  # torchrun's template and torch's excepthook, both


@pytest.mark.parametrize("form", ["tee_1node", "plain_1node", "tee_2nodes", "template_2nodes"])
def test_why_log_names_the_global_rank(form: str):
    from ups.why.logread import read_log

    got = read_log((DATA / FORMS[form]["log"]).read_text())
    assert (got.kind, got.exception, got.rank) == ("user_code", "ValueError", FORMS[form]["failing_rank"]), got


def test_why_log_on_two_nodes_never_takes_a_local_rank_for_a_global_one():
    from ups.why.logread.lines import read_lines

    lines = read_lines((DATA / "tee_2nodes.log").read_text())
    said = {ln.body: ln.rank for ln in lines if ln.body.startswith("rank ") and " of 4 " in ln.body}
    assert said and all(rank is None for rank in said.values()), said  # "[default1]:rank 3 of 4": not rank 1
    one_node = read_lines((DATA / "tee_1node.log").read_text())
    assert {ln.rank for ln in one_node if ln.body.startswith("rank 1 of 2")} == {1}  # one node: local is global


def test_logs_of_an_attached_rank_on_the_second_node_are_its_lines(runs_root):
    """`ups logs RUN --rank 3` of a job attached on node 1 (local ranks 0, 1 are ranks 2, 3)."""
    from ups.attach.logs import rank_filter
    from ups.runs.rundir import RunDir

    procs = [{"pid": 10, "rank": 2, "local_rank": 0, "role": "rank", "name": "rank-2"},
             {"pid": 11, "rank": 3, "local_rank": 1, "role": "rank", "name": "rank-3"}]
    run = RunDir.create(runs_root, "attached", extra={"attached": {"log": "/data/train.log", "processes": procs}})
    run.logs_dir.mkdir(exist_ok=True)
    node1 = [ln for ln in _lines("tee_2nodes") if re.match(r"\[default\d\]:(?:rank [23] |\[rank[23]\])", ln)]
    run.log_path("job").write_text("\n".join(node1) + "\n")
    keep = rank_filter(run, 3)
    mine = [ln for ln in node1 if keep(ln.encode())]
    assert any("ValueError: shard 3" in ln for ln in mine) and any(ln.startswith("[default1]:rank 3 of 4") for ln in mine)
    assert not any("[rank2]" in ln or "rank 2 of 4" in ln for ln in mine)


def test_an_attached_runs_end_names_the_global_rank_and_the_error_without_prefixes(runs_root):
    from ups.attach.ending import write_end
    from ups.runs.rundir import RunDir

    run = RunDir.create(runs_root, "attached", extra={"attached": {"log": "/data/train.log", "processes": []}})
    run.logs_dir.mkdir(exist_ok=True)
    run.log_path("job").write_bytes((DATA / "tee_2nodes.log").read_bytes())
    write_end(run, {}, lambda *a: None)
    failure = run.read_manifest()["failure"]
    assert failure["rank"] == 3 and failure["error"].startswith("ValueError: shard 3 has 0 rows"), failure


def test_a_programs_own_bracketed_counter_and_another_launchers_label_are_not_torchruns_ranks():
    from ups.why.logread.lines import read_lines

    assert read_prefixes("[epoch3]: loss 0.5") is None and read_lines("[epoch3]: loss 0.5\n")[0].rank is None
    # srun --label over torchrun: the label is the node's task; torch's [rank5]: is the rank
    line = read_lines("1: [default1]:[rank5]: ValueError: bad\n")[0]
    assert line.rank == 5 and line.body == "ValueError: bad"
    assert read_lines("1: ValueError: bad\n")[0].rank == 1  # srun --label alone: its task is the rank
