"""``ups why``: one verdict that names what is wrong, who, where, since when, and what to do.

The evidence is what ``ups`` already collects (records, phases, collectives, stack dumps,
exit truth, torchrun's report, logs, events) and what this host says (ups.why.host), held
by :class:`~ups.why.evidence.Evidence`; the ordered rules of :mod:`ups.why.rules` turn it
into a :class:`~ups.why.verdict.Verdict`. Nothing here signals a process: the supervisor
dumps the stacks of a process that turns stalled or unresponsive (ups.launch.evidence), so
the frames are there when an operator asks.
"""

from __future__ import annotations

from ups.runs.rundir import RunDir
from ups.runs.view import RunView
from ups.why.evidence import Evidence
from ups.why.verdict import MODES, Verdict

__all__ = ["MODES", "Verdict", "diagnose", "diagnose_view"]


def diagnose_view(view: RunView) -> Verdict:
    from ups.why.attached import for_attached
    from ups.why.rules import first_verdict

    return for_attached(first_verdict(Evidence(view)), view.manifest)


def diagnose(run: RunDir) -> Verdict:
    """The verdict on a run now (a run nobody is left to finish is settled first)."""
    from ups.runs.read import open_run

    return diagnose_view(open_run(run))
