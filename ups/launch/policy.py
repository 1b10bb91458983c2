"""What to do about a proven hang: one pure decision over the hang, the attempts before it and
the launch options (``--on-hang``, ``--max-restarts``, ``--restart-window``,
``--on-worker-hang``, ``--observe-only``).

:func:`decide` reads no file, no clock and no process: the launcher gathers the facts
(:mod:`ups.launch.onhang`: :class:`HangFacts` from the verdict and the culprit's record, the
earlier attempts from run.json, the GPUs' hardware signs) and does what the :class:`Action`
says (:mod:`ups.launch.restarts`, on the job :mod:`ups.launch.supervise` owns). A restart costs the job's start-up and the steps since its last
checkpoint, so a restart is chosen only where it can help:

* the same hang twice (the same culprit role, the same file:line, at the same step, or in the
  same phase where there are no steps) stops: a hang that comes back at the same place is the
  program's, and restarting will not help;
* a hang that moved (another place, another step) restarts, as a transient one does;
* a hardware sign on this node (an Xid, ECC errors, a pending row remap) names the GPU; a
  restart leaves that GPU out (``CUDA_VISIBLE_DEVICES``) where the job's ranks still have one
  each, and is refused with the reason where they would not;
* restarts are spaced (a back-off that doubles with each restart in the window) and bounded:
  at most ``--max-restarts`` within ``--restart-window`` (the whole run by default);
* ``--observe-only`` decides the same and does nothing: the event says what would be done.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

BACKOFF_S = 10.0  # the wait before a second restart in the window; doubled for each one after
BACKOFF_MAX_S = 300.0
HANG_ACTIONS = ("observe", "dump", "kill", "restart")


@dataclass(frozen=True)
class HangFacts:
    """A proven hang, as the policy compares two of them."""

    mode: str
    headline: str
    role: str | None = None  # the culprit's role: rank, worker, agent ...
    name: str | None = None  # its record's name (rank-1)
    site: str | None = None  # file:line of the program's own innermost frame, when known
    step: int | None = None  # the culprit's step when it stopped
    phase: str | None = None
    since: float | None = None  # when it stopped making progress
    gpu: int | None = None  # the device its record names (or its local rank's), on this node

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> HangFacts | None:  # run.json's value, checked here
        if not isinstance(data, dict) or not isinstance(data.get("mode"), str):
            return None
        def num(key: str, kind: type) -> Any:
            v = data.get(key)
            return v if isinstance(v, kind) and not isinstance(v, bool) else None
        text = {k: data.get(k) if isinstance(data.get(k), str) else None for k in ("role", "name", "site", "phase")}
        return cls(data["mode"], str(data.get("headline") or ""), step=num("step", int),
                   since=num("since", (int, float)), gpu=num("gpu", int), **text)

    def place(self) -> str:
        """Where it stopped, in words: ``train.py:54 at step 5``."""
        at = self.site or f"phase {self.phase or '?'}"
        return f"{at} at step {self.step}" if self.step else at


@dataclass(frozen=True)
class PastAttempt:
    """An attempt before this one: the hang that ended it (None: it ended otherwise) and when
    the attempt after it started (None: it was not restarted)."""

    attempt: int
    hang: HangFacts | None = None
    restarted_at: float | None = None


@dataclass(frozen=True)
class HardwareSign:
    """A fault this node's GPU reported (NVML, or the kernel log)."""

    gpu: int
    what: str  # "Xid 79: GPU has fallen off the bus", "2 uncorrected ECC error(s)"


@dataclass(frozen=True)
class Options:
    on_hang: str = "dump"
    max_restarts: int = 0
    restart_window_s: float | None = None  # None: the whole run
    backoff_s: float = BACKOFF_S
    observe_only: bool = False
    worker_fallback: bool = False  # --on-worker-hang fallback
    fell_back: bool = False  # this run already runs with num_workers=0

    @classmethod
    def from_manifest(cls, m: dict[str, Any]) -> Options:
        window = m.get("restart_window")
        backoff = m.get("restart_backoff")
        return cls(on_hang=m.get("on_hang") or "dump", max_restarts=int(m.get("max_restarts") or 0),
                   restart_window_s=float(window) if isinstance(window, (int, float)) and window > 0 else None,
                   backoff_s=float(backoff) if isinstance(backoff, (int, float)) and backoff >= 0 else BACKOFF_S,
                   observe_only=m.get("automatic") == "observe", worker_fallback=m.get("on_worker_hang") == "fallback",
                   fell_back=bool((m.get("env") or {}).get("UPS_FORCE_NUM_WORKERS")))


@dataclass(frozen=True)
class Action:
    """What to do, and why (the reason goes into the event, the run's end and the notification)."""

    action: str  # observe | dump | kill | restart | give_up
    reason: str
    would: str | None = None  # observe-only: the action that was decided and not done
    fallback: bool = False  # restart with every DataLoader at num_workers=0
    delay_s: float = 0.0  # back-off: wait this long before starting the next attempt
    env: dict[str, str] = field(default_factory=dict)  # for the next attempt (CUDA_VISIBLE_DEVICES)
    gpu: HardwareSign | None = None  # the GPU named by a hardware sign
    same_as: int | None = None  # the attempt whose hang came back

    @property
    def stops(self) -> bool:
        """The run ends here, of the hang (or would, under --observe-only)."""
        return (self.would or self.action) in ("kill", "give_up")


