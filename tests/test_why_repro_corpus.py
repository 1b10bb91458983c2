"""`ups why --log` on failures reproduced for real with today's torch (tests/data/repro_corpus:
scripts/make_failure_logs.py made them under torchrun, plain python and a batch script, and
scripts/split_failure_logs.py split them by scenario before the reader was tuned), and the
classes that reproduction showed missing: a permission refused on a path, a checkpoint that
torch's weights_only loading refuses, a NaN or inf loss."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from ups.why.logread import BY_NAME, read_log

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "tests" / "data" / "repro_corpus"
TEST_SHA256 = "43004b855c61e115307c212143cd4afada4f148183bc5b647af7afbbfdb2ae27"
# round 2 (scripts/failure_job2.py): new programs, split and frozen before the reader was read again
TEST2_SHA256 = "8b467d404d84710a3c7bf90b1f4c33fec01ee757828b2299fd4ef26b9b9e4503"


def _records(name: str) -> list[dict]:
    return [json.loads(line) for line in (CORPUS / f"{name}.jsonl").read_text().splitlines() if line.strip()]


# -- the committed fixtures ---------------------------------------------------------------------------
def test_the_test_half_is_frozen():
    assert hashlib.sha256((CORPUS / "test.jsonl").read_bytes()).hexdigest() == TEST_SHA256


def test_round_two_test_half_is_frozen():
    assert hashlib.sha256((CORPUS / "test2.jsonl").read_bytes()).hexdigest() == TEST2_SHA256


def test_round_two_is_new_programs_with_every_class_in_its_test_half():
    round1 = {r["scenario"] for r in _records("dev") + _records("test")}
    dev2, test2 = _records("dev2"), _records("test2")
    assert not round1 & {r["scenario"] for r in dev2 + test2}
    assert not {r["scenario"] for r in dev2} & {r["scenario"] for r in test2}
    scenarios_of = Counter(c for c, _ in {(r["class"], r["scenario"]) for r in dev2 + test2 if r["class"]})
    assert len(scenarios_of) >= 20 and set(scenarios_of) <= set(BY_NAME)
    assert min(scenarios_of.values()) >= 2  # two new ways of each class's fault
    assert {r["class"] for r in test2 if r["class"]} == set(scenarios_of)
    negatives = {r["scenario"] for r in dev2 + test2 if r["class"] is None and r["negative"] in ("healthy", "user_error")}
    assert len(negatives) >= 6


def test_the_corpus_has_every_class_in_three_surroundings_and_negatives():
    records = _records("dev") + _records("test")
    assert {r["torch"] for r in records} and all(r["torch"] for r in records)
    surroundings = Counter((r["class"], r["surrounding"]) for r in records if r["class"])
    classes = {c for c, _ in surroundings}
    assert classes <= set(BY_NAME)
    assert len(classes) >= 20
    # plain python killed by SIGTERM prints nothing: its job_terminated logs are "unsaid" negatives
    assert {c for c in classes for s in ("torchrun", "python", "batch") if not surroundings[(c, s)]} <= {"job_terminated"}
    assert sum(1 for r in records if r["class"] is None and r["negative"] in ("healthy", "user_error")) >= 10
    # split by scenario: no program's words on both sides
    dev, test = ({r["scenario"] for r in _records(h)} for h in ("dev", "test"))
    assert not dev & test


@pytest.mark.parametrize("half", ["dev", "test", "dev2", "test2"])
def test_the_fixtures_get_no_wrong_class_and_no_negative_a_class(half: str):
    wrong, right, failures = [], 0, 0
    for rec in _records(half):
        got = read_log(rec["text"])
        if rec["class"] is None:
            assert got.name is None, f"{rec['scenario']}.{rec['surrounding']}: a negative read as {got.name}"
            if rec.get("negative") == "user_error":
                assert got.kind == "user_code" and got.exception == rec["expect"], (rec["scenario"], got)
            continue
        failures += 1
        right += got.name == rec["class"]
        if got.name is not None and got.name != rec["class"]:
            wrong.append(f"{rec['scenario']}.{rec['surrounding']}: {got.name}")
    assert not wrong
    assert right >= 0.9 * failures, f"{right} of {failures}"


# -- a torch upgrade that changes a message is caught ------------------------------------------------
# torch's own messages: weights_only on a checkpoint and on an HTML page, map_location, anomaly mode;
# round 2 (dev2): gloo's size check when ranks all_gather_into_tensor unequal sizes (2 ranks, mp.spawn)
CHEAP = ("ckpt_args", "ckpt_html", "ckpt_cuda", "nan_anomaly", "coll_gather_into")


@pytest.mark.slow
def test_failures_made_again_with_the_installed_torch_are_still_named(tmp_path: Path):
    """A few classes made again, for real, with the torch installed here (plain python, a few
    seconds each): the reader still names them."""
    scenarios = list(CHEAP)
    if os.geteuid() == 0 and shutil.which("unshare"):
        scenarios += ["perm_save"]  # torch's writer refused as a second user, in a private mount namespace
    res = subprocess.run([sys.executable, str(REPO / "scripts" / "make_failure_logs.py"), str(tmp_path),
                          "--only", ",".join(scenarios), "--surroundings", "python"],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert sorted(e["scenario"] for e in manifest["logs"]) == sorted(scenarios)
    for e in manifest["logs"]:
        text = (tmp_path / "logs" / e["log"]).read_text()
        assert e["class"], f"{e['scenario']}: the log no longer shows its fault's words:\n{text[-1500:]}"
        got = read_log(text)
        assert got.name == e["class"], f"{e['scenario']}: read as {got.name} ({got.line}); torch {manifest['torch']}"
    left = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True)
    assert not left.stdout.strip()  # no process of the generator's jobs is left


# -- the classes reproduction showed missing ------------------------------------------------------------
PERMISSION = """Traceback (most recent call last):
  File "/home/me/train.py", line 88, in <module>
    os.makedirs(os.path.join(args.out, "cache"), exist_ok=True)
  File "<frozen os>", line 225, in makedirs
