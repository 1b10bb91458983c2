"""The rank the others wait for (ups.status.straggler): who, why, on what numbers, and what it
costs the job. A display and a notification: no action is ever taken on it."""

from __future__ import annotations

from ups.status.health import Health
from ups.why.evidence import Evidence
from ups.why.verdict import Verdict, who_of

NEXT = {
    "input": "look at its DataLoader: `ups status {run}` shows its workers' rates and the sample each reads; "
             "more workers, a faster disk, or the data's cache",
    "compute": "compare its node with the others (GPU clocks: nvidia-smi -q -d PERFORMANCE; CPU frequency), "
               "and any code that runs on this rank only",
    "host": "find what else runs on its cores (top -H; taskset -cp on its pid): another job, a data "
            "process, a hog pinned to the same CPUs",
    "node": "drain the node or exclude it (its GPUs, network or CPUs are slower) and relaunch elsewhere",
    "unknown": "`ups stacks {run} --rank {rank}` a few times: what it does while the others wait",
}


def straggler(ev: Evidence) -> Verdict | None:
    """A rank named 'straggler' by the health rules: the verdict with its cause and cost."""
    named = [p for p in ev.processes("rank") if p.verdict.health is Health.STRAGGLER]
    if not named:
        return None
    _, found = ev.view.step_times  # the judgement the health rules made, computed once per view
    if found is None:
        return None
    r = next((p.record for p in named if p.record.name == found.rank.name), named[0].record)
    who = f"node {found.rank.host} (ranks {', '.join(map(str, found.node_ranks))})" if found.cause == "node" else r.label
    d = ev.gpu_of(r)
    evidence = list(found.evidence)
    if d is not None and d.throttle:
        evidence.insert(0, f"GPU {d.index} is throttled: {', '.join(d.throttle)}")
    evidence.append(f"named below score {found.threshold:g}, from the medians of the last {found.rank.n} steps")
    return Verdict(f"straggler_{found.cause}",
                   f"{who} is the straggler (score {found.rank.score:.2f}): {found.why}; the job runs "
                   f"{found.cost:.0%} below its pace without it ({found.gpu_hours_per_day:.1f} GPU-hours a day "
                   f"on {found.world} ranks)",
                   who=who_of(r), since=None, evidence=evidence,
                   next=NEXT[found.cause].format(run=ev.view.run_id, rank=found.rank.rank))
