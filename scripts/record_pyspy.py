"""Record py-spy's dumps of tests/data/pyspy/program.py with each py-spy binary given, as the
format samples tests/test_pyspy_format.py reads: ``--json --nonblocking --locals`` (what ups
runs), ``--json --native`` (C frames among the Python ones) and the text form (kept for
reference). Run it when a new py-spy release appears:

    pip install --no-deps --target /tmp/pyspy-0.4.1 py-spy==0.4.1
    python scripts/record_pyspy.py /tmp/pyspy-0.4.1/bin/py-spy [$(which py-spy) ...]

It prints one JSON line: the versions recorded and the files written.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent / "tests" / "data" / "pyspy"


def version(exe: str) -> str:
    return subprocess.run([exe, "--version"], capture_output=True, text=True, check=True).stdout.split()[-1]


def record(exe: str) -> list[str]:
    v = version(exe)
    proc = subprocess.Popen([sys.executable, str(HERE / "program.py")], stdout=subprocess.PIPE, text=True)
    written = []
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        time.sleep(0.5)  # the spinner thread is running, the main thread asleep in __getitem__
        # ups runs --json --nonblocking (and --locals for a worker); --native pauses the process
        # (py-spy refuses it with --nonblocking), so ups never asks for it, but a reader meets it.
        for form, flags in (("json", ["--json", "--nonblocking", "--locals"]), ("txt", ["--nonblocking", "--locals"]),
                            ("native.json", ["--json", "--native"])):
            res = subprocess.run([exe, "dump", "--pid", str(proc.pid), *flags], capture_output=True, text=True,
                                 timeout=30)
            if res.returncode != 0:  # 0.3.14 cannot merge native frames on Python 3.11: nothing to keep
                print(f"py-spy {v} {' '.join(flags)}: {res.stderr.strip()}", file=sys.stderr)
                continue
            out = res.stdout.replace(str(proc.pid), "PID")  # the text names the pid; the JSON's threads keep theirs
            if form.endswith("json"):
                threads = json.loads(res.stdout)
                for t in threads:
                    if t.get("os_thread_id") == proc.pid:
                        t["os_thread_id"] = 4242  # the main thread is the one whose id is the pid: say so with 4242
                    t.pop("pid", None)
                out = json.dumps(threads, indent=1) + "\n"
            path = HERE / f"dump-{v}.{form}"
            path.write_text(out)
            written.append(path.name)
    finally:
        proc.kill()
        proc.wait()
    return written


def main(argv: list[str]) -> int:
    files = [name for exe in argv for name in record(exe)]
    print(json.dumps({"recorded": [version(exe) for exe in argv], "files": files}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
