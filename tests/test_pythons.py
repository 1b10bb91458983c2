"""ups on every other Python that ``requires-python`` allows, installed as a user without torch has it.

The suite runs on the Python whose torch wheel is on disk (3.11). For each other Python present
(3.10, 3.12, 3.13, 3.14: this box's pyenv has the first three), a venv of that Python gets ups (editable,
``--no-deps``) and every dependency of pyproject.toml but torch, and then:

- every file of ups, console, tests and scripts compiles on it, with its warnings as errors
  (3.12 made an invalid escape a SyntaxWarning);
- a plain script under that venv's ``ups launch python`` runs instrumented (the sitecustomize
  starts in the user's program, on the user's Python) and its records say so: the run
  succeeded, and rank 0's record was written by the script's own process;
- the part of the suite that needs no torch (``-m notorch``: the records, the readers, ``why
  --log``, the rules, the CLI's help and errors, the config, the import hygiene) passes in it,
  with DeprecationWarnings as errors.

The venvs are kept between runs under ``$UPS_TEST_VENVS`` (default: the temp folder's
``ups-test-venvs``), one per Python and pyproject.toml, shared by every checkout (a fresh
clone's CI run included): a first run builds them (about a minute each on a busy 2-core box),
later ones reuse them. The code under test is always this checkout's: every process in the venv
runs with it first on ``PYTHONPATH``, as conftest.py does for the suite's own subprocesses. A Python that is not on the machine is skipped, saying
where it was looked for.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import tomllib
from helpers import wait_for

REPO = Path(__file__).resolve().parents[1]
OTHERS = [minor for minor in (10, 12, 13, 14) if (3, minor) != sys.version_info[:2]]
TEST_TOOLS = ("pytest", "pytest-timeout", "hypothesis")  # what the torch-free tests use, from the test extra
CACHE = Path(os.environ.get("UPS_TEST_VENVS") or Path(tempfile.gettempdir()) / "ups-test-venvs")
RECIPE = "2"  # bump when venv_for builds a venv differently: every cached one is then built again
KEEP_DAYS = 7  # a venv no run has used for this long is removed when another is built

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def find_python(minor: int) -> tuple[str | None, list[str]]:
    """An interpreter of 3.<minor> that answers, and the places looked at. A pyenv shim on PATH
    names every version but runs only the selected one, so each candidate is asked its version."""
    name = f"python3.{minor}"
    roots = [os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")]
    candidates = [shutil.which(name)]
    for root in roots:
        candidates += sorted(glob.glob(os.path.join(root, "versions", f"3.{minor}.*", "bin", name)), reverse=True)
    candidates += [f"/usr/bin/{name}", f"/usr/local/bin/{name}"]
    looked = []
    for exe in dict.fromkeys(c for c in candidates if c):
        looked.append(exe)
        if not os.access(exe, os.X_OK):
            continue
        try:
            res = subprocess.run([exe, "-c", "import sys, venv, ensurepip; print(sys.version_info[:2])"],
                                 capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if res.returncode == 0 and res.stdout.strip() == f"(3, {minor})":
            return exe, looked
    return None, looked


def _clean_env(**extra: str) -> dict[str, str]:
    """This session's environment without what points at the suite's own Python and pytest
    (conftest.py's PYTHONPATH, xdist's worker variables), with this checkout first on PYTHONPATH:
    the venv is shared, its editable ups may be another checkout's."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV") and not k.startswith(("PYTEST_", "UPS_RUN"))}
    env["PYTHONPATH"] = str(REPO)
    env.update(extra)
    return env


def _run(args: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
    res = subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kwargs)
    assert res.returncode == 0, f"{' '.join(args[:4])} …: exit {res.returncode}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return res


