"""The reader reports bad status files instead of raising."""

from __future__ import annotations

import json
import os
import time

import pytest

from ups.status.reader import read_status_dir
from ups.status.record import SCHEMA_VERSION, StatusRecord

pytestmark = pytest.mark.notorch  # also run on each other Python, without torch (tests/test_pythons.py)


def _record(**kw) -> StatusRecord:
    base = dict(run_id="r", role="rank", name="rank-0", pid=os.getpid(), pid_start=1.0, host="h", rank=0)
    base.update(kw)
    return StatusRecord(**base)


def test_valid_record_round_trips(tmp_path):
    rec = _record(metrics={"loss": 0.5}, item="a.h5#3", step=7, total=10)
    (tmp_path / "rank-0.json").write_text(rec.to_json())
    snap = read_status_dir(tmp_path)
    assert snap.problems == ()
    assert snap.records == (rec,)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"", "empty file"),
        (_record().to_json().encode()[:40], "not valid JSON"),  # torn write
        (b"\x00\xff garbage \xfe", "not UTF-8"),
        (b"[1, 2, 3]", "expected a JSON object"),
        (json.dumps({**_record().to_dict(), "schema": SCHEMA_VERSION + 1}).encode(), "future schema"),
        (json.dumps({k: v for k, v in _record().to_dict().items() if k != "pid"}).encode(), "missing required key 'pid'"),
        (json.dumps({**_record().to_dict(), "role": "martian"}).encode(), "unknown role"),
        (b" " * (3 << 20), "file too large"),
    ],
    ids=["empty", "torn", "garbage", "not-object", "future-schema", "missing-key", "bad-role", "huge"],
)
def test_bad_files_are_reported_not_raised(tmp_path, content, expected):
    good = _record(name="rank-1", rank=1)
    (tmp_path / "rank-1.json").write_text(good.to_json())
    (tmp_path / "rank-0.json").write_bytes(content)
    snap = read_status_dir(tmp_path)
    assert snap.records == (good,)
    assert len(snap.problems) == 1
    assert snap.problems[0].file == "rank-0.json"
    assert expected in snap.problems[0].problem


def test_unknown_keys_from_a_newer_writer_are_ignored(tmp_path):
    data = {**_record().to_dict(), "new_optional_field": {"x": 1}}
    (tmp_path / "rank-0.json").write_text(json.dumps(data))
    snap = read_status_dir(tmp_path)
    assert snap.problems == () and snap.records[0].name == "rank-0"


def test_temp_files_and_missing_folder(tmp_path):
    (tmp_path / ".rank-0.json.123.tmp").write_text("{")
    assert read_status_dir(tmp_path).problems == ()
    assert read_status_dir(tmp_path / "nope").records == ()


def test_records_sorted_launcher_ranks_workers(tmp_path):
    now = time.time()
    for rec in (
        _record(name="rank-1-worker-0", role="worker", rank=1, worker=0, heartbeat_at=now),
        _record(name="rank-1", rank=1),
        _record(name="launcher", role="launcher", rank=None),
        _record(name="rank-0-worker-1", role="worker", rank=0, worker=1),
        _record(name="rank-0"),
    ):
        (tmp_path / f"{rec.name}.json").write_text(rec.to_json())
    names = [r.name for r in read_status_dir(tmp_path).records]
    assert names == ["launcher", "rank-0", "rank-0-worker-1", "rank-1", "rank-1-worker-0"]


_TRICKY = [None, True, False, 0, 1, -1, 7, 1 << 31, 1 << 63, 2.5, -2.5, 0.0, 1e12, 1e300, float("nan"), float("inf"),
           "", "ok", "running", "rank", "a\x1bb", "a\nb", "é", "\u202e", "x" * 600, "x" * 20_000, [], {}, [1], {"a": 1}]


def test_fast_field_checks_agree_with_the_checks():
    """The reader accepts a value that is already safe without calling its field's check
    (ups.status.safeio.check_object): every field of a record, against values of every kind,
    gives what the check itself gives, or the same refusal."""
    from ups.status.record import RECORD_SPEC
    from ups.status.safeio import BadFile, check_object

    fast = [key for key, check in RECORD_SPEC.items() if getattr(check, "fast", None) is not None]
    assert len(fast) > 30  # the fast forms are there (most fields take them)
    for key in fast:
        for value in _TRICKY:
            try:
                want = ("ok", RECORD_SPEC[key](value))
            except BadFile:
                want = ("refused", None)
            try:
                got = ("ok", check_object({key: value}, RECORD_SPEC)[key])
            except BadFile:
                got = ("refused", None)
            assert repr(got) == repr(want), (key, value)
            if got[0] == "ok":
                assert type(got[1]) is type(want[1]), (key, value)


def test_a_record_with_a_missing_required_field_is_refused(tmp_path):
    data = json.loads(_record().to_json())
    del data["host"]
    (tmp_path / "rank-0.json").write_text(json.dumps(data))
    snap = read_status_dir(tmp_path)
    assert snap.records == ()
    assert "missing required key 'host'" in snap.problems[0].problem