PermissionError: [Errno 13] Permission denied: '/shared/runs/exp7/cache'
"""


def test_a_permission_refused_names_the_path_and_the_fix():
    got = read_log(PERMISSION)
    assert got.name == "permission_denied" and "/shared/runs/exp7/cache" in got.summary
    assert "ls -ld" in got.cls.where and "write where the job's user may" in got.cls.fix
    # a shell tool's refusal in a job script names its path too
    shell = read_log("mkdir: cannot create directory '/scratch/ckpt': Permission denied\n")
    assert shell.name == "permission_denied" and "/scratch/ckpt" in shell.summary


def test_a_permission_word_that_names_no_path_is_not_the_class():
    # ssh's refusal of a key, torch's writer that says only "cannot be opened": no path refused
    assert read_log("git@github.com: Permission denied (publickey).\nfatal: Could not read from remote repository.\n").name != (
        "permission_denied")
    assert read_log("RuntimeError: File /ckpt/step_3.pt cannot be opened.\n").name is None
    # a warning about it never decides
    assert read_log("UserWarning: could not write the cache: [Errno 13] Permission denied: '/x'\n").name is None


WEIGHTS_ONLY = """_pickle.UnpicklingError: Weights only load failed. This file can still be loaded, to do so you have two options, do those steps only if you trust the source of the checkpoint.
	(1) In PyTorch 2.6, we changed the default value of the `weights_only` argument in `torch.load` from `False` to `True`. Re-running `torch.load` with `weights_only` set to `False` will likely succeed, but it can result in arbitrary code execution. Do it only if you got the file from a trusted source.
	(2) Alternatively, to load with `weights_only=True` please check the recommended steps in the following error message.
	WeightsUnpickler error: Unsupported global: GLOBAL argparse.Namespace was not an allowed global by default. Please use `torch.serialization.add_safe_globals([argparse.Namespace])` or the `torch.serialization.safe_globals([argparse.Namespace])` context manager to allowlist this global if you trust this class/function.