def _requirements() -> list[str]:
    """pyproject.toml's dependencies without torch, and the test tools of its test extra."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]

    def name(req: str) -> str:
        return re.match(r"[A-Za-z0-9_.-]+", req).group(0).lower().replace("_", "-")

    deps = [r for r in project["dependencies"] if name(r) != "torch"]
    tools = [r for r in project["optional-dependencies"]["test"] if name(r) in TEST_TOOLS]
    assert len(tools) == len(TEST_TOOLS), tools
    return deps + tools


def venv_for(python: str) -> Path:
    """A venv of ``python`` holding ups without torch: built once per Python and pyproject.toml,
    under a lock (the suite's workers and other checkouts share the cache)."""
    version = _run([python, "-c", "import sys; print(sys.version)"], 30).stdout.strip()
    key = hashlib.sha256("\0".join([RECIPE, version, (REPO / "pyproject.toml").read_text()]).encode())
    minor = ".".join(version.split(".")[:2])
    mine = f"py{minor}-"  # this Python
    venv = CACHE / f"{mine}{key.hexdigest()[:12]}"
    ready = venv / "ups-test-ready"
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f"{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not ready.exists():
            _prune(mine)
            shutil.rmtree(venv, ignore_errors=True)  # a build that was cut short
            made = subprocess.run([python, "-m", "venv", str(venv)], capture_output=True, text=True, timeout=120)
            if made.returncode != 0 and "ensurepip" in made.stdout + made.stderr:  # Debian's, without python3.X-venv
                shutil.rmtree(venv, ignore_errors=True)
                pytest.skip(f"{python} cannot make a venv with pip: {(made.stdout + made.stderr).strip().splitlines()[0]}")
            assert made.returncode == 0, made.stdout + made.stderr
            pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
            _run([*pip, *_requirements()], 600, env=_clean_env())
            _run([*pip, "--no-deps", "-e", str(REPO)], 300, env=_clean_env())
            ready.write_text(version + "\n")
        os.utime(ready)
    return venv


def _prune(mine: str) -> None:
    """Removes the venvs of the same Python built from another pyproject.toml or recipe, and any
    venv unused for KEEP_DAYS."""
    for old in CACHE.glob("py*/ups-test-ready"):
        if old.parent.name.startswith(mine) or time.time() - old.stat().st_mtime > KEEP_DAYS * 86400:
            with contextlib.suppress(OSError):
                shutil.rmtree(old.parent)
                (CACHE / f"{old.parent.name}.lock").unlink()


@pytest.fixture(params=OTHERS, ids=[f"3.{m}" for m in OTHERS])
def venv(request) -> Path:
    python, looked = find_python(request.param)
    if python is None:
        pytest.skip(f"no Python 3.{request.param} on this machine with venv and ensurepip (looked at: {', '.join(looked)})")
    return venv_for(python)


def test_every_file_compiles_with_warnings_as_errors_and_torch_is_absent(venv):
    check = """
import pathlib, sys
bad = []
for path in sorted(p for top in ("ups", "console", "tests", "scripts") for p in pathlib.Path(top).rglob("*.py")):
    try:
        compile(path.read_bytes(), str(path), "exec")
    except (SyntaxError, ValueError) as exc:
        bad.append(f"{path}: {type(exc).__name__}: {exc}")
print("\\n".join(bad))
import importlib.util
print("torch installed" if importlib.util.find_spec("torch") else "", end="")
"""
    res = _run([str(venv / "bin" / "python"), "-W", "error", "-c", check], 120, cwd=REPO, env=_clean_env())
    assert res.stdout.strip() == "", res.stdout


PLAIN = """\
import os, sys, time
print(f"pid {os.getpid()} python {sys.version_info[0]}.{sys.version_info[1]}", flush=True)


def wait_for_the_go(path):
    while not os.path.exists(path):
        time.sleep(0.05)


for step in range(3):
    print(f"step {step}", flush=True)
    time.sleep(0.3)
wait_for_the_go(sys.argv[1])
"""


def test_a_plain_script_under_ups_launch_python_reports_its_records_and_succeeds(venv, runs_root, tmp_path):
    """The venv's own `ups`, and `python` the venv's: the sitecustomize and the hooks start in the
    user's program on that Python (DeprecationWarnings are errors there), write its record,
    answer the stack-dump signal, and the run ends succeeded."""
    (tmp_path / "prog.py").write_text(PLAIN)
    go = tmp_path / "go"
    env = _clean_env(PATH=f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}", UPS_RUNS_DIR=str(runs_root),
                     UPS_HEARTBEAT_INTERVAL="0.3")
    ups = str(venv / "bin" / "ups")
    try:
        res = _run([ups, "launch", "python", "--detach", "--json", "-W", "error::DeprecationWarning", "prog.py", str(go)],
                   120, cwd=tmp_path, env=env)
        run = Path(json.loads(res.stdout)["run_dir"])
        minor = venv.name.split("-")[0].removeprefix("py")
        pid = wait_for(lambda: re.search(rf"pid (\d+) python {re.escape(minor)}\b", _log(run)), 60,
                       message="the program's first line")  # it runs on the venv's Python
        record = wait_for(lambda: _record(run), 60, message="rank 0's record")
        assert record["pid"] == int(pid.group(1)), record  # written from inside the program
        stacks = wait_for(lambda: "wait_for_the_go" in (out := _run([ups, "stacks", str(run)], 60, env=env).stdout) and out,
                          60, interval=0.5, message="the program's stack")
        assert "prog.py" in stacks.split("Current thread")[-1], stacks
    finally:
        go.touch()
    wait_for(lambda: json.loads((run / "run.json").read_text()).get("state") in ("succeeded", "failed", "killed"), 60,
             message="the run's end")
    status = json.loads(_run([ups, "status", "--json", str(run)], 60, env=env).stdout)
    assert status["state"] == "succeeded", status  # read back by the venv's ups
    record = _record(run)
    assert record["state"] == "done" and record["exit_code"] == 0, record
    assert record["heartbeat_at"] - record["started_at"] > 0.6, record  # its heartbeat thread ran


def _log(run: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in (run / "logs").glob("*.log"))


def _record(run: Path) -> dict | None:
    try:
        return json.loads((run / "status" / "rank-0.json").read_text())
    except (OSError, ValueError):
        return None


def test_the_torch_free_part_of_the_suite_passes(venv, tmp_path):
    files = sorted(str(p.relative_to(REPO)) for p in (REPO / "tests").glob("test_*.py")
                   if "mark.notorch" in p.read_text() and p.name != Path(__file__).name)
    assert len(files) >= 8, files
    res = subprocess.run([str(venv / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "notorch",
                          "--basetemp", str(tmp_path / "inner"), *files],
                         # A name 3.12 or 3.13 deprecates (datetime.utcnow ...) fails here, in the tests'
                         # own process and in every ups they start.
                         cwd=REPO, env=_clean_env(PYTHONWARNINGS="error::DeprecationWarning"), capture_output=True,
                         text=True, timeout=800)
    assert res.returncode == 0, res.stdout[-6000:] + res.stderr[-2000:]
    assert re.search(r"\d+ passed", res.stdout), res.stdout[-2000:]
