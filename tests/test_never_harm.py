"""An observer never kills what it observes (issue 21, "worst first").

Programs own signals: Lightning's teardown resets the signals it handled to their default
action (death), SLURM's --signal=USR1 and requeue use SIGUSR1. ups dumps stacks with a signal
of its own, and never sends it to a process that does not handle it *now*.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import textwrap
import time
from pathlib import Path

import pytest
from helpers import record_job, run_ups, wait_for

from ups.runs.rundir import FINAL_RUN_STATES, RunDir

# The tutorial shape: a few optimizer steps, then the program's own teardown (what Lightning
# does to the signals it handled: back to SIG_DFL), then work after training that makes no
# step (evaluation, saving, uploading): long enough to be flagged stalled and draw the
# launcher's automatic stack dump.
RESETS_HANDLER = textwrap.dedent(
    """
    import json, os, signal, time
    import torch

    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(20):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
    print("training done", flush=True)

    run = os.environ["UPS_RUN_DIR"]
    with open(os.path.join(run, "status", "rank-0.json")) as fh:
        sig = json.load(fh)["stack_signal"]          # the signal ups registered here
    signal.signal(sig, signal.SIG_DFL)               # teardown: default action, which is death
    signal.signal(signal.SIGUSR1, signal.SIG_DFL)

    # Post-training work, no optimizer step: until ups's automatic dump came and went (30 s at most).
    deadline = time.time() + 30
    def dumped():
        try:
            with open(os.path.join(run, "events.jsonl")) as fh:
                return any('"stacks.auto"' in line and '"rank-0"' in line for line in fh)
        except OSError:
            return False
    while time.time() < deadline and not dumped():
        sum(i * i for i in range(10000))
        time.sleep(0.05)
    time.sleep(1.0)
    print("post-training work done", flush=True)
    """
)


def launch(tmp_path: Path, launcher: str, script: str, *extra: str, env: dict[str, str] | None = None) -> RunDir:
    prog = tmp_path / "prog.py"
    prog.write_text(script)
    res = run_ups("launch", launcher, "--detach", "--json", *extra, str(prog), cwd=tmp_path, env=env)
    assert res.returncode == 0, res.stderr
    return RunDir(json.loads(res.stdout)["run_dir"])


def wait_final(run: RunDir, timeout: float) -> dict:
    return wait_for(lambda: (m := run.read_manifest())["state"] in FINAL_RUN_STATES and m, timeout,
                    interval=0.2, message=f"{run.run_id} to end")


@pytest.mark.slow
def test_program_that_resets_the_dump_signal_after_training_succeeds_unsignalled(runs_root, tmp_path):
    run = launch(tmp_path, "python", RESETS_HANDLER, "--stalled-after", "2")
    m = wait_final(run, 120)
    log = run.log_path("job").read_text()
    assert m["state"] == "succeeded", (m.get("summary"), log)
    assert "post-training work done" in log
    events = run.read_events()
    assert not [e for e in events if e["event"] == "signal"], "ups signalled a process of the job"
    auto = [e for e in events if e["event"] == "stacks.auto" and e["target"] == "rank-0"]
    assert auto and auto[0]["health"] == "stalled"
    assert "not signalled" in auto[0]["result"], auto[0]


def _path_without_pyspy() -> str:
    return os.pathsep.join(d for d in os.environ.get("PATH", "").split(os.pathsep)
                           if d and not os.path.exists(os.path.join(d, "py-spy")))


@pytest.mark.parametrize("pyspy", ["missing", "installed"])
def test_stacks_refuse_a_process_whose_handler_is_gone(procs, runs_root, pyspy):
    """The record still names the signal (its heartbeat thread has not noticed the reset):
    the live caught-signal mask is what decides. Without py-spy the refusal says so; with it
    (the `attach` extra) the stacks are read from outside, and the process is never signalled."""
    if pyspy == "installed" and shutil.which("py-spy") is None:
        pytest.skip("py-spy is not installed (pip install 'ups[attach]')")
    run = RunDir.create(runs_root, "test")
    code = textwrap.dedent(
        f"""
        import signal, sys, time
        from ups.status import Reporter
        rep = Reporter({str(run.path)!r}, rank=0, world_size=1, interval=3600).start()
        signal.signal(rep.stack_signal, signal.SIG_DFL)
        print("reset", flush=True)
        time.sleep(60)
        """
    )
    proc = procs.python(code, stdout=subprocess.PIPE, text=True)
    record_job(run, proc)
    assert proc.stdout.readline().strip() == "reset"
    rec = json.loads((run.status_dir / "rank-0.json").read_text())
    assert rec["stack_signal"] is not None  # the record's word: still inviting the signal

    started = time.monotonic()
    env = {"PATH": _path_without_pyspy()} if pyspy == "missing" else None
    res = run_ups("stacks", str(run.path), "--rank", "0", env=env)
    assert time.monotonic() - started < 10
    if pyspy == "missing":
        assert res.returncode == 1 and "Traceback" not in res.stderr
        assert "handler gone; not signalled" in res.stderr, res.stderr
        assert len([ln for ln in res.stderr.splitlines() if ln.strip()]) == 1
    else:
        assert res.returncode == 0, res.stderr
        assert "sleep" in res.stdout or "<module>" in res.stdout, res.stdout
    assert proc.poll() is None, "the process died: it was signalled"
    assert not [e for e in run.read_events() if e["event"] == "signal"]


# The same teardown, then a hang: the program waits forever at one line, its dump handler gone.
TRAINING = RESETS_HANDLER.split('print("training done"')[0]
RESETS_THEN_HANGS = TRAINING + textwrap.dedent(
    """
    with open(os.path.join(os.environ["UPS_RUN_DIR"], "status", "rank-0.json")) as fh:
        signal.signal(json.load(fh)["stack_signal"], signal.SIG_DFL)   # teardown: default action, death
    print("handler reset", flush=True)
    while True:
        time.sleep(0.5)  # the hang: a wait that never ends
    """
)


@pytest.mark.slow
def test_on_hang_kill_ends_a_hung_program_whose_dump_handler_is_gone(runs_root, tmp_path):
    """--on-hang kill needs two identical stacks as proof. The program reset its stack-dump
    handler, so the launcher reads them with py-spy (never the signal, which would kill it):
    the proof holds from those two dumps, and the hang is ended as asked."""
    if shutil.which("py-spy") is None:
        pytest.skip("py-spy is not installed (pip install 'ups[attach]')")
    run = launch(tmp_path, "python", RESETS_THEN_HANGS, "--stalled-after", "2", "--on-hang", "kill",
                 env={"UPS_HEARTBEAT_INTERVAL": "0.3"})
    m = wait_final(run, 120)
    assert m["state"] == "failed", (m.get("summary"), run.log_path("job").read_text())
    assert m["summary"].startswith("ended on hang (--on-hang kill): attempt 1: rank 0 is stalled"), m["summary"]
    events = run.read_events()
    dumps = [e for e in events if e["event"] == "stacks.pyspy" and e["target"] == "rank-0"]
    assert len(dumps) >= 2 and all("not signalled" in e["reason"] for e in dumps), dumps
    hang = [e for e in events if e["event"] == "hang"]
    assert hang and hang[0]["action"] == "kill", hang
    sig = json.loads((run.status_dir / "rank-0.json").read_text())["stack_signal"]
    from ups.runs.signals import signal_name

    sent = {e.get("signal") for e in events if e["event"] == "signal"}
    assert signal_name(sig) not in sent, sent  # the kill's SIGTERM, never the dump signal
    stacks = (run.path / "stacks" / "rank-0.txt").read_text()
    assert stacks.count("time.sleep(0.5)") == 0 and stacks.count("<module>") >= 2, stacks


TRAINS = textwrap.dedent(
    """
    import os
    print("rank", os.environ.get("RANK"), "of", os.environ.get("WORLD_SIZE"), flush=True)
    """
)


def test_torchrun_without_instrumentation_succeeds_when_torchrun_does(runs_root, tmp_path):
    run = launch(tmp_path, "torchrun", TRAINS, "--nproc-per-node", "1", env={"UPS_INSTRUMENT": "0"})
    m = wait_final(run, 90)
    assert m["instrument"] is False
    assert m["state"] == "succeeded", m.get("summary")
    assert "UPS_INSTRUMENT=0" in m["summary"]
    assert not list(run.status_dir.glob("rank-*.json"))  # nothing was instrumented


@pytest.mark.slow
def test_ranks_ups_cannot_watch_do_not_fail_a_run_that_succeeded(runs_root, tmp_path):
    """torchrun --no-python runs ranks that are no Python (a compiled trainer, a shell step):
    they write no record. torchrun's exit 0 is the truth; "never wrote a status record" is
    what ups could not see, not a failure."""
    ranks = tmp_path / "rank.sh"
    ranks.write_text('#!/bin/sh\necho "rank $RANK of $WORLD_SIZE done"\n')
    ranks.chmod(0o755)
    res = run_ups("launch", "torchrun", "--detach", "--json", "--no-python", "--nproc-per-node", "2", str(ranks),
                  cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    run = RunDir(json.loads(res.stdout)["run_dir"])
    m = wait_final(run, 90)
    assert m["state"] == "succeeded", m.get("summary")
    assert "torchrun exited 0" in m["summary"] and "rank 0, 1 wrote no status record (not watched)" in m["summary"]
    assert "rank 1 of 2 done" in run.log_path("job").read_text()


LIGHTNING = textwrap.dedent(
    """
    import time
    import torch
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    class Model(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(8, 1)
        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)
        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    if __name__ == "__main__":
        data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
        trainer = L.Trainer(strategy="ddp", accelerator="cpu", devices=1, max_epochs=1, logger=False,
                            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
        trainer.fit(Model(), DataLoader(data, batch_size=8))
        t0 = time.time()
        while time.time() - t0 < 8:       # post-fit work, no optimizer step (longer than the stall limit)
            sum(i * i for i in range(10000)); time.sleep(0.05)
        print("post-fit work done", flush=True)
    """
)


@pytest.mark.slow
def test_lightning_ddp_with_work_after_fit_succeeds(runs_root, tmp_path):
    pytest.importorskip("lightning", reason="lightning is not installed (a test extra)")
    run = launch(tmp_path, "torchrun", LIGHTNING, "--stalled-after", "2", "--nproc-per-node", "1")
    m = wait_final(run, 240)
    log = run.log_path("job").read_text()
    assert m["state"] == "succeeded", (m.get("summary"), log[-3000:])
    assert "post-fit work done" in log
    events = run.read_events()
    auto = [e for e in events if e["event"] == "stacks.auto" and e["target"].startswith("rank-")]
    assert auto, "the post-fit stall drew no automatic stack dump"
    # Lightning's teardown puts back what signal.getsignal() said before fit() for *every*
    # signal, ours included (SIG_DFL: faulthandler's handler is not in Python's table), so
    # after fit() the dump is refused, not sent; a dump taken earlier would have been harmless.
    assert all(e["result"].startswith("dumped") or "not signalled" in e["result"] or "handler gone" in e["result"]
               for e in auto), auto
    assert all(e["signal"] not in ("SIGUSR1", "SIGTERM", "SIGKILL") for e in events if e["event"] == "signal")
    assert all(r["state"] == "done" and r["signal"] is None for r in m["ranks"].values()), m["ranks"]
