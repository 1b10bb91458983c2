"""The precompute job through the real CLI: real supervisor, job, DataLoader workers, signals."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import psutil
import pytest
import torch
from helpers import run_ups, wait_for

from ups.data.synth import synthesize
from ups.runs.rundir import RunDir

# Short hang thresholds so every drill resolves in seconds.
FAST = """\
worker_timeout: 2
unresponsive_after: 2
dataloader_timeout: 20
heartbeat_interval: 0.3
batch_size: 4
write_workers: 0
"""
FINAL = ("succeeded", "partial", "failed", "killed")


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("data")
    synthesize(root, "burgers1d", "train", 24, shards=3, seed=1)
    synthesize(root, "darcy2d", "train", 8, shards=1, seed=1, resolution=32)
    return root


@pytest.fixture
def fast_config(tmp_path) -> Path:
    path = tmp_path / "fast.yaml"
    path.write_text(FAST)
    return path


@pytest.fixture
def writers_config(tmp_path) -> Path:
    """FAST with two cache-writer processes (what a GPU box gets by default; 0 on this one)."""
    path = tmp_path / "writers.yaml"
    path.write_text(FAST.replace("write_workers: 0", "write_workers: 2"))
    return path


def writer_pids(run: RunDir) -> list[int]:
    started = events(run, "writers.start")
    assert len(started) == 1 and started[0]["count"] == 2, started
    return started[0]["pids"]


def launch(*args: str, timeout: float = 120):
    res = run_ups("launch", "precompute", *args, timeout=timeout)
    run = None
    for line in res.stderr.splitlines():
        if line.startswith("run "):
            run = RunDir(line.split("(", 1)[1].split(")", 1)[0])
    if run is None and res.stdout.lstrip().startswith("{"):  # --detach --json
        run = RunDir(json.loads(res.stdout)["run_dir"])
    return res, run


def launch_burgers(config: Path, root: Path, cache: Path, *args: str):
    """The burgers1d precompute with 2 DataLoader workers, as most drills run it."""
    return launch("--config", str(config), "--root", str(root), "--tasks", "burgers1d", "--cache-dir", str(cache),
                  "--num-workers", "2", *args)


def events(run: RunDir, name: str) -> list[dict]:
    return [e for e in run.read_events() if e["event"] == name]


def latents(cache: Path, split: str = "burgers1d_train") -> dict[str, torch.Tensor]:
    return {p.name: torch.load(p, weights_only=True)["latent"] for p in sorted((cache / split).glob("sample_*.pt"))}


@pytest.mark.slow
def test_parallel_and_legacy_write_identical_latents(data_root, writers_config, fast_config, tmp_path, runs_root):
    res_p, run_p = launch("--config", str(writers_config), "--root", str(data_root), "--tasks", "burgers1d", "--tasks", "darcy2d",
                          "--cache-dir", str(tmp_path / "par"), "--num-workers", "2")
    assert res_p.returncode == 0, res_p.stderr
    res_l, run_l = launch("--config", str(fast_config), "--root", str(data_root), "--tasks", "burgers1d", "--tasks", "darcy2d",
                          "--cache-dir", str(tmp_path / "leg"), "--legacy")
    assert res_l.returncode == 0, res_l.stderr
    for split in ("burgers1d_train", "darcy2d_train"):
        par, leg = latents(tmp_path / "par", split), latents(tmp_path / "leg", split)
        assert len(par) == {"burgers1d_train": 24, "darcy2d_train": 8}[split]
        assert par.keys() == leg.keys() and all(torch.equal(par[k], leg[k]) for k in par)
        assert next(iter(par.values())).dtype == torch.float16
    assert run_p.read_manifest()["state"] == "succeeded" and run_l.read_manifest()["mode"] == "legacy"
    names = {p.name for p in run_p.status_dir.glob("*.json")}
    assert {"launcher.json", "rank-0.json", "rank-0-worker-0.json", "rank-0-worker-1.json"} <= names
    assert not any("worker" in p.name for p in run_l.status_dir.glob("*.json"))  # 0 means no workers
    assert len(writer_pids(run_p)) == 2 and not events(run_l, "writers.start")  # ... and no writers
    res = run_ups("cache", "verify", str(tmp_path / "par"))
    assert res.returncode == 0, res.stdout


@pytest.mark.slow
def test_sigkill_halfway_then_rerun_resumes_without_recomputing(data_root, fast_config, tmp_path, runs_root):
    cache = tmp_path / "cache"
    res, run = launch_burgers(fast_config, data_root, cache, "--inject", "slow_read:delay=0.15", "--detach")
    assert res.returncode == 0, res.stderr
    run = RunDir(next(runs_root.iterdir()))
    folder = cache / "burgers1d_train"
    wait_for(lambda: len(list(folder.glob("sample_*.pt"))) >= 8, 60, message="a third of the samples cached")
    m = run.read_manifest()
    for pgid in (m["job"]["pgid"], m["launcher"]["pgid"]):  # the whole job: supervisor, main, workers
        os.killpg(pgid, signal.SIGKILL)
    before = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in folder.glob("sample_*.pt")}
    assert 0 < len(before) < 24
    res, run2 = launch_burgers(fast_config, data_root, cache)
    assert res.returncode == 0, res.stderr
    after = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in folder.glob("sample_*.pt")}
    assert len(after) == 24
    assert all(after[name] == ident for name, ident in before.items())  # none recomputed
    assert events(run2, "plan")[0]["cached"] == len(before)
    assert run_ups("cache", "verify", str(cache)).returncode == 0  # none corrupt, no temp files


@pytest.mark.slow
def test_injected_worker_hang_is_detected_killed_and_the_job_completes(data_root, fast_config, tmp_path, runs_root):
    res, run = launch_burgers(fast_config, data_root, tmp_path / "c", "--inject", "worker_hang:worker=1,after=1")
    assert res.returncode == 0, res.stderr
    hung = events(run, "worker.hung")
    assert len(hung) == 1 and hung[0]["worker"] == 1
    assert "_hang" in hung[0]["stack"] and "time.sleep" in hung[0]["stack"] or "line" in hung[0]["stack"]
    assert "Thread" in (run.path / hung[0]["stack_file"]).read_text()  # the dump is kept in stacks/
    assert not psutil.pid_exists(hung[0]["pid"]) or psutil.Process(hung[0]["pid"]).status() == "zombie"
    kills = [e for e in events(run, "signal") if e["actor"] == "watchdog" and e["signal"] in ("SIGTERM", "SIGKILL")]
    assert kills and kills[0]["pid"] == hung[0]["pid"]
    assert len(latents(tmp_path / "c")) == 24 and run.read_manifest()["state"] == "succeeded"


@pytest.mark.slow
def test_observe_only_watchdog_logs_the_hung_worker_and_leaves_it_alone(data_root, fast_config, tmp_path, runs_root):
    res, run = launch_burgers(fast_config, data_root, tmp_path / "c", "--inject", "worker_hang:worker=1,after=1",
                              "--observe-only", "--detach", "--json")
    assert res.returncode == 0, res.stderr
    hung = wait_for(lambda: events(run, "worker.hung"), 60, message="the watchdog's verdict on worker 1")
    assert hung[0]["worker"] == 1 and hung[0]["result"] == "observe-only: not dumped, not killed"
    assert psutil.pid_exists(hung[0]["pid"]) and psutil.Process(hung[0]["pid"]).status() != "zombie"
    assert not [e for e in events(run, "signal") if e["actor"] == "watchdog"]  # nothing was sent
    assert "Thread" not in (run.path / hung[0]["stack_file"]).read_text()  # no dump was asked for
    assert run_ups("kill", str(run.path), "--grace", "2").returncode == 0


@pytest.mark.slow
def test_shard_that_hangs_after_the_launch_check_is_quarantined_with_its_stack(data_root, fast_config, tmp_path, runs_root):
    # `ups launch` refuses a FIFO shard up front (tests below); one that starts hanging after
    # that check (a mount that dies mid-run, or a job started without it) is the job's to
    # handle. The run is started as `ups launch` starts it, minus the check.
    from dataclasses import asdict

    from ups.launch.config import PrecomputeConfig, load_config
    from ups.launch.plan import precompute_command
    from ups.launch.spawn import launch_run

    root = tmp_path / "data"
    synthesize(root, "burgers1d", "train", 24, shards=3, seed=1)
    fifo = root / "burgers1d_train_001.h5"
    fifo.unlink()
    os.mkfifo(fifo)  # a read that never returns, inside h5py's open, holding the GIL
    cfg = load_config(PrecomputeConfig, fast_config, {"root": str(root), "tasks": ["burgers1d"], "cache_dir": str(tmp_path / "c"),
                                                      "num_workers": 2})
    started = time.monotonic()
    run = launch_run(runs_root, "precompute", precompute_command(cfg, None), config=asdict(cfg), thresholds=cfg.thresholds(),
                     files={"config.json": json.dumps(asdict(cfg)).encode()})
    wait_for(lambda: run.read_manifest()["state"] in FINAL, 60, message="the run to end")
    assert time.monotonic() - started < 60  # well within: 2 s worker timeout, 20 s loader timeout
    m = run.read_manifest()
    assert m["state"] == "partial"
    quarantined = m["precompute"]["quarantined"]
    assert sorted(q["source"] for q in quarantined) == sorted(f"burgers1d_train_001.h5#{i}" for i in range(8))
    stacks = [e["stack"] for e in events(run, "worker.hung")]
    assert stacks and all("make_fid" in s and "h5py/_hl/files.py" in s for s in stacks)
    assert any(q["stack_file"] for q in quarantined)
    assert sorted(latents(tmp_path / "c")) == [f"sample_{i:05d}.pt" for i in range(24) if not 8 <= i < 16]
    assert "quarantined" in m["summary"] and "burgers1d_train_001.h5#0" in m["summary"]
    assert run_ups("cache", "verify", str(tmp_path / "c")).returncode == 0  # quarantined are accounted for


@pytest.mark.slow
def test_fallback_request_finishes_in_legacy_mode(data_root, fast_config, tmp_path, runs_root):
    res, _ = launch_burgers(fast_config, data_root, tmp_path / "c", "--inject", "slow_read:delay=0.2", "--detach", "--json")
    run = RunDir(json.loads(res.stdout)["run_dir"])
    wait_for(lambda: (run.status_dir / "rank-0-worker-0.json").exists(), 60, message="workers up")
    res = run_ups("fallback", run.run_id)
    assert res.returncode == 0 and "falling back" in res.stdout, res.stderr
    wait_for(lambda: run.read_manifest()["state"] in FINAL, 120, message="the run to end")
    m = run.read_manifest()
    assert m["state"] == "succeeded" and m["precompute"]["fallback"].startswith("requested by cli:")
    assert len(latents(tmp_path / "c")) == 24
    assert [e["to"] for e in events(run, "fallback")] == ["num_workers=0"]
    assert events(run, "control.handled")[0]["result"] == "falling back to num_workers=0"


@pytest.mark.parametrize("writers", [False, True], ids=["in-process", "writer-processes"])
@pytest.mark.slow
def test_failed_write_is_a_clear_error_with_no_partial_file(writers, data_root, fast_config, writers_config, tmp_path, runs_root):
    res, run = launch_burgers(writers_config if writers else fast_config, data_root, tmp_path / "c", "--inject", "write_enospc:after=5")
    assert res.returncode == 1
    m = run.read_manifest()
    assert m["state"] == "failed" and "No space left on device" in m["summary"]
    log = run.log_path("job").read_text()
    assert "cannot write" in log and "sample_00005.pt" in log and "Traceback" not in log
    folder = tmp_path / "c" / "burgers1d_train"
    written = sorted(p.name for p in folder.glob("sample_*"))
    if writers:  # another writer may have finished a later batch; every file there is whole
        assert written[:5] == [f"sample_{i:05d}.pt" for i in range(5)] and "sample_00005.pt" not in written
        assert all(torch.load(folder / n, weights_only=True)["latent"].shape[0] > 0 for n in written)
        wait_for(lambda: not any(psutil.pid_exists(p) for p in writer_pids(run)), 10, message="the writers gone")
    else:
        assert written == [f"sample_{i:05d}.pt" for i in range(5)]
    assert not [p for p in folder.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("writers", [False, True], ids=["in-process", "writer-processes"])
@pytest.mark.slow
def test_sigterm_stops_cleanly_and_marks_the_run_killed(writers, data_root, fast_config, writers_config, tmp_path, runs_root):
    res, _ = launch_burgers(writers_config if writers else fast_config, data_root, tmp_path / "c", "--inject", "slow_read:delay=0.2", "--detach", "--json")
    run = RunDir(json.loads(res.stdout)["run_dir"])
    wait_for(lambda: (run.status_dir / "rank-0-worker-1.json").exists(), 60, message="workers up")
    pids = [json.loads(p.read_text())["pid"] for p in run.status_dir.glob("*.json")]
    if writers:
        pids += wait_for(lambda: events(run, "writers.start") and writer_pids(run), 60, message="writers up")
    res = run_ups("kill", run.run_id, "--grace", "5")
    assert res.returncode == 0, res.stderr
    wait_for(lambda: run.read_manifest()["state"] in FINAL, 30, message="the run to end")
    assert run.read_manifest()["state"] == "killed"
    wait_for(lambda: not any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in pids), 15,
             message="every process of the run gone")
    assert not list((tmp_path / "c").glob("*/.*.tmp"))


def shards_from_elsewhere(data_root: Path, root: Path, *, manifest: bool) -> list[Path]:
    """A copy of data_root's burgers1d shards, with or without our manifest (data from
    elsewhere has none); returns the three shard paths."""
    root.mkdir()
    names = [f"burgers1d_train_00{i}.h5" for i in range(3)]
    for name in names + (["burgers1d_train.index.json"] if manifest else []):
        (root / name).write_bytes((data_root / name).read_bytes())
    return [root / name for name in names]


@pytest.mark.parametrize("manifest", [True, False], ids=["our-synthetic-data", "data-from-elsewhere"])
@pytest.mark.slow
def test_bad_shards_refuse_the_launch_at_once_naming_every_one(manifest, data_root, fast_config, tmp_path, runs_root):
    _, fifo, corrupt = shards_from_elsewhere(data_root, tmp_path / "data", manifest=manifest)
    fifo.unlink()
    os.mkfifo(fifo)  # opening it blocks, as a file on a hung network mount does
    corrupt.write_bytes(b"not hdf5" * 100)
    fast_config.write_text(fast_config.read_text() + "shard_open_timeout: 1\n")
    started = time.monotonic()
    res, run = launch_burgers(fast_config, tmp_path / "data", tmp_path / "c")
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert time.monotonic() - started < 20
    assert "2 bad shard(s)" in res.stderr and "nothing started" in res.stderr and "--skip-bad-shards" in res.stderr
    assert f"opening {fifo} did not return within 1 s (a FIFO" in res.stderr
    assert f"{corrupt}: not a readable HDF5 file" in res.stderr
    assert run is None and list(runs_root.iterdir()) == [] and not (tmp_path / "c").exists()


SLOW_H5PY = """\
import sys, time


