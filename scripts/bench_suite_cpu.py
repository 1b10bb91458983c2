"""Where the test suite's CPU goes: each test's share of the box's CPU-seconds, its jobs included.

    python scripts/bench_suite_cpu.py [--out FILE] [-- PYTEST ARGS...]

runs ``python -m pytest`` with the given arguments (default: the README's ``-q -n 4 --dist
loadgroup``) and samples /proc every 0.2 s meanwhile. A process belongs to the test named in its
environment's ``PYTEST_CURRENT_TEST`` (pytest sets it while a test runs, and every process the
test starts inherits it), else to its parent's test (a job whose launcher cleaned its
environment); a pytest worker's own CPU goes to the test it runs at that moment (a plugin loaded
into pytest writes it down). Processes that were running before the start are not counted.

CPU is each process's utime + stime at its last sample: a process's last < 0.2 s, and one that
lives less than that, are missed (``box_busy_cpu_s``, from /proc/stat, is the whole box's).
Prints one JSON line: the wall time, the box's busy CPU-seconds, what was attributed, the files
and tests that cost most; ``--out`` writes every test's figure as JSON.

Each process is also named by kind ("ups status", "torchrun agent", a script's name), summed over
the run and per test in `--out`.

The suite is CPU-bound on a 2-core box (docs/testing.md, "Running the suite"): this is the
measure of what a change to it saves.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from ups.status import procfs  # the one reader of /proc

REPO = Path(__file__).resolve().parents[1]
TICK = procfs.clock_ticks()
PLUGIN = '''import os
_DIR = os.environ["UPS_SUITE_CPU_DIR"]
def pytest_runtest_logstart(nodeid, location):
    with open(os.path.join(_DIR, f"cur.{os.getpid()}"), "w") as f:
        f.write(nodeid)
def pytest_runtest_logfinish(nodeid, location):
    with open(os.path.join(_DIR, f"cur.{os.getpid()}"), "w") as f:
        f.write("")
'''


def proc_stat(pid: str) -> tuple[int, int, int] | None:
    """(ppid, utime + stime in ticks, start time) of a process, or None when it is gone."""
    st = procfs.stat(int(pid))
    return None if st is None else (st.ppid, st.utime + st.stime, st.starttime)


def kind_of(pid: str) -> str:
    """What a process is, in a word or two: "ups status", "torchrun agent", a script's name."""
    argv = [a for a in procfs.cmdline(int(pid)) or [] if a]
    if not argv:
        return "?"
    names = [os.path.basename(a) for a in argv]
    if "ups" in argv and argv[argv.index("ups") - 1] == "-m" or names[0] == "ups":
        i = argv.index("ups") + 1 if "ups" in argv else 1
        sub = next((a for a in argv[i:] if not a.startswith("-")), "")
        return f"ups {sub}".strip()
    if "torch.distributed.run" in argv or "torchrun" in names[:2]:
        return "torchrun agent"
    if "pytest" in argv or "xdist" in " ".join(argv[:3]):
        return "pytest"
    if names[0].startswith("python"):
        rest = [a for a in argv[1:] if not a.startswith("-")]
        if "-m" in argv:
            return "python -m " + argv[argv.index("-m") + 1]
        if "-c" in argv:
            return "python -c"
        return os.path.basename(rest[0]) if rest else "python"
    return names[0]


def test_in_environ(pid: str) -> str | None:
    test = (procfs.environ(int(pid)) or {}).get("PYTEST_CURRENT_TEST")
    return test.rsplit(" (", 1)[0] if test else None