def same_hang(a: HangFacts, b: HangFacts) -> bool:
    """The same culprit role at the same file:line, at the same step (or, without steps, in the
    same phase). A hang whose place is not known is never called the same: it restarts."""
    if not a.site or not b.site or (a.role, a.site) != (b.role, b.site):
        return False
    if a.step and b.step:
        return a.step == b.step
    return a.phase == b.phase


def restarts_in_window(history: Sequence[PastAttempt], opts: Options, now: float) -> list[float]:
    """When each restart counted against the budget happened, oldest first."""
    times = sorted(a.restarted_at for a in history if a.restarted_at is not None)
    if opts.restart_window_s is None:
        return times
    return [t for t in times if t >= now - opts.restart_window_s]


def backoff(history: Sequence[PastAttempt], opts: Options, now: float) -> float:
    """Seconds to wait before the next start: none for the first restart in the window, then
    ``backoff_s`` after the last start, doubled for each restart since (at most BACKOFF_MAX_S)."""
    recent = restarts_in_window(history, opts, now)
    if not recent:
        return 0.0
    gap = min(opts.backoff_s * 2 ** (len(recent) - 1), BACKOFF_MAX_S)
    return max(0.0, recent[-1] + gap - now)


def seconds_text(s: float) -> str:
    """600 -> '10 min', 7200 -> '2 h', 45 -> '45 s' (how a window was given)."""
    for unit, size in (("h", 3600), ("min", 60)):
        if s >= size and s % size == 0:
            return f"{s / size:g} {unit}"
    return f"{s:g} s"


def _window_words(opts: Options) -> str:
    return "" if opts.restart_window_s is None else f" within {seconds_text(opts.restart_window_s)}"


def decide(hang: HangFacts, attempt: int, history: Sequence[PastAttempt], opts: Options, *, now: float,
           signs: Sequence[HardwareSign] = (), gpus: Sequence[int] | None = None,
           gpus_needed: int | None = None, worker_hang: bool = False) -> Action:
    """The action on a proven ``hang`` of attempt ``attempt``, given the attempts before it
    (``history``, oldest first), the options, the time, the node's hardware signs, the GPUs
    the job sees (``gpus``: device indices, None when unknown) and how many it needs (one per
    rank of this node; None when unknown). Pure: the same facts, the same action."""
    act = _decide(hang, attempt, history, opts, now=now, signs=signs, gpus=gpus, gpus_needed=gpus_needed,
                  worker_hang=worker_hang)
    if opts.observe_only and act.action not in ("observe",):
        what = "give up" if act.action == "give_up" else act.action
        return Action("observe", f"observe-only: would {what}: {act.reason}", would=act.action, fallback=act.fallback,
                      delay_s=act.delay_s, env=act.env, gpu=act.gpu, same_as=act.same_as)
    return act


def _decide(hang: HangFacts, attempt: int, history: Sequence[PastAttempt], opts: Options, *, now: float,
            signs: Sequence[HardwareSign], gpus: Sequence[int] | None, gpus_needed: int | None,
            worker_hang: bool) -> Action:
    sign = next((s for s in signs if s.gpu == hang.gpu), None) or (signs[0] if signs else None)
    named = f"GPU {sign.gpu} reported a hardware fault before the hang ({sign.what})" if sign else None
    if opts.worker_fallback and worker_hang and not opts.fell_back:
        return Action("restart", "a DataLoader worker hung: restarting with num_workers=0 (--on-worker-hang fallback)",
                      fallback=True, gpu=sign)
    if opts.on_hang in ("observe", "dump", "kill"):
        said = {"observe": "--on-hang observe", "dump": "stacks saved (--on-hang dump)", "kill": "--on-hang kill"}
        return Action(opts.on_hang, said[opts.on_hang] + (f"; {named}" if named else ""), gpu=sign)
    # --on-hang restart
    previous = next((a for a in reversed(history) if a.hang is not None), None)
    if previous is not None and previous.hang is not None and same_hang(previous.hang, hang):
        return Action("give_up", f"not restarted: the same hang came back at {hang.site} on attempt {attempt}; "
                                 "restarting will not help; fix it, then `ups relaunch`", gpu=sign,
                      same_as=previous.attempt)
    env: dict[str, str] = {}
    if sign is not None:
        left = [g for g in (gpus or ()) if g not in {s.gpu for s in signs}]
        if gpus is None or gpus_needed is None or len(left) < gpus_needed:
            need = "an unknown number of GPUs" if gpus_needed is None else f"{gpus_needed} GPU(s)"
            have = "its GPUs are not known" if gpus is None else f"{len(left)} of its {len(gpus)} GPU(s) have no fault"
            return Action("give_up", f"not restarted: {named}; the job needs {need} and {have}; drain this node "
                                     "or fix the GPU, then `ups relaunch`", gpu=sign)
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in left)
    spent = restarts_in_window(history, opts, now)
    if len(spent) >= opts.max_restarts:
        return Action("give_up", f"gave up after {len(spent)} restart(s) on hang{_window_words(opts)} "
                                 f"(--max-restarts {opts.max_restarts})" + (f"; {named}" if named else ""), gpu=sign)
    delay = backoff(history, opts, now)
    moved = f"the hang moved ({previous.hang.place()} on attempt {previous.attempt}, now {hang.place()})" \
        if previous is not None and previous.hang is not None else f"hang at {hang.place()}"
    why = [moved, f"restart {len(spent) + 1} of {opts.max_restarts}{_window_words(opts)}"]
    if named:
        why.append(f"{named}: restarting without it (CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']})")
    if delay:
        why.append(f"after a back-off of {delay:.0f} s")
    return Action("restart", "; ".join(why), delay_s=delay, env=env, gpu=sign)
