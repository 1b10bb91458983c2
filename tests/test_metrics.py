"""Training metrics per rank with no code change: capture, bounded history, verdicts.

The real run is a tutorial-style DDP loop (tests/programs/nan_ddp.py, plain torch, gloo, two
torchrun ranks) whose loss becomes NaN on rank 1 at step 40; the rest builds series the way
the heartbeat thread does and reads them the way every reader does.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import time
from pathlib import Path

import pytest
from helpers import run_ups, wait_for

from ups.runs.rundir import RunDir
from ups.runs.view import load_run_view
from ups.status.procs import StaticProcessTable
from ups.status.record import GpuMemory, StatusRecord
from ups.status.series import (
    OVERVIEW,
    RECENT,
    SeriesWriter,
    metric_values,
    points,
    read_run_series,
    read_series,
)
from ups.why import diagnose_view

PROGRAMS = Path(__file__).parent / "programs"
NAN_DDP = str(PROGRAMS / "nan_ddp.py")
START = 1_795_000_000.0  # the synthetic ranks' pid start time, alive in the fake process table


# --------------------------------------------------------------------------- history
def test_series_stays_bounded_keeps_the_whole_run_and_continues_after_a_relaunch(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    w = SeriesWriter(run, "rank-0")
    t0 = 1_795_000_000.0
    for step in range(1, 20_001):  # a long run: one point per heartbeat
        w.add({"t": t0 + step, "step": step, "loss": 1.0 / step, "rate": 10.0})
    assert w.maybe_write(force=True)
    data, problem = read_series(run / "metrics" / "rank-0.json")
    assert problem is None
    assert len(data["recent"]) == RECENT and len(data["overview"]) < OVERVIEW
    steps = [s for s, _ in metric_values(data, "loss")]
    assert steps[0] == 1 and steps[-1] == 20_000 and steps == sorted(steps)  # the whole run, in order
    assert steps[-RECENT:] == list(range(20_001 - RECENT, 20_001))  # recent detail at full resolution
    assert os.path.getsize(run / "metrics" / "rank-0.json") < 64_000

    # attempt 2 of the same run (a restart): the same file goes on
    w2 = SeriesWriter(run, "rank-0", attempt=2)
    w2.add({"t": t0 + 30_000, "step": 20_001, "loss": 0.5})
    w2.maybe_write(force=True)
    data, _ = read_series(run / "metrics" / "rank-0.json")
    last = points(data)[-1]
    assert (last["step"], last["attempt"], last["loss"]) == (20_001, 2, 0.5)
    assert points(data)[-2]["attempt"] == 1


def test_every_reader_survives_bad_series_files(tmp_path):
    folder = tmp_path / "run" / "metrics"
    folder.mkdir(parents=True)
    (folder / "rank-0.json").write_text('{"schema": 1, "fields": ["t"')  # torn
    (folder / "rank-1.json").write_bytes(b"\xff\xfe garbage")
    (folder / "rank-2.json").write_text(json.dumps({"schema": 99}))
    (folder / "rank-3.json").write_text(json.dumps({"schema": 1, "fields": ["x"], "recent": []}))
    os.mkfifo(folder / "rank-4.json")  # a reader must not hang on it
    good = SeriesWriter(tmp_path / "run", "rank-5")
    good.add({"t": 1.0, "step": 1, "loss": 2.0})
    good.maybe_write(force=True)
    found, problems = read_run_series(tmp_path / "run")
    assert list(found) == ["rank-5"]
    assert set(problems) == {f"rank-{i}.json" for i in range(5)}
    assert "future schema" in problems["rank-2.json"] and "FIFO" in problems["rank-4.json"]


def test_a_series_file_from_before_step_time_is_read_plotted_and_continued(tmp_path):
    """A series written before the step_time column (its ``fields`` stop at ``mem``): every
    reader reads it with step_time empty, ``ups plot`` draws its loss and says it has no step
    time, and a relaunch's writer continues it with the column."""
    run = RunDir.create(tmp_path / "runs", "torchrun")
    old = ["t", "step", "attempt", "loss", "lr", "grad_norm", "rate", "sps", "tps", "mem"]
    rows = [[START + i, i, 1, 1.0 / (i + 1), 1e-3, None, 10.0, None, None, 1 << 30] for i in range(1, 31)]
    (run.path / "metrics").mkdir()
    (run.path / "metrics" / "rank-0.json").write_text(json.dumps({
        "schema": 1, "name": "rank-0", "fields": old, "stride": 1, "count": 30, "attempt": 1, "written_at": START,
        "first_nonfinite": None, "around_nonfinite": [], "first_loss": rows[:1], "overview": rows, "recent": rows}))
    data, problem = read_series(run.path / "metrics" / "rank-0.json")
    assert problem is None and len(metric_values(data, "loss")) == 30 and metric_values(data, "step_time") == []
    assert points(data)[-1]["mem"] == 1 << 30 and points(data)[-1]["step_time"] is None
    res = run_ups("plot", str(run.path), "--plain")
    assert res.returncode == 0 and res.stdout.startswith(f"{run.run_id}: loss\n") and res.stdout.count("●") >= 10, res.stderr
    res = run_ups("plot", str(run.path), "--metric", "step_time")
    assert res.returncode == 2 and "has no step_time series yet" in res.stderr, res.stderr
    # More columns than this version knows, or others: not read as this version's.
    for fields in (old + ["step_time", "future"], old[:9], ["x", *old[1:]]):
        (run.path / "metrics" / "rank-1.json").write_text(json.dumps({"schema": 1, "fields": fields, "recent": []}))
        assert read_series(run.path / "metrics" / "rank-1.json") == (None, "unknown columns")

    # attempt 2 (a restart): the writer goes on from the old rows, with step_time from now on
    w = SeriesWriter(run.path, "rank-0", attempt=2)
    w.add({"t": START + 100, "step": 31, "loss": 0.03, "step_time": 0.125})
    w.maybe_write(force=True)
    data, problem = read_series(run.path / "metrics" / "rank-0.json")
    assert problem is None and data["fields"][-1] == "step_time"
    assert metric_values(data, "step_time") == [(31, 0.125)] and len(metric_values(data, "loss")) == 31