class Sampler(threading.Thread):
    def __init__(self, cur_dir: str) -> None:
        super().__init__(daemon=True)
        self.cur_dir, self.stop = cur_dir, threading.Event()
        self.seen: dict[tuple[int, int], list] = {}  # (pid, start) -> [test or None, CPU counted so far]
        self.by_pid: dict[int, tuple[int, int]] = {}
        self.cpu: collections.Counter = collections.Counter()
        self.kinds: collections.Counter = collections.Counter()  # (test, kind) -> ticks
        self.look(baseline=True)

    def running_tests(self) -> dict[int, str]:
        """The pytest processes' tests of the moment, by pid (what the plugin wrote down)."""
        now = {}
        for name in os.listdir(self.cur_dir):
            if name.startswith("cur."):
                try:
                    with open(os.path.join(self.cur_dir, name)) as f:
                        now[int(name[4:])] = f.read().strip() or "(pytest worker between tests)"
                except (OSError, ValueError):
                    continue
        return now

    def look(self, baseline: bool = False) -> None:
        workers = self.running_tests()
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            st = proc_stat(pid)
            if st is None:
                continue
            ppid, cpu, start = st
            key = (int(pid), start)
            entry = self.seen.get(key)
            if entry is None:
                if baseline:
                    entry = self.seen[key] = ["(running before)", cpu, "?"]
                else:
                    test = test_in_environ(pid) or workers.get(ppid)
                    if test is None and ppid in self.by_pid:
                        test = self.seen[self.by_pid[ppid]][0]
                    entry = self.seen[key] = [test or "(unattributed)", 0, kind_of(pid)]
                self.by_pid[int(pid)] = key
            delta, entry[1] = cpu - entry[1], cpu
            owner = workers.get(int(pid)) or entry[0]
            if delta > 0 and owner != "(running before)":
                self.cpu[owner] += delta
                self.kinds[owner, "pytest" if int(pid) in workers else entry[2]] += delta

    def run(self) -> None:
        while not self.stop.wait(0.2):
            self.look()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="write every test's CPU-seconds here (JSON)")
    ap.add_argument("pytest_args", nargs="*", default=["-q", "-n", "4", "--dist", "loadgroup"])
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="suite-cpu-") as tmp:
        Path(tmp, "ups_suite_cpu_plugin.py").write_text(PLUGIN)
        env = {**os.environ, "UPS_SUITE_CPU_DIR": tmp,
               "PYTHONPATH": os.pathsep.join(filter(None, [tmp, os.environ.get("PYTHONPATH")]))}
        sampler = Sampler(tmp)
        b0, t0 = procfs.busy_ticks() or 0, time.monotonic()
        sampler.start()
        rc = subprocess.call([sys.executable, "-m", "pytest", "-p", "ups_suite_cpu_plugin", *args.pytest_args],
                             cwd=REPO, env=env, stdout=sys.stderr)
        sampler.stop.set()
        sampler.join()
        wall, busy = time.monotonic() - t0, ((procfs.busy_ticks() or 0) - b0) / TICK
    tests = {k: v / TICK for k, v in sampler.cpu.items()}
    files: collections.Counter = collections.Counter()
    for name, cpu in tests.items():
        files[name.split("::")[0]] += cpu
    kinds: collections.Counter = collections.Counter()
    by_test: dict[str, dict[str, float]] = collections.defaultdict(dict)
    for (test, kind), ticks in sampler.kinds.items():
        kinds[kind] += ticks / TICK
        by_test[test][kind] = round(ticks / TICK, 2)
    if args.out:
        Path(args.out).write_text(json.dumps(
            {t: {"cpu_s": round(c, 2), "by_kind": dict(sorted(by_test[t].items(), key=lambda kv: -kv[1]))}
             for t, c in sorted(tests.items(), key=lambda kv: -kv[1])}, indent=1))
    print(json.dumps({
        "pytest_rc": rc, "wall_s": round(wall, 1), "box_busy_cpu_s": round(busy, 1),
        "box_busy_cores": round(busy / wall, 2) if wall else None,
        "attributed_cpu_s": round(sum(tests.values()), 1),
        "files": {f: round(c, 1) for f, c in files.most_common(15)},
        "tests": {t: round(c, 1) for t, c in sorted(tests.items(), key=lambda kv: -kv[1])[:10]},
        "kinds": {k: round(c, 1) for k, c in kinds.most_common(15)},
    }))
    return rc


if __name__ == "__main__":
    sys.exit(main())
