"""A runs folder is outside input: hostile, broken and odd files never crash, hang or fool ups.

Each case plants files next to a real run (records written by the Reporter of a real launched
job, its real run.json) and asserts what an operator would check: the command answers within
10 s, without a traceback, with one line naming the file and the reason, and everything else
is still shown. The property test at the end throws arbitrary JSON into every field of a
record and of run.json and runs every reader's code in-process.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import run_ups, wait_for

from ups.runs.rundir import RunDir, list_runs

PROGRAM = """\
import sys, time
print("step 1", flush=True)
time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 0.2)
print("done", flush=True)
"""
BOUND_S = 10.0


def copy_run(src: Path, root: Path, name: str | None = None) -> RunDir:
    dst = root / (name or src.name)
    shutil.copytree(src, dst, symlinks=True)
    return RunDir(dst)


def ups(*args: str, root: Path, ok: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess:
    """The real CLI, bounded: within BOUND_S, no traceback, an expected exit code."""
    started = time.monotonic()
    res = run_ups(*args, "--runs-dir", str(root), timeout=60, env={"COLUMNS": "400"})  # one line per problem
    took = time.monotonic() - started
    out = res.stdout + res.stderr
    assert took < BOUND_S, f"`ups {' '.join(args)}` took {took:.1f} s"
    assert "Traceback" not in out, out
    assert res.returncode in ok, f"`ups {' '.join(args)}` exited {res.returncode}: {out}"
    return res


def record(run: RunDir, name: str = "rank-0") -> dict:
    return json.loads((run.status_dir / f"{name}.json").read_text())


def plant_record(run: RunDir, name: str, **fields) -> None:
    """rank-0's real record under another name, with ``fields`` replaced (raw JSON text
    values are spliced in as written: NaN, 1e999, 10**400)."""
    body = dict(record(run), name=name, rank=int(name.split("-")[1]) if name.split("-")[1].isdigit() else 9)
    body.update({k: f"@raw:{k}" if isinstance(v, RawJson) else v for k, v in fields.items()})
    text = json.dumps(body)
    for key, value in fields.items():
        if isinstance(value, RawJson):
            text = text.replace(f'"@raw:{key}"', value)
    (run.status_dir / f"{name}.json").write_text(text)


class RawJson(str):
    """JSON text put into a record as written (what json.dumps would never write)."""


# -- 1 + 2: bad records, FIFOs, devices, links: listed as unreadable, never a hang --------------
BAD_RECORDS = {
    "rank-1": ({"step": "12"}, "'step' is a string, not an integer"),
    "rank-2": ({"pid_start": "yesterday"}, "'pid_start' is a string, not a number"),
    "rank-3": ({"heartbeat_at": "now"}, "'heartbeat_at' is a string, not a number"),
    "rank-4": ({"phase": {"a": 1}}, "'phase' is an object, not a string"),
    "rank-5": ({"rank": "0"}, "'rank' is a string, not an integer"),
    "rank-6": ({"host": ["a", "b"]}, "'host' is a list, not a string"),
    "rank-7": ({"step": RawJson("1" + "0" * 400)}, "'step' a huge number is out of range"),
    "rank-8": ({"heartbeat_at": RawJson("NaN")}, "NaN is not a number ups reads"),
    "rank-9": ({"progress_at": RawJson("1e999")}, "out of range"),
    "rank-10": ({"stack_file": "../../../../etc/shadow"}, "is not a path inside the run folder"),
    "rank-11": ({"pid": True}, "'pid' is true/false, not an integer"),
}


def plant_hostile_files(run: RunDir) -> dict[str, str]:
    """Every kind of bad status file next to the real ones; file name -> expected reason."""
    expected = {}
    for name, (fields, reason) in BAD_RECORDS.items():
        plant_record(run, name, **fields)
        expected[f"{name}.json"] = reason
    (run.status_dir / "rank-12.json").write_text('{"name": ["a"]}')
    expected["rank-12.json"] = "missing or non-integer 'schema'"
    (run.status_dir / "rank-13.json").write_bytes(b'{"schema": 1, "name": "\xff\xfe"}')
    expected["rank-13.json"] = "not UTF-8 text"
    (run.status_dir / "rank-14.json").symlink_to("/dev/zero")
    expected["rank-14.json"] = "a symlink (not followed)"
    os.mkfifo(run.status_dir / "rank-15.json")
    expected["rank-15.json"] = "a FIFO"
    (run.status_dir / "rank-16.json").mkdir()
    expected["rank-16.json"] = "a directory"
    (run.status_dir / "rank-17.json").write_text('["a list"]')
    expected["rank-17.json"] = "expected a JSON object, got list"
    with open(run.status_dir / "rank-18.json", "wb") as fh:
        fh.truncate(3 << 30)  # 3 GiB, sparse: never read
    expected["rank-18.json"] = "file too large"
    return expected


def test_hostile_records_are_listed_with_their_reason_and_the_rest_still_shows(finished_run, tmp_path):
    root = tmp_path / "runs"
    root.mkdir()
    run = copy_run(finished_run, root)
    other = copy_run(finished_run, root, "20990101-000000-other-0001")  # an untouched neighbour
    expected = plant_hostile_files(run)
    os.mkfifo(run.stacks_dir / "rank-0.txt.fifo")  # noise in stacks/ too
    (run.stacks_dir / "rank-0.txt").unlink(missing_ok=True)
    os.mkfifo(run.stacks_dir / "rank-0.txt")  # rank 0's stack file is a FIFO: `ups stacks` must not wait

    status = ups("status", run.run_id, root=root).stdout
    for file, reason in expected.items():
        line = next((ln for ln in status.splitlines() if f"unreadable status file {file}:" in ln), None)
        assert line is not None and reason in line, (file, reason, status)
    assert "rank 0" in status and "launcher" in status and "succeeded" in status

    payload = json.loads(ups("status", run.run_id, "--json", root=root).stdout)
    assert {p["name"] for p in payload["processes"]} == {"launcher", "rank-0"}
    assert {u["file"] for u in payload["unreadable"]} == set(expected)

    runs = json.loads(ups("runs", "--json", root=root).stdout)["runs"]
    by_id = {r["id"]: r for r in runs}
    assert by_id[run.run_id]["state"] == "succeeded" and len(by_id[run.run_id]["unreadable_records"]) == len(expected)
    assert by_id[other.run_id]["state"] == "succeeded" and not by_id[other.run_id]["unreadable_records"]
    assert run.run_id in ups("runs", root=root).stdout

    why = ups("why", run.run_id, root=root, ok=(0, 1)).stdout
    assert run.run_id in why
    stacks = ups("stacks", run.run_id, root=root, ok=(0, 1))
    assert "rank-0.txt: a FIFO" in stacks.stdout + stacks.stderr
    kill = ups("kill", run.run_id, root=root, ok=(0, 1))  # an ended run: nothing to kill, said at once
    assert kill.stdout + kill.stderr
    logs = ups("logs", run.run_id, root=root)
    assert "done" in logs.stdout


def test_bad_manifests_are_listed_with_their_reason(finished_run, tmp_path):
    root = tmp_path / "runs"
    root.mkdir()
    good = copy_run(finished_run, root)
    cases = {
        "a-list": (b'["run"]', "not an object"),
        "b-not-utf8": (b'{"schema": 1, "id": "\xff"}', "not UTF-8 text"),
        "c-created-text": (None, "'created_at' is a string, not a number"),
        "d-launcher-list": (None, "'launcher' is a list, not an object"),
        "e-nan": (None, "NaN is not a number ups reads"),
        "f-dev-zero": ("/dev/zero", "a symlink (not followed)"),
        "g-fifo": ("fifo", "a FIFO"),
        "h-state": (None, "'state' 'exploded' is not one of"),
    }
    manifest = json.loads(good.manifest_path.read_text())
    for name, (content, _) in cases.items():
        run = copy_run(finished_run, root, f"20200101-000000-{name}")
        run.manifest_path.unlink()
        if name == "c-created-text":
            run.manifest_path.write_text(json.dumps({**manifest, "created_at": "today"}))
        elif name == "d-launcher-list":
            run.manifest_path.write_text(json.dumps({**manifest, "launcher": [1, 2]}))
        elif name == "e-nan":
            run.manifest_path.write_text(json.dumps({**manifest, "ended_at": float("nan")}))
        elif name == "h-state":
            run.manifest_path.write_text(json.dumps({**manifest, "state": "exploded"}))
        elif content == "/dev/zero":
            run.manifest_path.symlink_to("/dev/zero")
        elif content == "fifo":
            os.mkfifo(run.manifest_path)
        else:
            run.manifest_path.write_bytes(content)
    rows = {r["id"]: r for r in json.loads(ups("runs", "--json", root=root).stdout)["runs"]}
    assert rows[good.run_id]["state"] == "succeeded" and rows[good.run_id]["problem"] is None
    for name, (_, reason) in cases.items():
        row = rows[f"20200101-000000-{name}"]
        assert "run.json" in row["problem"] and reason in row["problem"], (name, row["problem"])
    text = ups("runs", root=root).stdout
    assert good.run_id in text and all(f"20200101-000000-{n}" in text for n in cases)
    res = ups("status", "20200101-000000-g-fifo", root=root, ok=(2,))
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "run.json: a FIFO" in lines[0]


# -- 2: a FIFO left in a live run never holds up its launcher or a reader ------------------------
@pytest.mark.slow
def test_fifos_in_a_live_run_never_block_its_launcher_or_readers(tmp_path, runs_root):
    prog = tmp_path / "prog.py"
    prog.write_text(PROGRAM)
    res = run_ups("launch", "python", "--detach", "--json", str(prog), "8")
    assert res.returncode == 0, res.stderr
    run = RunDir(json.loads(res.stdout)["run_dir"])
    wait_for(lambda: (run.status_dir / "rank-0.json").exists(), 60, message="rank 0's record")
    os.mkfifo(run.status_dir / "rank-5.json")  # a FIFO named like a record
    os.mkfifo(run.stacks_dir / "rank-5.txt")
    os.mkfifo(run.control_dir / "1-fallback.json")
    status = ups("status", run.run_id, root=runs_root).stdout
    assert "unreadable status file rank-5.json: a FIFO" in status and "rank 0" in status
    # rank 0's stack file swapped for a FIFO: a dump (what the launcher's automatic stacks
    # thread does too) is refused at once with the reason, never waits for a reader.
    (run.stacks_dir / "rank-0.txt").unlink()
    os.mkfifo(run.stacks_dir / "rank-0.txt")
    stacks = ups("stacks", run.run_id, "--rank", "0", root=runs_root, ok=(0, 1))
    assert "stacks/rank-0.txt cannot be written: a FIFO" in stacks.stdout + stacks.stderr, stacks.stdout + stacks.stderr
    # The launcher (its exit watch, its automatic stacks thread) still ends the run truthfully.
    wait_for(lambda: run.read_manifest()["state"] == "succeeded", 60, message="the run to succeed despite the FIFOs")


# -- 7: control requests that cannot be read are rejected once, and never block the next -------
@pytest.mark.slow
def test_bad_control_requests_are_rejected_once_and_fallback_still_answers(tmp_path, runs_root):
    from test_precompute import FAST, events, launch_burgers

    from ups.data.synth import synthesize

    data = tmp_path / "data"
    synthesize(data, "burgers1d", "train", 24, shards=3, seed=1)
    cfg = tmp_path / "fast.yaml"
    cfg.write_text(FAST)
    res, _ = launch_burgers(cfg, data, tmp_path / "c", "--inject", "slow_read:delay=0.2", "--detach", "--json")
    run = RunDir(json.loads(res.stdout)["run_dir"])
    wait_for(lambda: (run.status_dir / "rank-0-worker-0.json").exists(), 90, message="workers up")
    bad = {"0-list.json": "not a JSON object naming a 'request'", "1-string.json": "not a JSON object naming a 'request'",
           "2-truncated.json": "not valid JSON", "3-latin1.json": "not UTF-8 text", "4-dir.json": "a directory",
           "5-fifo.json": "a FIFO"}
    (run.control_dir / "0-list.json").write_text('["fallback"]')
    (run.control_dir / "1-string.json").write_text('"fallback"')
    (run.control_dir / "2-truncated.json").write_text('{"request": "fall')
    (run.control_dir / "3-latin1.json").write_bytes(b'{"request": "fallback\xe9"}')
    (run.control_dir / "4-dir.json").mkdir()
    os.mkfifo(run.control_dir / "5-fifo.json")
    res = run_ups("fallback", run.run_id)
    assert res.returncode == 0 and "falling back" in res.stdout, res.stderr
    handled = wait_for(lambda: events(run, "control.handled"), 30, message="the fallback acknowledged")
    assert handled[0]["result"] == "falling back to num_workers=0"
    rejected = {e["request_file"]: e["reason"] for e in events(run, "control.rejected")}
    assert set(rejected) == set(bad) and all(why in rejected[f] for f, why in bad.items()), rejected
    assert len(events(run, "control.rejected")) == len(bad)  # once each, not every tick
    wait_for(lambda: run.read_manifest()["state"] in ("succeeded", "partial"), 120, message="the run to end")
    assert not list(run.control_dir.glob("*.json"))  # each renamed: .rejected or .done
    assert {p.name for p in run.control_dir.glob("*.rejected")} == {n.replace(".json", ".rejected") for n in bad}


# -- 3: the console says what failed and recovers -----------------------------------------------
class FlakyGpu:
    """The fake NVML provider (no GPU on this machine) whose one snapshot fails."""

    def __init__(self) -> None:
        from ups.gpu.snapshot import FakeProvider

        self.inner = FakeProvider.from_dict({"available": False, "reason": "no GPU on this machine", "devices": []})
        self.fail = False

    def snapshot(self):
        if self.fail:
            raise OSError("NVML: driver went away")
        return self.inner.snapshot()


def test_console_shows_bad_files_and_recovers_when_they_go(finished_run, tmp_path):
    import asyncio

    from test_console import until

    from console.app import UpsConsole

    root = tmp_path / "runs"
    root.mkdir()
    run = copy_run(finished_run, root)

    async def drive() -> None:
        app = UpsConsole(root, refresh=0.2)
        async with app.run_test(size=(120, 36)) as pilot:
            await until(pilot, lambda: app.snapshot and app.snapshot.runs, message="the run listed")
            app.open_run(run.run_id)  # an ended run's row is re-read only while it is open
            await until(pilot, lambda: app.snapshot.detail is not None, message="the run screen")
            plant_record(run, "rank-1", step=RawJson("1" + "0" * 400))
            os.mkfifo(run.status_dir / "rank-2.json")
            (run.status_dir / "rank-3.json").write_text(json.dumps({**record(run), "name": ["x"]}))
            header = await until(pilot, lambda: "rank-2.json: a FIFO" in str(app.screen.query_one("#run-header").render())
                                 and app.screen.query_one("#run-header"), message="the FIFO named on the run screen")
            row = next(r for r in app.snapshot.runs if r.run_id == run.run_id)
            assert row.problem == "3 unreadable status file(s)" and row.state == "succeeded"
            text = str(header.render())
            assert "rank-1.json: 'step' a huge number is out of range" in text and "rank-3.json: 'name'" in text
            for name in ("rank-1.json", "rank-2.json", "rank-3.json"):
                (run.status_dir / name).unlink()
            await until(pilot, lambda: "unreadable" not in str(app.screen.query_one("#run-header").render()),
                        message="the run screen to recover")
            # A poll that fails as a whole (the GPU layer raising here) is a note; the next recovers.
            gpu = FlakyGpu()
            app.poller.gpu_provider = gpu
            gpu.fail = True
            await until(pilot, lambda: any("driver went away" in n for n in app.snapshot.notes),
                        message="the failure noted")
            assert app.is_running
            gpu.fail = False
            await until(pilot, lambda: not app.snapshot.notes, message="the next poll to recover")
            assert app.snapshot.detail is not None and app.snapshot.detail.view.process("rank-0") is not None

    asyncio.run(drive())


# -- 5: readers read, on a read-only or full runs folder ----------------------------------------
def _unsettled(finished_run: Path, root: Path) -> RunDir:
    """A run whose launcher vanished before it wrote the end (pid of nobody): every reader
    settles it from the records, as ``succeeded``."""
    run = copy_run(finished_run, root)
    m = json.loads(run.manifest_path.read_text())
    m.update(state="running", ended_at=None, summary=None, verdict=None)
    m["launcher"] = {**m["launcher"], "pid_start": 1.0}  # the pid is someone else's now, or nobody's
    run.manifest_path.write_text(json.dumps(m))
    return run


def _answers(root: Path, run_id: str) -> dict:
    """What the read commands say, without the clocks."""
    status = json.loads(ups("status", run_id, "--json", root=root).stdout)
    runs = json.loads(ups("runs", "--json", root=root).stdout)["runs"]
    why = json.loads(ups("why", run_id, "--json", root=root, ok=(0, 1)).stdout)
    ups("status", run_id, root=root)
    ups("runs", root=root)
    return {"state": status["state"], "summary": (status["run"] or {}).get("summary"),
            "processes": [(p["name"], p["state"], p["health"]) for p in status["processes"]],
            "runs": [(r["id"], r["state"], r["summary"]) for r in runs], "why": why["verdict"]["headline"]}


def _mount(*args: str) -> None:
    res = subprocess.run(["mount", *args], capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"mount {' '.join(args)} not permitted here: {res.stderr.strip()}")


@pytest.fixture
def mounts():
    done: list[Path] = []
    yield done
    for path in reversed(done):
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="a read-only bind mount and a tmpfs need root")
def test_readers_answer_the_same_on_a_read_only_and_on_a_full_runs_folder(finished_run, tmp_path, mounts):
    writable = tmp_path / "writable"
    writable.mkdir()
    expected_run = _unsettled(finished_run, writable)
    # Read-only: a bind mount of a copy, remounted ro.
    src, ro = tmp_path / "src", tmp_path / "ro"
    src.mkdir()
    ro.mkdir()
    _unsettled(finished_run, src)
    _mount("--bind", str(src), str(ro))
    mounts.append(ro)
    _mount("-o", "remount,ro,bind", str(ro))
    before = {p: p.stat().st_mtime for p in src.rglob("*")}
    # Full: a small tmpfs with the run on it, filled to the last byte.
    full = tmp_path / "full"
    full.mkdir()
    _mount("-t", "tmpfs", "-o", "size=2m", "tmpfs", str(full))
    mounts.append(full)
    _unsettled(finished_run, full)
    with open(full / "filler", "wb") as fh:
        try:
            while True:
                fh.write(b"\0" * 65536)
        except OSError:
            pass

    ro_answer = _answers(ro, expected_run.run_id)
    full_answer = _answers(full, expected_run.run_id)
    answer = _answers(writable, expected_run.run_id)
    assert answer["state"] == "succeeded" and "launcher lost" in answer["summary"]
    assert ro_answer == answer and full_answer == answer
    assert {p: p.stat().st_mtime for p in src.rglob("*")} == before  # nothing written, nothing tried through
    assert json.loads(expected_run.manifest_path.read_text())["state"] == "running"  # reading never writes
    ups("runs", "--settle", root=writable)  # writing it down is asked for
    assert json.loads(expected_run.manifest_path.read_text())["state"] == "succeeded"


# -- 8: folder modes whatever the umask; a remote host name is quoted -----------------------------
def test_run_folders_are_owner_writable_only_at_umask_000(tmp_path):
    root = tmp_path / "runs"
    prog = tmp_path / "prog.py"
    prog.write_text(PROGRAM)
    line = f"umask 000 && {shlex.quote(sys.executable)} -m ups launch python {shlex.quote(str(prog))}"
    res = subprocess.run(["sh", "-c", line], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "UPS_RUNS_DIR": str(root)})
    assert res.returncode == 0, res.stderr
    (run,) = list_runs(root)
    assert run.state == "succeeded"
    for path in [run.path, *run.path.rglob("*")]:
        mode = path.stat().st_mode
        assert not mode & 0o022, f"{path.relative_to(root)} is group/world-writable: {oct(mode)}"
    for sub in ("status", "control", "stacks", "logs"):
        assert (run.path / sub).stat().st_mode & 0o777 == 0o755


def test_remote_host_is_quoted_into_the_remote_command(monkeypatch, tmp_path):
    from ups.runs.remote import RemoteSpec

    marker = tmp_path / "pwned"
    monkeypatch.setenv("UPS_REMOTE_UPS", "echo {host}")
    monkeypatch.setenv("UPS_SSH", "ssh")
    host = f"node1;touch {marker}"
    argv = RemoteSpec(host, None).argv("status", "--json")
    command = argv[-1]  # what the remote shell runs
    subprocess.run(["sh", "-c", command], capture_output=True, timeout=10)
    assert not marker.exists(), command
    assert shlex.split(command)[:2] == ["echo", host]


# -- 1: the property test ----------------------------------------------------------------------
def _json_values():
    from hypothesis import strategies as st

    scalars = (st.none() | st.booleans() | st.integers() | st.sampled_from([10**400, -1, 2**63, 2**31])
               | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=30)
               | st.sampled_from(["", "running", "[/b]", "../../etc/passwd", "rank", "x" * 5000]))
    return st.recursive(scalars, lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
                        max_leaves=12)


_COMMAND = None


def _all_readers(root: Path, run: RunDir) -> None:
    """Every reader's code, in-process: ups runs / status / status --json / why, the console's poll."""
    global _COMMAND
    from typer.main import get_command
    from typer.testing import CliRunner

    from console.snapshots import Poller
    from ups.cli.app import app

    _COMMAND = _COMMAND or get_command(app)  # built once: typer rebuilds it per invoke (~150 ms)
    runner = CliRunner()
    for args in (["runs", "--json"], ["runs"], ["status", run.run_id, "--json"], ["status", run.run_id],
                 ["why", run.run_id], ["why", run.run_id, "--json"]):
        started = time.monotonic()
        with runner.isolation():  # what CliRunner.invoke does, minus rebuilding the command
            try:
                _COMMAND.main(args=[*args, "--runs-dir", str(root)], prog_name="ups")
                code = 0
            except SystemExit as exc:
                code = exc.code
        assert time.monotonic() - started < BOUND_S
        assert code in (0, 1, 2), args
    poller = Poller(root, gpu_provider=None)
    snap = poller.snapshot(run.run_id, None)
    assert snap.runs


def test_every_reader_survives_arbitrary_json_in_every_field(finished_run, tmp_path_factory):
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    root = tmp_path_factory.mktemp("prop") / "runs"
    root.mkdir()
    run = copy_run(finished_run, root)
    good_record = record(run)
    good_manifest = json.loads(run.manifest_path.read_text())
    record_fields = sorted(good_record)
    manifest_fields = sorted(set(good_manifest) | {"multinode", "nodes", "thresholds", "failure", "previous_launchers"})

    @settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(target=st.sampled_from(["record", "manifest"]), data=st.data())
    def check(target, data) -> None:
        fields = record_fields if target == "record" else manifest_fields
        key = data.draw(st.sampled_from(fields), label="field")
        value = data.draw(_json_values(), label="value")
        rec, man = dict(good_record), dict(good_manifest)
        (rec if target == "record" else man)[key] = value
        (run.status_dir / "rank-0.json").write_text(json.dumps(rec))
        run.manifest_path.write_text(json.dumps(man))
        _all_readers(root, run)

    check()
    run.manifest_path.write_text(json.dumps(good_manifest))
    # And once for real, in a subprocess: a hostile field, the real CLI.
    (run.status_dir / "rank-0.json").write_text(json.dumps({**good_record, "metrics": {"loss": [1, {"a": 10**400}]},
                                                            "collective": {"op": ["x"], "seq": 1}}))
    payload = json.loads(ups("status", run.run_id, "--json", root=root).stdout)
    assert payload["unreadable"] == [{"file": "rank-0.json", "problem": "'collective' 'op' is a list, not a string"}]


HOSTILE_VALUES = [None, True, -1, 10**400, float("nan"), "x" * 20_000, "../../[/b]", [1, "a"], {"op": 1, "seq": "x", "pid": "1"}]


def _core_readers(root: Path, run: RunDir) -> None:
    """The functions behind ups runs / status / status --json / why and the console's poll."""
    from rich.console import Console

    from console.snapshots import Poller
    from ups.cli.tables import render_status
    from ups.runs.payload import run_row, status_payload
    from ups.runs.read import open_run
    from ups.why import diagnose_view

    started = time.monotonic()
    now = time.time()
    views = [open_run(s.run, now=now) for s in list_runs(root)]
    json.dumps([run_row(v, now) for v in views], default=str)
    view = open_run(run)
    json.dumps(status_payload(view, {}), default=str)
    Console(file=open(os.devnull, "w"), width=120).print(render_status(view, {}, width=120))
    diagnose_view(view).text()
    Poller(root, gpu_provider=None).snapshot(run.run_id, None)
    assert time.monotonic() - started < BOUND_S