def test_capture_reads_losses_off_the_training_thread_and_finds_the_first_nan():
    torch = pytest.importorskip("torch")
    from ups.instrument.metrics import Capture, batch_size

    cap = Capture()
    for step in range(5):
        cap.note_loss(torch.tensor(1.0 / (step + 1), requires_grad=True) * 2, step)
    cap.note_loss(torch.tensor(float("nan")), 5)
    cap.note_loss(torch.tensor(float("inf")), 6)
    cap.note_loss(torch.ones(3), 7)  # not a scalar: not a loss
    cap.note_logged({"acc": 0.5, "flag": True, "t": torch.tensor(3.0), "img": [1, 2]})
    out = cap.sample()
    assert out["loss"] == "inf" and out["loss_step"] == 6
    assert out["loss_nonfinite"]["step"] == 5 and out["loss_nonfinite"]["value"] == "nan"
    assert out["logged"] == {"acc": 0.5, "t": 3.0}
    assert cap.sample().get("loss_step") is None  # nothing new: nothing re-read
    assert batch_size((torch.zeros(8, 3), torch.zeros(8))) == (8, 0)
    assert batch_size({"input_ids": torch.zeros(4, 128, dtype=torch.long)}) == (4, 512)


def test_first_nonfinite_loss_is_kept_at_capture_however_many_losses_pass_between_reads():
    """Issue 29: the heartbeat thread reads a bounded queue of losses; a loop faster than that
    queue per heartbeat dropped the first NaN. Every CPU loss is checked when it is captured."""
    torch = pytest.importorskip("torch")
    from ups.instrument.metrics import PENDING_KEPT, Capture

    cap = Capture()
    for step in range(10 * PENDING_KEPT):  # ten queues' worth between two reads
        value = float("nan") if step >= 70 else 1.0
        cap.note_loss(torch.tensor(value, requires_grad=True) * 1, step)
    out = cap.sample()
    assert out["loss_nonfinite"]["step"] == 70 and out["loss_nonfinite"]["value"] == "nan"
    cap.note_loss(torch.tensor(float("-inf")), 10 * PENDING_KEPT)
    assert cap.sample()["loss_nonfinite"]["step"] == 70  # the first one stays


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "float64"])
def test_device_flag_keeps_the_first_nonfinite_step_exactly(dtype):
    """The CUDA path's arithmetic (ups.instrument.metrics.DeviceFlag), run on CPU tensors here
    (no GPU in this project's CI; scripts/gpu_check.sh runs the CUDA test below): the mark
    only grows, so a late read still gives the first non-finite step, exact up to 2**24."""
    torch = pytest.importorskip("torch")
    from ups.instrument.metrics import DeviceFlag

    flag = DeviceFlag(torch.device("cpu"))
    dt = getattr(torch, dtype)
    for step, value in [(0, 1.0), (1, 3e4), (2, -2.0), (16_000_000, 0.5)]:
        flag.note(torch.tensor(value, dtype=dt, requires_grad=True) * 1, step)
    flag.copy()
    assert flag.first_step() is None
    flag.note(torch.tensor([float("inf")], dtype=dt), 16_000_001)  # (1,)-shaped, +inf
    flag.note(torch.tensor(float("nan"), dtype=dt), 16_000_002)
    flag.copy()
    assert flag.first_step() == 16_000_001


