"""From evidence to a verdict: ordered rules, the first that speaks decides.

Ended runs are judged by how they ended (the launcher's own root-cause analysis, with exit
truth, names the process; the rules say what kind of failure it was from its own words:
the exception, the signal and the faulthandler frame, the log). Live runs are judged by what
is stuck now: collectives first (a mismatch of ops or sequence numbers names the odd rank; a
rank outside any collective while its peers wait in one is the one they wait for), then
DataLoader workers, then any process that stopped making progress or answering.

Each rule is a pure function of its :class:`~ups.why.evidence.Evidence` (the view, the run
folder's files, the host's facts). The families:

* :mod:`.exits`: ended runs and processes (crashes, signals, OOM, full disk, rendezvous);
* :mod:`.collectives`: one-sided and mismatched collectives, the rank its peers wait for;
* :mod:`.workers`: DataLoader workers stuck, failed or out of resources;
* :mod:`.hardware`: GPU faults and throttling, lost nodes, a full runs disk, no launcher;
* :mod:`.metrics`: the training's own metrics (NaN, divergence, step rate, memory leak);
* :mod:`.stragglers`: the rank the others wait for, its cause and its cost;
* :mod:`.processes`: a process dead, stalled or unresponsive with no more specific cause, and
  the healthy verdict when no rule speaks.
"""

from __future__ import annotations

from ups.why import flight
from ups.why.evidence import Evidence
from ups.why.rules.collectives import collectives, ddp_backward
from ups.why.rules.common import Rule
from ups.why.rules.exits import ended, live_failure, oom_skipped, settling
from ups.why.rules.hardware import full_disk, gpu_straggler, lost_node, unsupervised
from ups.why.rules.metrics import ended_training, live_training
from ups.why.rules.pauses import busy_pause, no_signal
from ups.why.rules.processes import dead, healthy, hung
from ups.why.rules.stragglers import straggler
from ups.why.rules.workers import starved_loader, stuck_workers
from ups.why.verdict import Verdict

__all__ = ["RULES", "Rule", "first_verdict", "healthy", "with_recorded"]

# Verdicts on the training's numbers or a start: the ranks' collectives say nothing about them.
NOT_COLLECTIVE = frozenset(("loss_nonfinite", "loss_diverged", "step_rate_dropped", "gpu_memory_leak", "starting",
                            "succeeded", "ended", "healthy", "straggler_input", "straggler_compute", "straggler_host",
                            "straggler_node", "straggler_unknown"))

RULES: tuple[Rule, ...] = (lost_node, ended_training, ended, full_disk, unsupervised, settling, live_failure, busy_pause,
                          collectives,
                          ddp_backward, starved_loader, stuck_workers, dead, hung, no_signal, gpu_straggler,
                          live_training, oom_skipped, straggler)


def first_verdict(ev: Evidence) -> Verdict:
    """The verdict of the first rule that speaks, else the healthy one."""
    for rule in RULES:
        verdict = rule(ev)
        if verdict is not None:
            return with_recorded(ev, verdict)
    return healthy(ev)


def with_recorded(ev: Evidence, verdict: Verdict) -> Verdict:
    """A failure's evidence plus what the stack recorded itself: PyTorch's Flight Recorder
    dumps (:mod:`ups.why.flight`: where the ranks' collectives part, by rank and sequence number)."""
    if verdict.ok or verdict.mode in NOT_COLLECTIVE:
        return verdict
    lines = flight.evidence_lines(ev.flight)
    if lines:
        verdict.evidence = list(verdict.evidence) + lines
    return verdict
