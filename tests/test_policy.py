"""The restart policy (ups.launch.policy.decide) as a table: the same facts in, the same action
and reason out. The real-process drills are tests/test_unattended.py's."""

from __future__ import annotations

import pytest

from ups.launch.policy import (
    Action,
    HangFacts,
    HardwareSign,
    Options,
    PastAttempt,
    decide,
    same_hang,
)

pytestmark = pytest.mark.notorch  # also run on each other Python, without torch (tests/test_pythons.py)

NOW = 10_000.0
HANG = HangFacts("stalled", "rank 1 is stalled in phase train", role="rank", name="rank-1", site="train.py:54",
                 step=69, phase="train", since=NOW - 20, gpu=1)
MOVED_LINE = HangFacts("stalled", "rank 1 is stalled", role="rank", name="rank-1", site="train.py:80", step=69, phase="train")
MOVED_STEP = HangFacts("stalled", "rank 1 is stalled", role="rank", name="rank-1", site="train.py:54", step=400, phase="train")
NO_SITE = HangFacts("stalled", "rank 1 is stalled", role="rank", name="rank-1", site=None, step=69, phase="train")
RESTART3 = Options(on_hang="restart", max_restarts=3)


def hung(attempt: int, hang: HangFacts | None = HANG, at: float | None = None) -> PastAttempt:
    return PastAttempt(attempt, hang, restarted_at=NOW - 600 if at is None else at)


CASES = [
    # (name, hang, attempt, history, options, extra, action, words in the reason)
    ("first hang restarts at once", HANG, 1, [], RESTART3, {}, "restart", ["restart 1 of 3"]),
    ("same place twice stops", HANG, 2, [hung(1)], RESTART3, {}, "give_up",
     ["not restarted: the same hang came back at train.py:54 on attempt 2; restarting will not help; "
      "fix it, then `ups relaunch`"]),
    ("another line: moved, restarts", MOVED_LINE, 2, [hung(1)], RESTART3, {}, "restart",
     ["the hang moved (train.py:54 at step 69 on attempt 1, now train.py:80 at step 69)"]),
    ("same line, a step far beyond: moved", MOVED_STEP, 2, [hung(1)], RESTART3, {}, "restart", ["the hang moved"]),
    ("no site known: never called the same", NO_SITE, 2, [hung(1, NO_SITE)], RESTART3, {}, "restart", ["moved"]),
    ("same line, no steps, same phase: same", HangFacts("stalled", "h", role="rank", site="a.py:3", phase="data"), 2,
     [hung(1, HangFacts("stalled", "h", role="rank", site="a.py:3", phase="data"))], RESTART3, {}, "give_up",
     ["same hang came back at a.py:3"]),
    ("same line, another role: moved", HangFacts("worker_stuck", "w", role="worker", site="train.py:54", step=69), 2,
     [hung(1)], RESTART3, {}, "restart", ["moved"]),
    ("budget spent", MOVED_LINE, 4, [hung(1, NO_SITE), hung(2, HANG), hung(3, NO_SITE)], RESTART3, {}, "give_up",
     ["gave up after 3 restart(s) on hang (--max-restarts 3)"]),
    ("budget: old restarts fall out of the window", MOVED_LINE, 4,
     [hung(1, NO_SITE, at=NOW - 7200), hung(2, HANG, at=NOW - 7000), hung(3, NO_SITE, at=NOW - 100)],
     Options(on_hang="restart", max_restarts=2, restart_window_s=3600), {}, "restart", ["restart 2 of 2 within 1 h"]),
    ("budget within the window spent", MOVED_LINE, 3, [hung(1, NO_SITE, at=NOW - 1000), hung(2, HANG, at=NOW - 100)],
     Options(on_hang="restart", max_restarts=2, restart_window_s=3600), {}, "give_up",
     ["gave up after 2 restart(s) on hang within 1 h (--max-restarts 2)"]),
    ("no restart allowed at all", HANG, 1, [], Options(on_hang="restart", max_restarts=0), {}, "give_up",
     ["gave up after 0 restart(s)"]),
    ("kill", HANG, 1, [], Options(on_hang="kill"), {}, "kill", ["--on-hang kill"]),
    ("dump (the default)", HANG, 1, [], Options(), {}, "dump", ["stacks saved"]),
    ("observe", HANG, 1, [], Options(on_hang="observe"), {}, "observe", ["--on-hang observe"]),
    ("observe-only: would restart", HANG, 1, [], Options(on_hang="restart", max_restarts=3, observe_only=True), {},
     "observe", ["observe-only: would restart: hang at train.py:54 at step 69"]),
    ("observe-only: would give up on the same hang", HANG, 2, [hung(1)],
     Options(on_hang="restart", max_restarts=3, observe_only=True), {}, "observe",
     ["observe-only: would give up: not restarted: the same hang came back"]),
    ("hardware sign: restart without that GPU", MOVED_LINE, 1, [], RESTART3,
     {"signs": [HardwareSign(1, "Xid 79: GPU has fallen off the bus")], "gpus": [0, 1, 2, 3], "gpus_needed": 2},
     "restart", ["GPU 1 reported a hardware fault before the hang (Xid 79: GPU has fallen off the bus)",
                 "CUDA_VISIBLE_DEVICES=0,2,3"]),
    ("hardware sign: every GPU needed, refused", HANG, 1, [], RESTART3,
     {"signs": [HardwareSign(1, "2 uncorrected ECC error(s)")], "gpus": [0, 1], "gpus_needed": 2},
     "give_up", ["not restarted: GPU 1 reported a hardware fault before the hang (2 uncorrected ECC error(s)); "
                 "the job needs 2 GPU(s) and 1 of its 2 GPU(s) have no fault"]),
    ("hardware sign with GPUs unknown: refused", HANG, 1, [], RESTART3,
     {"signs": [HardwareSign(0, "a memory row remap is pending")]}, "give_up", ["not restarted: GPU 0", "not known"]),
    ("hardware sign under kill: named", HANG, 1, [], Options(on_hang="kill"),
     {"signs": [HardwareSign(1, "Xid 48: double-bit ECC error")]}, "kill", ["GPU 1 reported a hardware fault"]),
    ("worker fallback first, whatever --on-hang", HANG, 1, [], Options(on_hang="dump", worker_fallback=True),
     {"worker_hang": True}, "restart", ["num_workers=0"]),
    ("worker fallback only once", HANG, 2, [], Options(on_hang="dump", worker_fallback=True, fell_back=True),
     {"worker_hang": True}, "dump", ["stacks saved"]),
]