def test_cuda_loss_is_flagged_on_the_device_without_a_sync():
    """GPU boxes only: a NaN at step 3 of a CUDA loss is found by the heartbeat's read of the
    device flag (no sync on the training thread)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from ups.instrument.metrics import Capture

    cap = Capture()
    for step in range(6):
        cap.note_loss(torch.tensor(float("nan") if step >= 3 else 1.0, device="cuda"), step)
    cap.flag.copy()
    torch.cuda.synchronize()
    assert cap.sample()["loss_nonfinite"]["step"] == 3


def test_cuda_loss_is_read_from_another_thread_without_waiting_for_the_gpu():
    """GPU boxes only (scripts/gpu_check.sh runs it): the heartbeat thread's read of a loss
    whose step is still running on the device returns at once and leaves it for later."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    import threading

    from ups.instrument.metrics import Capture

    cap = Capture()
    a = torch.randn(4096, 4096, device="cuda")
    torch.cuda.synchronize()
    for _ in range(50):  # a queue of work the device needs a while for
        a = (a @ a).tanh()
    cap.note_loss(a.mean(), 0)
    took = {}

    def heartbeat():
        t = time.perf_counter()
        took["out"] = cap.sample()
        took["s"] = time.perf_counter() - t

    th = threading.Thread(target=heartbeat)
    th.start()
    th.join()
    assert took["s"] < 0.05 and "loss" not in took["out"]  # not ready: not waited for
    torch.cuda.synchronize()
    assert isinstance(cap.sample()["loss"], float)


# --------------------------------------------------------------------------- verdicts
def _synthetic_run(tmp_path: Path, series: dict[str, list[dict]], **rec_kw) -> RunDir:
    now = time.time()
    run = RunDir.create(tmp_path / "runs", "torchrun")
    run.update_manifest(state="running")
    for rank, (name, pts) in enumerate(series.items()):
        w = SeriesWriter(run.path, name)
        for p in pts:
            w.add(p)
        w.maybe_write(force=True)
        rec = StatusRecord(run_id=run.run_id, role="rank", name=name, pid=os.getpid(), pid_start=START, host="h", rank=rank,
                           started_at=now - 100, heartbeat_at=now, progress_at=now, phase_at=now - 50, phase="train",
                           step=pts[-1]["step"], unit="steps", rate=pts[-1].get("rate"),
                           gpu=GpuMemory(0, pts[-1].get("mem"), None, None) if pts[-1].get("mem") else None, **rec_kw)
        (run.status_dir / f"{name}.json").write_text(rec.to_json())
    return run


def _verdict(run: RunDir):
    table = StaticProcessTable({os.getpid(): START})
    return diagnose_view(load_run_view(run, process_table=table, local_host="h"))


