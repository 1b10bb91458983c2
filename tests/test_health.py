"""classify_health: examples with their reasons, and invariants checked by hypothesis."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ups.status.health import Health, Thresholds, classify_health, classify_run, peer_median_rates
from ups.status.procs import StaticProcessTable
from ups.status.record import StatusRecord

pytestmark = pytest.mark.notorch  # also run on each other Python, without torch (tests/test_pythons.py)

T0 = 1_800_000_000.0
PID, START = 4242, 1_799_999_000.0
ALIVE = StaticProcessTable({PID: START})
GONE = StaticProcessTable({})
REUSED = StaticProcessTable({PID: START + 50})


def rec(**kw) -> StatusRecord:
    base = dict(
        run_id="r", role="rank", name="rank-0", pid=PID, pid_start=START, host="h", rank=0,
        started_at=T0, heartbeat_at=T0, progress_at=T0, phase_at=T0, phase="train", step=5,
    )
    base.update(kw)
    return StatusRecord(**base)


def test_fresh_heartbeat_and_progress_is_ok():
    assert classify_health(rec(), T0 + 1, ALIVE).health is Health.OK


def test_stale_progress_with_live_heartbeat_is_stalled_with_reason():
    v = classify_health(rec(phase="data.open", heartbeat_at=T0 + 73.5), T0 + 74, ALIVE)
    assert v.health is Health.STALLED
    assert v.reason == "no progress for 74 s in phase data.open (limit 60 s: the default, until intervals are known)"


def test_stall_limits_learn_from_the_process_and_keep_their_own_for_first_step_and_eval():
    fast = rec(phase="train", interval_p99=0.05, heartbeat_at=T0 + 2.5)
    v = classify_health(fast, T0 + 3, ALIVE)  # 50 ms steps: shown stalled after its rhythm's 2 s floor, not 60 s
    assert v.health is Health.STALLED and v.reason.endswith("(limit 2.0 s: its rhythm's floor; p99 interval 0.1 s)")
    assert classify_health(fast.with_changes(heartbeat_at=T0 + 1.5), T0 + 1.8, ALIVE).health is Health.OK
    steady = rec(phase="train", interval_p99=0.5, heartbeat_at=T0 + 5.5)  # 2 steps/s: 10 x its p99 interval
    v = classify_health(steady, T0 + 6, ALIVE)
    assert v.health is Health.STALLED and "(limit 5.0 s: its rhythm, 10 x p99 interval 0.5 s)" in v.reason
    # What an automatic action waits for is the learned limit, as before: the floor, 10 s.
    assert Thresholds().stall_limit("train", 0.05, rhythm=False) == (10.0, "the floor; p99 interval 0.1 s")
    slow = rec(phase="train", interval_p99=30.0, heartbeat_at=T0 + 119.5)
    assert classify_health(slow, T0 + 120, ALIVE).health is Health.OK  # 30 s steps: 5 x 30 s = 150 s
    v = classify_health(slow.with_changes(heartbeat_at=T0 + 159.5), T0 + 160, ALIVE)
    assert v.health is Health.STALLED and "(limit 2 min: 5 x p99 interval 30 s)" in v.reason
    first = rec(step=0, phase="train", heartbeat_at=T0 + 299.5)  # compiling the first step
    assert classify_health(first, T0 + 300, ALIVE).health is Health.STARTING
    evaluating = rec(phase="eval", interval_p99=0.05, heartbeat_at=T0 + 299.5)
    assert classify_health(evaluating, T0 + 300, ALIVE).health is Health.OK
    fixed = Thresholds.from_dict({"stalled_after": 2})  # --stalled-after / a config: one fixed limit
    assert classify_health(slow.with_changes(heartbeat_at=T0 + 2.5), T0 + 3, ALIVE, fixed).health is Health.STALLED


def test_stale_heartbeat_with_live_pid_is_unresponsive():
    v = classify_health(rec(phase="data.open"), T0 + 12, ALIVE)
    assert v.health is Health.UNRESPONSIVE
    assert "no heartbeat for 12 s in phase data.open" in v.reason


def test_gone_or_reused_pid_is_dead():
    assert classify_health(rec(), T0 + 1, GONE).health is Health.DEAD
    v = classify_health(rec(), T0 + 1, REUSED)
    assert v.health is Health.DEAD and "reused" in v.reason


def test_an_attached_worker_gone_since_its_observers_last_look_is_not_dead_yet():
    """ups attach's observer writes a worker's record from outside once a second; a DataLoader
    worker that ended in between (every epoch's generation does) is not called dead before the
    observer has looked again (it then writes its end: done, or a death)."""
    w = rec(role="worker", name="rank-0-worker-1", worker=1, metrics={"attached": True})
    v = classify_health(w, T0 + 1, GONE)
    assert v.health is Health.OK and "notes how it ended at its next look" in v.reason
    assert classify_health(w, T0 + 4, GONE).health is Health.DEAD  # the observer never looked again
    assert classify_health(w.with_changes(role="helper", name="rank-0-helper-9"), T0 + 1, GONE).health is Health.OK
    assert classify_health(rec(metrics={"attached": True}), T0 + 1, GONE).health is Health.DEAD  # a rank: at once
    assert classify_health(w.with_changes(metrics={}), T0 + 1, GONE).health is Health.DEAD  # a worker that reports itself


def test_startup_grace_and_per_phase_limits():
    fixed = Thresholds.from_dict({"stalled_after": 60})
    starting = rec(step=0, phase="dist.init", heartbeat_at=T0 + 20)
    assert classify_health(starting, T0 + 20, ALIVE, fixed).health is Health.STARTING
    assert classify_health(starting.with_changes(heartbeat_at=T0 + 90), T0 + 90, ALIVE, fixed).health is Health.STALLED
    t = Thresholds.from_dict({"stalled_after": 60, "phase_stalled_after": {"dist.init": 300}})
    assert classify_health(starting.with_changes(heartbeat_at=T0 + 90), T0 + 90, ALIVE, t).health is Health.OK
    idle = rec(phase="idle", heartbeat_at=T0 + 999)
    assert classify_health(idle, T0 + 1000, ALIVE).health is Health.OK


def test_slow_against_peers_median():
    records = [
        rec(name="rank-0", rank=0, rate=10.0),
        rec(name="rank-1", rank=1, rate=9.0),
        rec(name="rank-2", rank=2, rate=3.0),
    ]
    verdicts = classify_run(records, T0 + 1, ALIVE, local_host="h")
    assert verdicts["rank-2"].health is Health.SLOW
    assert "peers' median 9" in verdicts["rank-2"].reason
    assert verdicts["rank-0"].health is Health.OK
    assert peer_median_rates(records[:1]) == {"rank-0": None}  # one process has no peers


def test_remote_records_skip_the_pid_check():
    verdicts = classify_run([rec(host="other-node")], T0 + 1, GONE, local_host="h")
    assert verdicts["rank-0"].health is Health.OK


# ----------------------------------------------------------------------- invariants
states = st.sampled_from(["running", "done", "failed"])
tables = st.sampled_from([ALIVE, GONE, REUSED])
offsets = st.floats(min_value=0, max_value=500, allow_nan=False)


@st.composite
def records(draw):
    hb = draw(offsets)
    prog = draw(st.floats(min_value=0, max_value=hb, allow_nan=False))
    return rec(
        state=draw(states),
        heartbeat_at=T0 + hb,
        progress_at=T0 + prog,
        phase_at=T0 + draw(st.floats(min_value=0, max_value=prog, allow_nan=False)),
        step=draw(st.integers(min_value=0, max_value=100)),
        phase=draw(st.sampled_from(["train", "idle", "data.open", "dist.init"])),
        rate=draw(st.none() | st.floats(min_value=0, max_value=100, allow_nan=False)),
        error=draw(st.none() | st.just("boom")),
    )


@settings(max_examples=300, deadline=None)
@given(r=records(), table=tables, later=offsets, median=st.none() | st.floats(0, 100, allow_nan=False))
def test_final_state_wins(r, table, later, median):
    v = classify_health(r, r.heartbeat_at + later, table, peer_median_rate=median)
    if r.state == "done":
        assert v.health is Health.DONE
    elif r.state == "failed":
        assert v.health is Health.FAILED
    else:
        assert v.health not in (Health.DONE, Health.FAILED)


@settings(max_examples=300, deadline=None)
@given(r=records(), later=offsets)
def test_dead_pid_is_never_ok(r, later):
    for table in (GONE, REUSED):
        v = classify_health(r.with_changes(state="running"), r.heartbeat_at + later, table)
        assert v.health is Health.DEAD


@settings(max_examples=500, deadline=None)
@given(r=records(), table=tables, a=offsets, b=offsets, median=st.none() | st.floats(0, 100, allow_nan=False))
def test_time_passing_never_makes_a_record_healthier(r, table, a, b, median):
    t1, t2 = sorted((a, b))
    now1, now2 = r.heartbeat_at + t1, r.heartbeat_at + t2
    v1 = classify_health(r, now1, table, peer_median_rate=median)
    v2 = classify_health(r, now2, table, peer_median_rate=median)
    assert v2.health.severity >= v1.health.severity, (v1, v2)


@settings(max_examples=200, deadline=None)
@given(r=records(), later=offsets)
def test_every_verdict_has_a_reason(r, later):
    v = classify_health(r, r.heartbeat_at + later, ALIVE)
    assert v.reason