@pytest.mark.parametrize(("name", "hang", "attempt", "history", "opts", "extra", "action", "words"), CASES,
                         ids=[c[0] for c in CASES])
def test_policy_table(name, hang, attempt, history, opts, extra, action, words):
    act = decide(hang, attempt, history, opts, now=NOW, **extra)
    assert act.action == action, (name, act)
    for w in words:
        assert w in act.reason, (name, act.reason)


def test_back_off_doubles_after_each_restart_in_the_window():
    opts = Options(on_hang="restart", max_restarts=5, backoff_s=10)
    # the first restart: no wait; the second, 10 s after the last start; the third, 20 s ...
    assert decide(HANG, 1, [], opts, now=NOW).delay_s == 0
    second = decide(MOVED_LINE, 2, [hung(1, at=NOW - 4)], opts, now=NOW)
    assert second.action == "restart" and second.delay_s == pytest.approx(6) and "back-off of 6 s" in second.reason
    third = decide(HANG, 3, [hung(1, NO_SITE, at=NOW - 100), hung(2, MOVED_LINE, at=NOW - 5)], opts, now=NOW)
    assert third.delay_s == pytest.approx(15)
    # a start long ago is waited for no more
    assert decide(HANG, 3, [hung(1, NO_SITE, at=NOW - 100), hung(2, MOVED_LINE, at=NOW - 50)], opts, now=NOW).delay_s == 0


def test_the_decision_is_pure_and_round_trips_through_run_json():
    again = HangFacts.from_dict(HANG.to_dict())
    assert again == HANG and same_hang(again, HANG)
    assert HangFacts.from_dict({"mode": 3}) is None and HangFacts.from_dict(None) is None
    assert HangFacts.from_dict({"mode": "stalled", "step": "5", "site": ["x"]}) == HangFacts("stalled", "")
    a = decide(HANG, 2, [hung(1)], RESTART3, now=NOW)
    assert a == decide(HANG, 2, [hung(1)], RESTART3, now=NOW) and isinstance(a, Action) and a.stops
    assert a.same_as == 1