"""


def test_a_checkpoint_weights_only_loading_refuses_is_not_a_corrupt_one():
    assert read_log(WEIGHTS_ONLY).name == "checkpoint_weights_only"
    html = WEIGHTS_ONLY.split("\tWeightsUnpickler")[0] + "\tWeightsUnpickler error: invalid load key, '<'.\n"
    assert read_log(html).name == "checkpoint_corrupt"  # not a checkpoint at all: the file is wrong


def test_a_nonfinite_loss_decides_on_whatever_line_printed_it():
    log = ("2026-11-27 10:59:28,478 INFO [rank1] train: epoch 0 step 2/6 loss 0.52\n"
           "2026-11-27 10:59:28,491 INFO [rank1] train: epoch 0 step 3/6 loss nan\n"
           "2026-11-27 10:59:28,501 INFO [rank1] train: epoch 0 step 4/6 loss nan\n")
    got = read_log(log)
    assert got.name == "loss_nonfinite" and got.rank == 1 and "first at step 3" in got.summary and got.n == 1
    bar = "train:  50%|#####     | 3/6 [00:01<00:01, loss=inf]\n"
    assert read_log(bar).name == "loss_nonfinite"
    # a counter of NaN iterations, a healthy loss: nothing
    assert read_log(" iteration 34/10000 | lm loss: 2.1E+00 | number of nan iterations: 0 |\n").name is None


def test_a_cause_before_the_nan_wins_and_a_nan_before_the_programs_error_wins():
    disk = "OSError: [Errno 28] No space left on device: '/ckpt/a.pt'\nstep 9 loss nan\n"
    assert read_log(disk).name == "disk_full"
    own = ("step 3 loss nan\nTraceback (most recent call last):\n  File \"/home/me/train.py\", line 9, in <module>\n"
           "    check(loss)\nValueError: bad loss\n")
    assert read_log(own).name == "loss_nonfinite"
    # the program's own check that raised about the loss is its own error, as any other
    raised = read_log("Traceback (most recent call last):\n  File \"/home/me/train.py\", line 50, in <module>\n"
                      "    raise ValueError(f\"loss is {loss}\")\nValueError: loss is nan\n")
    assert raised.kind == "user_code" and raised.exception == "ValueError"
    anomaly = "RuntimeError: Function 'LogBackward0' returned nan values in its 0th output.\n"
    assert read_log(anomaly).name == "loss_nonfinite"


# torch 2.13 on an HTML page saved as weights: the unpickler's first byte, '<', is no pickle opcode
HTML_UNDER_WEIGHTS_ONLY = (
    "_pickle.UnpicklingError: Weights only load failed. In PyTorch 2.6, we changed the default value of the "
    "`weights_only` argument in `torch.load` from `False` to `True`.\nPlease file an issue with the following so "
    "that we can make `weights_only=True` compatible with your use case: WeightsUnpickler error: \n\n"
    "Unsupported operand 60\n")


@pytest.mark.parametrize("text, name", [
    (HTML_UNDER_WEIGHTS_ONLY, "checkpoint_corrupt"),
    ("WeightsUnpickler error: Unsupported operand 149\n", None),  # a real opcode (FRAME): not a file that is no pickle
    ("OSError: 1048576 requested and 31712 written\n", "disk_full"),  # numpy's short write (ndarray.tofile)
])
def test_a_file_that_is_no_pickle_is_corrupt_and_a_short_write_is_a_full_disk(text: str, name: str | None):
    assert read_log(text).name == name


# -- several nodes: the global rank, never --tee's local one ---------------------------------------------
def test_a_two_node_log_names_the_global_rank_that_raised():
    """Two torchrun agents, 2 ranks each (tests/data/repro_corpus/nodes.jsonl): rank 3 raised.
    With --tee 3 its lines read "[default1]:[rank3]:": the local rank 1 is not who failed."""
    records = _records("nodes")
    assert {r["nodes"] for r in records} == {2} and any("--tee 3" in r["note"] for r in records)
    for rec in records:
        got = read_log(rec["text"])
        assert (got.kind, got.exception, got.rank) == ("user_code", rec["expect"], rec["rank"]), (rec["scenario"], got)


# -- a real SLURM ending a job -------------------------------------------------------------------------
def test_what_a_real_slurm_writes_when_it_ends_a_job_is_named_with_the_job_id():
    """`slurm-<job>.out` of 2-task sbatch jobs of gloo ranks (tests/data/repro_corpus/slurm.jsonl,
    made by scripts/make_slurm_logs.py on a one-node slurm-wlm 22.05): cancelled by scancel, and
    ended at its time limit. ``ups why --log`` names the class, the job and why."""
    records = {r["scenario"]: r for r in _records("slurm")}
    assert set(records) == {"slurm_scancel", "slurm_time_limit"}
    for rec in records.values():
        got = read_log(rec["text"])
        assert got.name == rec["class"] == "job_terminated", (rec["scenario"], got)
        assert f"SLURM job {rec['job']} on " in got.summary, got.summary
    assert "by scancel" in read_log(records["slurm_scancel"]["text"]).summary
    assert records["slurm_time_limit"]["job_state"] == "TIMEOUT"
    assert "due to time limit" in read_log(records["slurm_time_limit"]["text"]).summary
