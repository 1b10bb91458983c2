"""The kernel's taskstats exit records (ups.status.taskstats, the one reader of them): recorded
messages of a real kernel parsed, a thread's record never taken for its process's, and a live
listener hearing a child's exit status where this process may listen (root)."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import wait_for

from ups.status import taskstats

pytestmark = pytest.mark.notorch  # also run on each other Python, without torch (tests/test_pythons.py)

RECORDED = sorted((Path(__file__).parent / "data" / "taskstats").glob("exits-*.json"))


@pytest.mark.parametrize("path", RECORDED, ids=[p.stem for p in RECORDED])
def test_recorded_exit_messages_give_each_processs_status_and_name(path):
    data = json.loads(path.read_text())
    assert data["messages"], path
    for m in data["messages"]:
        ended = taskstats.parse_exit(bytes.fromhex(m["payload"]))
        assert ended is not None and ended.pid == m["tgid"], (data["kernel"], m["what"])
        assert (ended.code, ended.comm) == (m["expect"]["code"], m["expect"]["comm"]), (data["kernel"], m["what"], ended)
        assert ended.started > 1_600_000_000  # ac_btime: the process's start, in seconds since the epoch
    killed = next(taskstats.parse_exit(bytes.fromhex(m["payload"])) for m in data["messages"] if m["expect"]["code"] == -9)
    assert killed.describe() == "killed by SIGKILL"


def test_a_threads_record_and_other_commands_are_not_a_processs_exit():
    payload = bytearray(bytes.fromhex(json.loads(RECORDED[0].read_text())["messages"][0]["payload"]))
    # the record's pid attribute is the thread's id; ac_pid (the thread group's) stays the process's
    at = payload.index(struct.pack("HH", 8, taskstats.TASKSTATS_TYPE_PID))
    (pid,) = struct.unpack_from("I", payload, at + 4)
    struct.pack_into("I", payload, at + 4, pid + 1)
    assert taskstats.parse_exit(bytes(payload)) is None
    assert taskstats.parse_exit(b"\x01" + bytes(payload[1:])) is None  # TASKSTATS_CMD_GET, not NEW
    assert taskstats.parse_exit(bytes(payload[:40])) is None  # cut short


def test_a_live_listener_hears_a_childs_exit_status_and_never_a_reused_pids():
    listener = taskstats.start()
    if listener is None:
        pytest.skip("the kernel's taskstats is not open to this process (not root, or a kernel without it)")
    try:
        child = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(7)"])
        child.wait()
        started = time.time()
        ended = wait_for(lambda: listener.exit_of(child.pid), 10, interval=0.05, message="the kernel's record")
        assert ended.code == 7 and ended.describe() == "exited with code 7"
        assert listener.exit_of(child.pid, started - 3600) is None  # another process that had the pid an hour ago
    finally:
        listener.close()
    assert listener.thread.join(5) is None and not listener.thread.is_alive()