def test_every_field_of_a_record_and_of_run_json_against_every_hostile_value(finished_run, tmp_path):
    """The exhaustive companion of the property test: each field x each hostile value."""
    root = tmp_path / "runs"
    root.mkdir()
    run = copy_run(finished_run, root)
    good_record = record(run)
    good_manifest = json.loads(run.manifest_path.read_text())
    rec_path = run.status_dir / "rank-0.json"
    for key in sorted(good_record):
        for value in HOSTILE_VALUES:
            rec_path.write_text(json.dumps({**good_record, key: value}))
            try:
                _core_readers(root, run)
            except Exception as exc:
                raise AssertionError(f"record field {key!r} = {value!r:.60}") from exc
    rec_path.write_text(json.dumps(good_record))
    for key in sorted(set(good_manifest) | {"multinode", "failure", "previous_launchers", "stages"}):
        for value in HOSTILE_VALUES:
            run.manifest_path.write_text(json.dumps({**good_manifest, key: value}))
            try:
                _core_readers(root, run)
            except Exception as exc:
                raise AssertionError(f"run.json field {key!r} = {value!r:.60}") from exc


def test_a_reader_never_writes_through_a_symlinked_events_log(finished_run, tmp_path):
    root = tmp_path / "runs"
    root.mkdir()
    run = _unsettled(finished_run, root)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    run.events_path.unlink()
    run.events_path.symlink_to(victim)
    (row,) = json.loads(ups("runs", "--json", root=root).stdout)["runs"]
    assert row["state"] == "succeeded" and "launcher lost" in row["summary"]
    assert victim.read_text() == "precious\n"
    assert run.events_path.is_symlink()
