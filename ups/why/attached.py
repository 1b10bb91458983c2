"""What to do next about an attached run (kind ``attached``: a job ups did not start).

The rules name ``ups relaunch RUN`` as the way to start a run again; an attached run stores no
command ups could run (it did not start the job, and the job's environment, working folder and
launcher are not its to repeat). Its verdict says instead what works: start the job again the
way it was started, then attach to it.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from ups.why.verdict import Verdict

RELAUNCH = re.compile(r"`?ups relaunch [^\s`,;)]+((?: --[\w-]+(?: (?!--)[^\s`,;)]+)?)*)`?")


def instead_of_relaunch(manifest: dict[str, Any]) -> str:
    job = manifest.get("job") if isinstance(manifest.get("job"), dict) else {}
    argv = job.get("command") if isinstance(job.get("command"), list) else None
    cmd = shlex.join(str(a) for a in argv) if argv else ""
    started = f"as it was started (`{cmd[:160]}`)" if cmd else "as it was started"
    return f"start the job again {started}, then `ups attach PID` (ups did not start it: no `ups relaunch`)"


def for_attached(verdict: Verdict, manifest: dict[str, Any] | None) -> Verdict:
    """The verdict, its ``ups relaunch`` advice replaced for an attached run."""
    if not manifest or manifest.get("kind") != "attached" or "ups relaunch" not in verdict.next:
        return verdict

    def sub(m: re.Match[str]) -> str:
        opts = m.group(1).strip()
        return instead_of_relaunch(manifest) + (f" with {opts} set in its own command" if opts else "")
    verdict.next = RELAUNCH.sub(sub, verdict.next)
    return verdict