def test_a_nan_verdict_waits_for_the_peer_that_may_have_gone_nan_first(tmp_path):
    """Rank 1's NaN poisons rank 0 through the all-reduce, and rank 0 may write its record first.
    While rank 1's record has not read its losses up to rank 0's NaN step, no rank is named."""
    t0 = time.time() - 100
    pts = [{"t": t0 + i, "step": i, "loss": 1.0, "rate": 10.0} for i in range(39)]
    run = _synthetic_run(tmp_path, {"rank-0": pts, "rank-1": pts})
    now = time.time()

    def write(name: str, **metrics) -> None:
        path = run.status_dir / f"{name}.json"
        path.write_text(dataclasses.replace(StatusRecord.from_json(path.read_text()), metrics=metrics).to_json())

    write("rank-0", loss="nan", loss_step=41, loss_nonfinite={"step": 41, "value": "nan", "at": now})
    write("rank-1", loss=0.9, loss_step=39)
    assert _verdict(run).mode != "loss_nonfinite"  # rank 1 has not said how its step 40 went
    write("rank-1", loss="nan", loss_step=42, loss_nonfinite={"step": 40, "value": "nan", "at": now + 0.3})
    v = _verdict(run)
    assert v.mode == "loss_nonfinite" and v.who["rank"] == 1 and "at step 40" in v.headline, v.text()
    write("rank-1", loss=0.9, loss_step=41)  # rank 1 read step 41 and stayed finite: rank 0 was first
    v = _verdict(run)
    assert v.mode == "loss_nonfinite" and v.who["rank"] == 0 and "at step 41" in v.headline, v.text()
    write("rank-1", loss=0.9, loss_step=39)  # a peer that never catches up delays the verdict, not forever
    write("rank-0", loss="nan", loss_step=41, loss_nonfinite={"step": 41, "value": "nan", "at": now - 11})
    v = _verdict(run)
    assert v.mode == "loss_nonfinite" and v.who["rank"] == 0, v.text()


def test_verdicts_on_divergence_rate_drop_and_memory_leak(tmp_path):
    t0 = time.time() - 100
    calm = [{"t": t0 + i, "step": i * 10, "loss": 1.0 - 0.001 * i, "rate": 10.0} for i in range(60)]
    jump = [dict(p) for p in calm]
    jump[45]["loss"] = 40.0
    v = _verdict(_synthetic_run(tmp_path / "a", {"rank-0": calm, "rank-1": jump}))
    assert v.mode == "loss_diverged" and v.who["rank"] == 1 and "at step 450" in v.headline, v.text()

    slow = [dict(p, rate=10.0 if i < 40 else 2.0) for i, p in enumerate(calm)]
    v = _verdict(_synthetic_run(tmp_path / "b", {"rank-0": calm, "rank-1": slow}))
    assert v.mode == "step_rate_dropped" and v.who["rank"] == 1 and "from step 400" in v.headline, v.text()
    v = _verdict(_synthetic_run(tmp_path / "c", {"rank-0": slow, "rank-1": slow}))
    assert v.mode == "step_rate_dropped" and "every rank dropped after step 400" in v.headline, v.text()

    gib = 1 << 30
    leak = [dict(p, mem=(2 * gib if i < 30 else 2 * gib + (i - 29) * 64 * (1 << 20))) for i, p in enumerate(calm)]
    v = _verdict(_synthetic_run(tmp_path / "d", {"rank-0": calm, "rank-1": leak}, metrics={"gpu_total": 4 * gib}))
    assert v.mode == "gpu_memory_leak" and v.who["rank"] == 1 and "since step 290" in v.headline, v.text()
    # 30 points x 64 MiB over 290 steps; 4 GiB - (2 GiB + 1920 MiB) = 128 MiB left: 2 more points, 20 steps
    assert re.search(r"runs out of memory at about step 6[01]\d", v.headline), v.headline

    v = _verdict(_synthetic_run(tmp_path / "e", {"rank-0": calm, "rank-1": calm}))
    assert v.mode == "healthy", v.text()


