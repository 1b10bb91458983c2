"""`ups why --log` reads NCCL's RAS status report (``ncclras``, NCCL 2.24+) like any log.

No NCCL job runs on this box: the reports below are in NCCL's documented text form (the RAS
page of the NCCL user guide, and the strings its RAS client prints): a rank that launched fewer
collectives than its peers (a hang: it stopped, they wait), a rank ahead of them (a collective
the others never entered), and a process the RAS network lost.
"""

from __future__ import annotations

import json

from helpers import run_ups

from ups.why.logread import read_log

SUMMARY = """\
Job summary
===========

  Nodes  Processes         GPUs  Processes     GPUs
(total)   per node  per process    (total)  (total)
      4          8            1         32       32

Communicators... (0.00s)
=============

Group     Comms     Nodes     Ranks     Ranks     Ranks    Status  Errors
    #  in group  per comm  per node  per comm  in group
    0         1         4         8        32        32   RUNNING  {errors}

"""

BEHIND = SUMMARY.format(errors="MISMATCH") + """\
Errors
======

Warnings
========

#0-0 (27a079b828ff1a75) MISMATCH
  Communicator ranks have different AllReduce operation counts
  31 ranks have launched up to operation 6650
  Rank 10 has launched up to operation 6649 -- GPU 2 managed by process 3621778 on node 172.16.64.213

"""

AHEAD = BEHIND.replace("Rank 10 has launched up to operation 6649", "Rank 7 has launched up to operation 6651")

DEAD = SUMMARY.format(errors="INCOMPLETE") + """\
Errors
======

DEAD
  1 job process is considered dead (unreachable via the RAS network)
  Process 3487984 on node 172.16.64.213 managing GPU 5

#0-0 (cf264af53edbe986) INCOMPLETE
  Missing communicator data from 1 rank
  Rank 13 -- GPU 5 managed by process 3487984 on node 172.16.64.213

Warnings
========

"""

TIMEOUT = ("[rank3]:[E1127 10:00:00.000000000 ProcessGroupNCCL.cpp:632] [Rank 3] Watchdog caught collective operation "
           "timeout: WorkNCCL(SeqNum=6650, OpType=ALLREDUCE, NumelIn=1024, NumelOut=1024, Timeout(ms)=600000) ran for "
           "600027 milliseconds before timing out.\n")


def test_why_log_names_the_rank_behind_and_the_operation_where_the_ranks_part(tmp_path):
    report = tmp_path / "ras.txt"
    report.write_text(BEHIND)
    res = run_ups("why", "--log", str(report), "--json")
    out = json.loads(res.stdout)
    assert res.returncode == 1 and out["class"] == "nccl_rank_behind" and out["rank"] == 10, out
    assert "rank 10 at operation 6649" in out["line"] and "part at AllReduce operation 6650" in out["line"], out
    assert out["line_number"] == BEHIND.splitlines().index("  Communicator ranks have different AllReduce operation counts") + 1

    # the same report after torch's watchdog line: the report says who, the timeout only that one timed out
    r = read_log(TIMEOUT + BEHIND)
    assert r.name == "nccl_rank_behind" and r.rank == 10
    assert read_log(TIMEOUT).name == "collective_timeout"  # without it, as before

    r = read_log(AHEAD)
    assert r.name == "collective_mismatch" and r.rank == 7 and "part at AllReduce operation 6651" in r.line, r


def test_why_log_names_a_process_the_ras_network_lost(tmp_path):
    report = tmp_path / "ras.txt"
    report.write_text(DEAD)
    out = json.loads(run_ups("why", "--log", str(report), "--json").stdout)
    assert out["class"] == "nccl_process_lost" and out["rank"] == 13, out
    assert "rank 13 (process 3487984 on node 172.16.64.213 (GPU 5))" in out["line"]
    # a healthy report: nothing to say
    ok = SUMMARY.format(errors="OK") + "Errors\n======\n\nWarnings\n========\n\n"
    assert not read_log(ok).failed
