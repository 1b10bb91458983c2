"""/proc read in one place (ups.status.procfs), on real processes: a command line a process
rewrote in place (no NUL at its end), a name with parentheses and spaces, a zombie; and every
part of ups that reads a process's arguments or stat reads them the same way."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from helpers import wait_for

from ups.status import procfs

# Overwrites its whole argument and environment area with a title and spaces, no NUL: the
# kernel then serves /proc/PID/cmdline as that text with no NUL at all (setproctitle's way).
RETITLE = textwrap.dedent('''\
    import ctypes, sys, time
    data = open("/proc/self/stat", "rb").read()
    f = data[data.rindex(b")") + 2:].split()  # f[0] is stat's field 3
    arg_start, env_end = int(f[48 - 3]), int(f[51 - 3])
    n = env_end - arg_start
    ctypes.memmove(arg_start, (sys.argv[1].encode() + b" " * n)[:n], n)
    with open("/proc/self/comm", "w") as fh:
        fh.write(sys.argv[2])
    print("ready", flush=True)
    time.sleep(60)
''')


def _start(tmp_path: Path, title: str, name: str) -> subprocess.Popen:
    script = tmp_path / "retitle.py"
    script.write_text(RETITLE)
    proc = subprocess.Popen([sys.executable, str(script), title, name], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_a_command_line_rewritten_in_place_keeps_its_last_argument(tmp_path):
    proc = _start(tmp_path, "trainer --rank 3 --shard /data/part-0003.h5", "tr")
    try:
        raw = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
        assert raw.startswith(b"trainer --rank 3") and b"\0" not in raw  # the format under test
        want = ["trainer", "--rank", "3", "--shard", "/data/part-0003.h5"]
        assert procfs.cmdline(proc.pid) == want
        from ups.attach.find import cmdline
        from ups.runs.ownership import cmdline as proven_cmdline

        assert cmdline(proc.pid) == want and proven_cmdline(proc.pid) == want  # old find.cmdline: []
    finally:
        proc.kill()
        proc.wait()


def test_the_usual_command_line_and_one_with_empty_arguments():
    assert procfs.parse_cmdline(b"python\0train.py\0\0--x\0") == ["python", "train.py", "", "--x"]
    assert procfs.parse_cmdline(b"python\0train.py") == ["python", "train.py"]  # a read cut short
    assert procfs.parse_cmdline(b"trainer --rank 3\0") == ["trainer", "--rank", "3"]  # a shorter title
    assert procfs.parse_cmdline(b"") == []
    assert procfs.cmdline(os.getpid()) == sys.orig_argv


def test_stat_reads_a_name_with_parentheses_and_spaces(tmp_path):
    proc = _start(tmp_path, "x", "a) (b c")
    try:
        st = procfs.stat(proc.pid)
        assert st is not None and st.comm == "a) (b c" and st.ppid == os.getpid() and st.state in "RS"
        assert st.session == os.getsid(proc.pid) and st.pgrp == os.getpgid(proc.pid)
        from ups.attach.find import stat_of
        from ups.runs.ownership import proc_info

        assert stat_of(proc.pid) == (st.state, os.getpid(), os.getsid(proc.pid))
        info = proc_info(proc.pid)
        assert info is not None and (info.ppid, info.sid, info.uid) == (os.getpid(), os.getsid(proc.pid), os.getuid())
    finally:
        proc.kill()
        proc.wait()


def test_a_zombie_is_gone_for_every_reader():
    from ups.attach.find import stat_of
    from ups.status.procs import is_zombie, process_start_time

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    st = wait_for(lambda: (s := procfs.stat(proc.pid)) is not None and s.state == "Z" and s, 30, interval=0.05,
                  message="the child a zombie")
    try:
        assert st.gone and is_zombie(proc.pid) and stat_of(proc.pid) is None and process_start_time(proc.pid) is None
    finally:
        proc.wait()
    assert procfs.stat(proc.pid) is None and procfs.cmdline(proc.pid) is None and procfs.status(proc.pid) is None


def test_the_machines_busy_ticks_grow_while_a_process_spins():
    """``/proc/stat``'s first line, busy time only: a process spinning for 0.5 s adds about that much."""
    before = procfs.busy_ticks()
    assert before is not None and before > 0
    subprocess.run([sys.executable, "-c", "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5: pass"],
                   check=True)
    assert procfs.busy_ticks() - before >= 0.4 * procfs.clock_ticks()