# --------------------------------------------------------------------------- the real thing
@pytest.mark.slow
def test_nan_on_rank_1_at_step_40_is_named_within_5_s_with_every_metric_captured(runs_root, tmp_path):
    res = run_ups("launch", "torchrun", "--detach", "--json", "--nproc-per-node", "2", NAN_DDP, "--steps", "70",
                  "--nan-rank", "1", "--nan-step", "40", "--step-time", "0.05", "--wandb",
                  "--tensorboard", str(tmp_path / "tb"),
                  env={"UPS_HEARTBEAT_INTERVAL": "0.3"}, timeout=60, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    run = RunDir(json.loads(res.stdout)["run_dir"])

    def nan_at() -> float | None:
        m = re.search(r"loss is nan from step 40 at (\d+\.\d+)", run.log_path("job").read_text(errors="replace"))
        return float(m.group(1)) if m else None

    def named():
        v = diagnose_view(load_run_view(run))
        return (v, time.time()) if v.mode == "loss_nonfinite" else None

    verdict, seen = wait_for(named, 90, interval=0.1, message="the NaN verdict")
    went_nan = wait_for(nan_at, 10, message="the program's own line")
    assert seen - went_nan <= 5.0, f"named {seen - went_nan:.1f} s after the loss became NaN"
    assert verdict.who["rank"] == 1 and "on rank 1 at step 40" in verdict.headline, verdict.text()

    wait_for(lambda: run.read_manifest()["state"] in ("succeeded", "failed"), 120, interval=0.2, message="the run's end")
    res = run_ups("why", str(run.path), "--json")
    out = json.loads(res.stdout)["verdict"]
    assert res.returncode == 1 and out["mode"] == "loss_nonfinite" and "rank 1 at step 40" in out["headline"]

    status = json.loads(run_ups("status", str(run.path), "--json").stdout)
    procs = {p["name"]: p for p in status["processes"]}
    for rank in (0, 1):
        m = procs[f"rank-{rank}"]["metrics"]
        assert m["loss"] == "nan" and m["lr"] == 0.02 and m["grad_norm"] == "nan", m
        assert m["samples_per_s"] > 0  # batches of 8 seen by the DataLoader hook
    assert procs["rank-0"]["metrics"]["loss_nonfinite"]["step"] == 41  # poisoned through the all-reduce
    assert "train/epoch_frac" in procs["rank-0"]["metrics"]["logged"]  # wandb.log, disabled mode
    assert procs["rank-1"]["metrics"]["logged"]["Loss/train"] == "nan"  # SummaryWriter.add_scalar, every rank
    assert isinstance(procs["rank-0"]["metrics"]["logged"]["Loss/train"], float | str)
    series = status["series"]["rank-1"]
    losses = [p["loss"] for p in series["points"]]
    assert series["first_nonfinite"]["step"] == 40
    assert any(isinstance(v, float) for v in losses) and losses[-1] == "nan"  # finite, then NaN


# --------------------------------------------------------------------------- showing it
def test_plot_and_status_show_the_loss_in_80_columns(tmp_path):
    t0 = time.time() - 100
    pts = [{"t": t0 + i, "step": i * 10, "loss": 2.0 * 0.95 ** i, "rate": 10.0} for i in range(60)]
    bad = [dict(p, loss=float("nan") if i >= 50 else p["loss"]) for i, p in enumerate(pts)]
    run = _synthetic_run(tmp_path, {"rank-0": pts, "rank-1": bad}, metrics={"loss": 0.0123})
    env = {"COLUMNS": "80"}
    res = run_ups("plot", str(run.path), "--plain", env=env)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert max(len(ln) for ln in lines) <= 80 and "not finite: rank 1 from step 500" in res.stdout
    assert "● rank 0  o rank 1" in res.stdout and lines[-2].strip().startswith("step 0")
    res = run_ups("plot", str(run.path), "--metric", "rate", "--rank", "1", env=env)  # plotext if it can, else plain
    assert res.returncode == 0 and max(len(ln) for ln in res.stdout.splitlines()) <= 80, res.stdout
    for args, said in ((("--metric", "bogus"), "--metric bogus: not one of"), (("--rank", "7"), "no loss series yet for that rank")):
        res = run_ups("plot", str(run.path), *args)
        assert res.returncode == 2 and said in res.stderr and "Traceback" not in res.stderr, res.stderr

    res = run_ups("status", str(run.path), env=env)
    table = res.stdout.splitlines()
    header = next(ln for ln in table if ln.startswith("PROCESS"))
    assert "LOSS" in header and max(len(ln) for ln in table) <= 80, res.stdout
    assert re.search(r"rank 0 .* 0\.0123 ", next(ln for ln in table if ln.startswith("rank 0"))), res.stdout
    wide = run_ups("status", str(run.path), "--wide", env=env).stdout
    assert all(col in wide for col in ("LOSS", "LR", "GNORM"))
