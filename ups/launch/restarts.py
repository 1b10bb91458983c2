"""What the launcher does with a hang decision: the event and its evidence, the stacks, the
job ended (``--on-hang kill``) or restarted with a back-off, and each attempt's record.

:mod:`ups.launch.onhang` gathers the facts and :mod:`ups.launch.policy` decides; this module
carries the decision out on the job of one :class:`ups.launch.supervise.Supervisor` (the
process owner: it starts, signals and sweeps the job; :class:`Restarts` asks it to) and says,
in the run's end, how many restarts it took and why (see docs/unattended.md).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import time
from typing import Any

from ups.launch.autostacks import StackCollector
from ups.launch.exits import ExitWatcher
from ups.launch.onhang import HANG_MODES, Decision, HangWatch, archive_attempt, attempt_entry
from ups.runs.outcome import describe_returncode

ACTOR = "launcher"
RESTART_GRACE_S = 5.0  # a hung job asked to stop before a restart: then SIGKILL


class Restarts:
    """The on-hang actions of one launcher, on the job its supervisor (``sup``) owns: it reads
    the supervisor's run, attempt and watchers, and asks it to signal, sweep and start the job."""

    def __init__(self, sup: Any) -> None:  # a Supervisor (which imports this module)
        self.sup = sup
        self.run = sup.run
        self.hang = HangWatch(sup.run, sup.manifest)
        self.hang_end: Decision | None = None  # the hang that ended the run (--on-hang kill, or restarts spent)
        self.first_step_noted: float | None = None  # seconds from this attempt's start to its first step

    def watch(self, reporter: Any) -> None:  # a Reporter
        sup = self.sup
        if sup.output_progress is not None:
            reporter.metrics(output_progress=sup.output_progress)  # readers take it as the job's progress
            sup.output_progress = None
        published = self.hang.observed
        try:
            verdict, decision = self.hang.check()
        except Exception as exc:  # noqa: BLE001 - judging must never stop supervision
            print(f"ups: could not judge the run: {exc!r}", flush=True)
            return
        if self.hang.observed != published:  # what the launcher sees of the processes it watches
            reporter.metrics(observed=self.hang.observed)
        if self.hang.first_step_at is not None and self.first_step_noted is None:  # what this attempt's start cost
            self.first_step_noted = round(max(0.0, self.hang.first_step_at - self.hang.started_at), 2)
            self.run.update_manifest(first_step_s=self.first_step_noted)
        if verdict is not None and sup.notifier is not None:
            # A hang is told once it is proven (with its proof), never on a display word.
            sup.notifier.on_verdict(verdict, hang=verdict.mode in HANG_MODES,
                                    proof=decision.proof if decision is not None else None)
        if decision is None or not self.hang.active:
            return
        v = decision.verdict
        evidence = {"mode": v.mode, "headline": v.headline, "who": (v.who or {}).get("label"), "attempt": sup.attempt,
                    "on_hang": self.hang.action, "on_worker_hang": "fallback" if self.hang.worker_fallback else None,
                    "proof": decision.proof, "reason": decision.policy.reason if decision.policy else None,
                    "gpu": decision.policy.gpu.gpu if decision.policy and decision.policy.gpu else None}
        if decision.action == "observe" or self.hang.observe_only:
            what = "none" if decision.action == "observe" else f"observe-only: would {decision.action.replace('_', ' ')}"
            self.run.append_event("hang", actor=ACTOR, action=what, **evidence)
            return
        if decision.action == "dump":  # the automatic collector saves every stuck process's stacks
            self.run.append_event("hang", actor=ACTOR, action="stacks saved", **evidence)
            return
        sup.stacks.tick()  # stacks first: every process in trouble not dumped yet this episode
        if decision.action == "restart":
            self.restart(decision, reporter, evidence)
            return
        # kill, or restart with no restart left
        self.hang_end = decision
        self.run.append_event("hang", actor=ACTOR, action="kill" if decision.action == "kill" else
                              f"kill: {decision.policy.reason if decision.policy else 'gave up'}", **evidence)
        self.record_attempt(v, "killed", facts=decision.facts, reason=decision.policy.reason if decision.policy else None)
        sup.terminate_requested = "on-hang"
        reporter.item(f"ending the job: {v.headline}")
        sup.signal_job(signal.SIGTERM)

    def record_attempt(self, verdict: Any, ended: str, folder: str | None = None, *, facts: Any = None,
                       attempt: int | None = None, started_at: float | None = None, first_step_s: float | None = None,
                       restarted_at: float | None = None, reason: str | None = None) -> None:
        """Each attempt's end and verdict in run.json, for ``ups why``, the run's summary, the
        restart policy (the hang's place) and the console's timeline (step reached, costs)."""
        m = self.run.read_own_manifest()
        attempts = list(m.get("attempts") or [])
        attempts.append(attempt_entry(attempt or self.sup.attempt, ended, verdict, folder, facts=facts,
                                      started_at=started_at or self.sup.attempt_started_at,
                                      first_step_s=self.first_step_noted if first_step_s is None else first_step_s,
                                      restarted_at=restarted_at, reason=reason))
        self.run.update_manifest(attempts=attempts)

    def stop_for_restart(self) -> int | None:
        """End every process of the hung attempt: SIGTERM to the job's group, SIGKILL after a grace."""
        sup = self.sup
        assert sup.child is not None and sup.pgid is not None
        sup.signal_job(signal.SIGTERM)
        deadline = time.monotonic() + RESTART_GRACE_S
        while time.monotonic() < deadline and group_alive(sup.pgid):
            sup.child.poll()
            time.sleep(0.05)
        if group_alive(sup.pgid):
            sup.signal_job(signal.SIGKILL)
        try:
            return sup.child.wait(timeout=RESTART_GRACE_S)
        except subprocess.TimeoutExpired:
            return None

    def restart(self, decision: Decision, reporter: Any, evidence: dict[str, Any]) -> None:
        sup = self.sup
        v = decision.verdict
        policy = decision.policy
        self.run.append_event("hang", actor=ACTOR, action="restart", **evidence)
        rc = self.stop_for_restart()
        sup.sweep()  # what the hung attempt left outside its process group (re-parented to us, its session)
        sup.stacks.stop()
        sup.exits.stop()
        folder = archive_attempt(self.run, sup.attempt)
        ended = f"restarted ({describe_returncode(rc)})"
        if policy is not None and policy.delay_s > 0:  # back-off: a flapping job does not loop all night
            reporter.item(f"back-off: restarting in {policy.delay_s:.0f} s")
            deadline = time.monotonic() + policy.delay_s
            while time.monotonic() < deadline and sup.terminate_requested is None:
                time.sleep(0.2)
            if sup.terminate_requested is not None:  # asked to stop while waiting: nothing to restart
                self.record_attempt(v, ended, folder, facts=decision.facts)
                return
        previous, facts = sup.attempt, decision.facts
        sup.attempt += 1
        env = dict(policy.env) if policy is not None else {}
        self.hang.new_attempt(fallback=decision.fallback, env=env)
        sup.extra_env.update(env)  # CUDA_VISIBLE_DEVICES without a GPU that reported a hardware fault
        if decision.fallback:
            sup.extra_env["UPS_FORCE_NUM_WORKERS"] = "0"  # as `ups relaunch --num-workers 0` does
        self.run.update_manifest(attempt=sup.attempt, restarts=self.hang.restarts, first_step_s=None)
        self.run.append_event("restart", actor=ACTOR, attempt=sup.attempt, restarts=self.hang.restarts,
                              max_restarts=self.hang.max_restarts, reason=v.headline, mode=v.mode,
                              policy=policy.reason if policy is not None else None, env=env or None,
                              num_workers=0 if decision.fallback else None, previous_records=folder)
        sup.exits = ExitWatcher(self.run, actor=ACTOR)
        sup.stacks = StackCollector(self.run, actor=ACTOR, observe_only=self.hang.observe_only)
        started, first = sup.attempt_started_at, self.first_step_noted  # the ended attempt's
        self.first_step_noted = None
        sup.start()
        self.record_attempt(v, ended, folder, facts=facts, attempt=previous, started_at=started, first_step_s=first,
                            restarted_at=sup.attempt_started_at, reason=policy.reason if policy is not None else None)
        reporter.item(f"{sup.describe()} (attempt {sup.attempt})")
        if sup.notifier is not None:
            sup.notifier.on_restart(sup.attempt, v)

    def outcome(self, outcome: Any) -> Any:  # an Outcome
        """The run's end says how many restarts it took and why; a hang that ended it is a failure."""
        if self.hang_end is None and not self.hang.restarts:
            return outcome
        reasons = [f"attempt {a.get('attempt')}: {(a.get('verdict') or {}).get('headline', '?')}"
                   for a in self.run.read_own_manifest().get("attempts") or []]
        if self.hang_end is not None:
            how = ("ended on hang (--on-hang kill)" if self.hang_end.action == "kill"
                   else self.hang_end.policy.reason if self.hang_end.policy is not None
                   else f"gave up after {self.hang.restarts} restart(s) on hang")
            return dataclasses.replace(outcome, state="failed", summary=f"{how}: {'; '.join(reasons)}")
        return dataclasses.replace(outcome, summary=f"{outcome.summary}; after {self.hang.restarts} restart(s) on hang "
                                                    f"({'; '.join(reasons)})")

    def record_last(self, state: str) -> None:
        """After the run's end: the last attempt's verdict beside the others (a run restarted on hang)."""
        if self.hang.restarts and self.hang_end is None:
            self.record_attempt((self.run.read_own_manifest().get("verdict") or {}), f"ended {state}")


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