class SlowH5py:  # a cold h5py import on a busy box: seconds before the module is there
    def find_spec(self, name, path=None, target=None):
        if name == "h5py":
            sys.meta_path.remove(self)
            time.sleep(4)
        return None


sys.meta_path.insert(0, SlowH5py())
"""


@pytest.mark.slow
def test_a_slow_h5py_import_never_makes_a_good_shard_bad(data_root, tmp_path):
    """The check's child imports h5py inside its start-up allowance: imported at the first
    header instead, a 4 s import under a 1 s open timeout named every good shard hung."""
    from ups.data.probe import probe_shards

    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SLOW_H5PY)
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)
    survey = probe_shards(data_root, [("burgers1d", "train")], timeout=1.0, read_sample=True, env={"PYTHONPATH": path})
    assert not survey.bad and not survey.problems, (survey.bad, survey.problems)
    assert len(survey.files) == 3 and survey.samples == {"burgers1d/train": 24}


@pytest.mark.slow
def test_a_launch_check_stuck_where_no_signal_reaches_is_killed_and_the_shard_named(data_root, fast_config, tmp_path, runs_root):
    # shard_probe_hang SIGSTOPs the check's process at that file: like an open on a hung
    # mount, nothing inside it can end the wait; the CLI kills it and checks the rest.
    _, _, stuck = shards_from_elsewhere(data_root, tmp_path / "data", manifest=False)
    fast_config.write_text(fast_config.read_text() + "shard_open_timeout: 1\n")
    started = time.monotonic()
    res, run = launch_burgers(fast_config, tmp_path / "data", tmp_path / "c", "--inject", f"shard_probe_hang:file={stuck.name}")
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert time.monotonic() - started < 20
    assert "1 bad shard(s)" in res.stderr
    assert f"{stuck}: opening it did not return within 3 s and the check was killed" in res.stderr
    assert run is None and list(runs_root.iterdir()) == []


@pytest.mark.slow
def test_skip_bad_shards_caches_the_rest_ends_partial_naming_them_and_never_mixes(data_root, fast_config, tmp_path, runs_root):
    good0, fifo, good2 = shards_from_elsewhere(data_root, tmp_path / "data", manifest=False)
    fifo.unlink()
    os.mkfifo(fifo)
    fast_config.write_text(fast_config.read_text() + "shard_open_timeout: 1\n")
    cache = tmp_path / "c"
    res, run = launch_burgers(fast_config, tmp_path / "data", cache, "--skip-bad-shards")
    assert res.returncode == 3, res.stderr
    assert "leaving out 1 bad shard(s)" in res.stderr and f"opening {fifo} did not return" in res.stderr
    m = run.read_manifest()
    assert m["state"] == "partial" and fifo.name in m["summary"], m["summary"]
    skipped = m["precompute"]["quarantined"]
    assert [(q["source"], q["index"]) for q in skipped] == [(fifo.name, None)] and "--skip-bad-shards" in skipped[0]["reason"]
    assert m["precompute"]["cached"] == m["precompute"]["total"] == 16  # shards 000 and 002
    sources = {torch.load(p, weights_only=True)["meta"]["source"] for p in (cache / "burgers1d_train").glob("sample_*.pt")}
    assert sources == {f"{good.name}#{i}" for good in (good0, good2) for i in range(8)}
    assert run_ups("cache", "verify", str(cache)).returncode == 0
    # The mount is back: the cache made without shard 001 holds shard 002 at other indices,
    # so a run with every shard refuses to mix with it.
    fifo.unlink()
    fifo.write_bytes((data_root / fifo.name).read_bytes())
    res, run = launch_burgers(fast_config, tmp_path / "data", cache)
    assert res.returncode == 1 and run.read_manifest()["state"] == "failed"
    assert f"shards left out then: {fifo.name}, now: none); pass --overwrite" in run.read_manifest()["summary"]


def test_bad_input_is_one_line_and_leaves_no_run(tmp_path, runs_root):
    res, _ = launch("--root", str(tmp_path / "nowhere"), "--tasks", "burgers1d", "--cache-dir", str(tmp_path / "c"))
    assert res.returncode == 2 and "data root not found" in res.stderr and "Traceback" not in res.stderr
    res, _ = launch("--root", str(tmp_path), "--tasks", "burgers1d", "--batch-size", "0")
    assert res.returncode == 2 and "batch_size: 0 is not valid" in res.stderr
    res, _ = launch("--root", str(tmp_path), "--tasks", "burgers1d", "--inject", "meteor_strike")
    assert res.returncode == 2 and "unknown fault 'meteor_strike'" in res.stderr
    assert list(runs_root.iterdir()) == []


@pytest.mark.slow
def test_worker_crash_is_retried_and_every_sample_cached(data_root, fast_config, tmp_path, runs_root):
    res, run = launch_burgers(fast_config, data_root, tmp_path / "c", "--inject", "worker_crash:worker=0,after=2,signal=SEGV")
    assert res.returncode == 0, res.stderr
    died = events(run, "worker.died")
    assert len(died) == 1 and died[0]["worker"] == 0
    assert "Segmentation fault" in (run.path / died[0]["stack_file"]).read_text()  # faulthandler in the worker
    assert events(run, "loader.error") and len(latents(tmp_path / "c")) == 24
    assert run.read_manifest()["precompute"]["worker_failures"] == 1


@pytest.mark.slow
def test_hung_cache_write_fails_the_job_naming_the_file_instead_of_hanging(data_root, tmp_path, runs_root):
    cfg = tmp_path / "hang.yaml"
    cfg.write_text(FAST.replace("write_workers: 0", "write_workers: 2\nwrite_timeout: 3"))
    res, run = launch_burgers(cfg, data_root, tmp_path / "c", "--inject", "write_hang:after=6")
    assert res.returncode == 1, res.stderr
    m = run.read_manifest()
    assert m["state"] == "failed" and "write_timeout" in m["summary"] and "sample_00004.pt" in m["summary"], m["summary"]
    wait_for(lambda: not any(psutil.pid_exists(p) for p in writer_pids(run)), 10, message="the hung writer killed")
    assert not list((tmp_path / "c").glob("*/.*.tmp"))


@pytest.mark.slow
def test_writers_die_with_the_job_process(data_root, writers_config, tmp_path, runs_root):
    res, _ = launch_burgers(writers_config, data_root, tmp_path / "c", "--inject", "slow_read:delay=0.3", "--detach", "--json")
    run = RunDir(json.loads(res.stdout)["run_dir"])
    pids = wait_for(lambda: events(run, "writers.start") and writer_pids(run), 60, message="writers up")
    job_pid = json.loads((run.status_dir / "rank-0.json").read_text())["pid"]
    os.kill(job_pid, signal.SIGKILL)  # no cleanup code runs in the job: only PR_SET_PDEATHSIG
    wait_for(lambda: not any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in pids), 10,
             message="no writer outlives the job")
    wait_for(lambda: run.read_manifest()["state"] in FINAL, 30, message="the run to end")
    assert run.read_manifest()["state"] == "failed"
