"""Make failures happen for real with the installed torch, and keep their logs.

    python scripts/make_failure_logs.py OUT [--round 1|2] [--only SCENARIO,...] [--surroundings torchrun,python,batch]

Each scenario (round 1: scripts/failure_job.py, a small training job and the one call that fails;
round 2: scripts/failure_job2.py, other programs written as frameworks' tutorials write them,
failing in other ways, for a second frozen test half that no one tuned on) runs in
three surroundings: ``torchrun`` with 2 gloo ranks (the failing rank first, the other rank's
secondary errors after it), plain ``python``, and a batch script whose output is a SLURM-style
``.out`` file (``set -e``, the shell's own "Killed"/"Terminated" lines, exit codes). The noise
varies by scenario and surrounding (tqdm bars, logging lines, torch's warnings,
``TORCH_CPP_LOG_LEVEL=INFO``).

The faults are made safely:

* a full disk, a read-only file system and a small /dev/shm are new tmpfs mounts
  inside a private mount namespace (``unshare -m``): the host's mounts are never touched, and
  the mounts end with the namespace;
* memory and descriptor limits with ``ulimit``; permissions with a second user
  (uid 65534: ``setpriv``), the interpreter bind-mounted where that user can reach it, in the
  same private namespace;
* kills and terminations with real signals sent the way schedulers and the OOM killer send them:
  SIGTERM to every process of the job then SIGKILL after a grace (a time limit, a cancel; in
  the batch surrounding the script's shell is spared, as ``scancel --signal=TERM`` spares the
  batch shell, so it says "Terminated"), and SIGKILL to one process (the OOM killer picks one).

Writes ``OUT/logs/<scenario>.<surrounding>.log`` and ``OUT/manifest.json`` (each log's class,
in the reader's names, or null for a negative; its scenario, surrounding and exit code; the torch
version). A log that does not show its fault's words (EVIDENCE: plain python killed by a signal
prints nothing) is kept with class null and ``negative: "unsaid"``: the reader must not guess it.
``--relabel`` applies that rule again to OUT's manifest without running anything.
It is the subreaper of every process it starts and kills and reaps them all after each log:
nothing is left behind.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
JOBS = {1: HERE / "failure_job.py", 2: HERE / "failure_job2.py"}
SURROUNDINGS = ("torchrun", "python", "batch")
NOBODY = 65534


@dataclass(frozen=True)
class Scenario:
    name: str
    cls: str | None  # the reader's class name; None for a negative
    mount: str = ""  # "full", "ro", "perm", "shm": what the private namespace mounts
    ulimit: str = ""  # e.g. "-n 128", "-v 3000000"
    user: bool = False  # run as uid 65534
    signal: str = ""  # "kill_one", "term_group", "kill_worker": sent from outside when the job is ready
    env: dict = field(default_factory=dict)
    limit: float = 90.0  # the job's time limit: then SIGTERM to its processes, SIGKILL 8 s later
    negative: str | None = None  # healthy | user_error
    expect: str | None = None  # the exception a user_error raises
    note: str = ""
    round: int = 1  # 1: failure_job.py, 2: failure_job2.py
    torchrun: str = ""  # round 2: torchrun's options instead of --standalone ({busy}, {dead}, {free}: ports)


SCENARIOS: tuple[Scenario, ...] = (
    Scenario("disk_save", "disk_full", mount="full", note="torch.save of a checkpoint onto a full file system"),
    Scenario("disk_write", "disk_full", mount="full", note="numpy writes a feature cache onto a full file system"),
    Scenario("ro_save", "read_only_fs", mount="ro", note="torch.save onto a read-only file system"),
    Scenario("ro_write", "read_only_fs", mount="ro", note="numpy writes a cache onto a read-only file system"),
    Scenario("perm_save", "permission_denied", mount="perm", user=True, note="torch.save into a folder another user owns"),
    Scenario("perm_write", "permission_denied", mount="perm", user=True, note="a cache folder made in a folder another user owns"),
    Scenario("shm_loader", "shm_full", mount="shm", env={"JOB_WORKERS": "2"}, limit=25,
             note="DataLoader workers' samples through a 4 MiB /dev/shm: the loader hangs until the time limit"),
    Scenario("shm_share", "shm_full", mount="shm", note="a tensor moved to shared memory in a 4 MiB /dev/shm"),
    Scenario("fd_loader", "too_many_open_files", ulimit="-n 96", env={"JOB_WORKERS": "2"}, limit=25,
             note="DataLoader workers pass tensors as descriptors under ulimit -n 96: the loader hangs until the time limit"),
    Scenario("fd_open", "too_many_open_files", ulimit="-n 256", note="shard files opened under ulimit -n 256"),
    Scenario("mem_tensor", "host_oom", ulimit="-v 6000000", note="a 64 GiB tensor under ulimit -v"),
    Scenario("mem_numpy", "host_oom", ulimit="-v 6000000", note="a 298 GiB numpy array under ulimit -v"),
    Scenario("kill_main", "oom_killed", signal="kill_one", note="SIGKILL to the failing rank, as the OOM killer sends it"),
    Scenario("kill_loader", "oom_killed", signal="kill_worker", env={"JOB_WORKERS": "2"},
             note="SIGKILL to a DataLoader worker, as the OOM killer sends it"),
    Scenario("segv_main", "segfault", note="a native call reads address 0"),
    Scenario("segv_loader", "segfault", env={"JOB_WORKERS": "2"}, note="a DataLoader worker's native call reads address 0"),
    Scenario("term_group", "job_terminated", signal="term_group", note="SIGTERM to the process group, SIGKILL after a grace"),
    Scenario("term_loader", "job_terminated", signal="term_group", env={"JOB_WORKERS": "2"},
             note="SIGTERM to the process group with DataLoader workers in it"),
    Scenario("missing_data", "file_missing", note="a data shard that is not there"),
    Scenario("missing_ckpt", "file_missing", note="torch.load of a checkpoint that is not there"),
    Scenario("import_module", "import_error", note="an optional package that is not installed"),
    Scenario("import_so", "import_error", note="a compiled extension that does not load"),
    Scenario("ckpt_truncated", "checkpoint_corrupt", note="torch.load of a checkpoint cut in half"),
    Scenario("ckpt_html", "checkpoint_corrupt", note="torch.load (weights_only) of an HTML page saved as weights"),
    Scenario("ckpt_args", "checkpoint_weights_only", note="torch.load (weights_only) of a checkpoint holding an argparse.Namespace"),
    Scenario("ckpt_numpy", "checkpoint_weights_only", note="torch.load (weights_only) of a checkpoint holding a numpy scalar"),
    Scenario("ckpt_cuda", "checkpoint_cuda_on_cpu", note="torch.load of a checkpoint saved from CUDA tensors, no map_location"),
    Scenario("ckpt_cuda_map", "checkpoint_cuda_on_cpu", note="torch.load with map_location='cuda:N' on a CPU-only box"),
    Scenario("addr_taken", "address_in_use", note="the master port is held by another process"),
    Scenario("addr_store", "address_in_use", note="a TCPStore on a port held by another process"),
    Scenario("rdzv_alone", "rendezvous_timeout", note="the other node never comes"),
    Scenario("rdzv_client", "rendezvous_timeout", note="the master never came up"),
    Scenario("coll_timeout", "collective_timeout", env={"JOB_PG_TIMEOUT": "4"}, note="a rank never joins an all_reduce"),
    Scenario("coll_monitored", "collective_timeout", note="a rank never reaches monitored_barrier"),
    Scenario("coll_size", "collective_mismatch", env={"JOB_PG_TIMEOUT": "10"},
             note="the ranks all_reduce tensors of different sizes: gloo's size check"),
    Scenario("coll_dtype", "collective_mismatch", env={"JOB_PG_TIMEOUT": "10"},
             note="the ranks all_reduce tensors of different dtypes: gloo's size check"),
    # With TORCH_DISTRIBUTED_DEBUG=DETAIL, torch 2.13's gloo crashes (SIGSEGV) on these mismatches
    # instead of naming them: what the log says is a segfault.
    Scenario("coll_mismatch_op", "segfault", env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL", "JOB_PG_TIMEOUT": "10"},
             note="one rank broadcasts while the other all_reduces, under TORCH_DISTRIBUTED_DEBUG=DETAIL: the ranks crash"),
    Scenario("coll_mismatch_shape", "segfault", env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL", "JOB_PG_TIMEOUT": "10"},
             note="the ranks all_reduce tensors of different sizes under TORCH_DISTRIBUTED_DEBUG=DETAIL: the ranks crash"),
    Scenario("peer_exit", "peer_lost", note="a rank leaves with os._exit(1), without a word"),
    Scenario("nan_loss", "loss_nonfinite", note="the loss turns NaN at the failing step and the run goes on"),
    Scenario("nan_inf", "loss_nonfinite", note="the loss turns inf at the failing step and the run goes on"),
    Scenario("nan_anomaly", "loss_nonfinite", note="autograd's anomaly mode stops at a backward that returned NaN"),
    # negatives
    Scenario("ok_plain", None, negative="healthy", note="a healthy run"),
    Scenario("ok_loader", None, negative="healthy", env={"JOB_WORKERS": "2"}, note="a healthy run with DataLoader workers"),
    Scenario("own_shape", None, negative="user_error", expect="RuntimeError", note="the program multiplies mismatched shapes"),
    Scenario("own_key", None, negative="user_error", expect="KeyError", env={"JOB_WORKERS": "2"},
             note="the dataset's own lookup raises in a DataLoader worker"),
    Scenario("own_value", None, negative="user_error", expect="ValueError", note="the program's own check raises"),
)

def _r2(name: str, cls: str | None, note: str, **kw) -> Scenario:
    return Scenario(name, cls, note=note, round=2, **kw)


# Round 2: written before the reader was read again, after round 1's test half had been tuned on.
# Each is another program (a Hugging Face-style Trainer, PyTorch's DDP tutorial, the DataLoader
# tutorial, a producer process and a queue) and another way of its class's fault than round 1's.
SCENARIOS2: tuple[Scenario, ...] = (
    _r2("st_full", "disk_full", "a Trainer saves model.safetensors onto a full file system", mount="full"),
    _r2("fobj_full", "disk_full", "rank 0 torch.save()s through an open file object onto a full file system", mount="full"),
    _r2("ro_makedirs", "read_only_fs", "a Trainer makes its checkpoint-N folder on a read-only file system", mount="ro"),
    _r2("ro_worker_cache", "read_only_fs", "a DataLoader worker pickles a decoded sample into a read-only cache folder",
        mount="ro"),
    _r2("perm_csv", "permission_denied", "a Trainer's CSV logger appends to a metrics file another user owns", mount="perm", user=True),
    _r2("perm_tmpfile", "permission_denied", "an atomic save's temporary file in a checkpoint folder another user owns",
        mount="perm", user=True),
    _r2("shm_queue", "shm_full", "a producer process puts 16 MiB batches on a torch.multiprocessing queue, 4 MiB /dev/shm",
        mount="shm", limit=40),
    _r2("shm_spawn_args", "shm_full", "a 16 MiB tensor handed to a spawned process, 4 MiB /dev/shm", mount="shm"),
    _r2("fd_memmap", "too_many_open_files", "a dataset memory-maps its .npy shards under ulimit -n 128", ulimit="-n 128"),
    _r2("fd_h5py", "too_many_open_files", "a dataset keeps an h5py handle per shard under ulimit -n 256", ulimit="-n 256"),
    _r2("mem_cat", "host_oom", "an evaluation keeps every batch's logits under ulimit -v", ulimit="-v 6000000"),
    _r2("mem_worker", "host_oom", "a DataLoader worker decodes an 8 GiB sample under ulimit -v", ulimit="-v 6000000"),
    _r2("kill_rank0", "oom_killed", "SIGKILL to rank 0 of the DDP tutorial (mp.spawn under python)", signal="kill_one"),
    _r2("kill_all", "oom_killed", "SIGKILL to every process of the job step at once, as a cgroup's OOM kill does",
        signal="kill_all"),
    _r2("segv_faulthandler", "segfault", "a native write near address 0 with faulthandler enabled"),
    _r2("segv_recursion", "segfault", "a recursive walk of a tree that loops, recursion limit raised: the C stack overflows"),
    _r2("term_handler", "job_terminated", "SIGTERM to every process; the Trainer's handler says so and exits 143",
        signal="term_group"),
    _r2("term_top", "job_terminated", "SIGTERM to the job's top process only (the launcher, the spawn parent)",
        signal="term_top"),
    _r2("missing_config", "file_missing", "the training config json is not there"),
    _r2("missing_sample", "file_missing", "a DataLoader worker opens a sample file deleted since the index was made"),
    _r2("import_six", "import_error", "old code imports torch._six"),
    _r2("import_name", "import_error", "from torch.utils.data import DataLoader2 (a name that moved out)"),
    _r2("ckpt_mixed", "checkpoint_corrupt", "resume from an optimizer.pt whose first half another writer wrote"),
    _r2("ckpt_appended", "checkpoint_corrupt", "torch.load of a snapshot two saves appended to (opened 'ab')"),
    _r2("wo_model", "checkpoint_weights_only", "torch.load (weights_only) of a whole model saved with torch.save(model)"),
    _r2("wo_dataclass", "checkpoint_weights_only", "torch.load (weights_only) of training args saved as a dataclass"),
    _r2("cuda_device_obj", "checkpoint_cuda_on_cpu", "torch.load(f, map_location=torch.device('cuda')) on a CPU box"),
    _r2("cuda_map_dict", "checkpoint_cuda_on_cpu", "the DDP tutorial's map_location={'cuda:0': 'cuda:RANK'} on a CPU box"),
    _r2("addr_tutorial", "address_in_use", "the DDP tutorial's MASTER_PORT (torchrun: its endpoint) held by another job",
        torchrun="--nnodes 1 --nproc-per-node 2 --rdzv-backend static --rdzv-endpoint 127.0.0.1:{busy}"),
    _r2("addr_metrics_port", "address_in_use", "a Trainer's metrics HTTP endpoint on a port another process holds"),
    _r2("rdzv_env_world", "rendezvous_timeout", "a world size the launch never reaches (env://; torchrun: 2 nodes, 1 came)",
        torchrun="--nnodes 2 --node-rank 0 --nproc-per-node 2 --rdzv-backend static --master-addr 127.0.0.1 "
                 "--master-port {free} --rdzv-conf timeout=8"),
    _r2("rdzv_file", "rendezvous_timeout", "a file:// rendezvous sized for more ranks than were started", limit=60),
    _r2("coll_barrier", "collective_timeout", "the other ranks wait at a barrier while rank 0 evaluates, timeout 5 s"),
    _r2("coll_bcast_obj", "collective_timeout", "broadcast_object_list from a rank 0 that is late, timeout 5 s"),
    _r2("coll_gather_into", "collective_mismatch", "all_gather_into_tensor of predictions, the last rank's batch shorter"),
    _r2("coll_p2p_shape", "collective_mismatch", "pipeline stages: send of (4, 32) activations, recv into (4, 16)"),
    _r2("peer_sysexit", "peer_lost", "a rank leaves by sys.exit(1) in the middle of training"),
    _r2("peer_early_stop", "peer_lost", "one rank stops early and leaves the process group while the other trains on"),
    _r2("nan_fp16", "loss_nonfinite", "float16 activations overflow under autocast: the Trainer logs loss inf, then nan"),
    _r2("nan_log0", "loss_nonfinite", "log(0) in a hand-written cross entropy, clip_grad_norm_(error_if_nonfinite=True)"),
    # negatives
    _r2("ok_trainer", None, "a healthy Trainer run, with a warning that no checkpoint was found", negative="healthy"),
    _r2("ok_ddp", None, "the DDP tutorial, healthy", negative="healthy"),
    _r2("ok_loader_tutorial", None, "the DataLoader tutorial's loop with 2 persistent workers, healthy", negative="healthy"),
    _r2("own_assert", None, "the data collator's own assert", negative="user_error", expect="AssertionError"),
    _r2("own_collate_type", None, "a collate_fn builds a tensor from a list with a string in it, in a worker",
        negative="user_error", expect="TypeError"),
    _r2("own_loss_shape", None, "cross_entropy of 20 outputs against 40 targets", negative="user_error", expect="ValueError"),
)
ROUNDS = {1: SCENARIOS, 2: SCENARIOS2}
BY_NAME = {s.name: s for s in SCENARIOS + SCENARIOS2}
assert len(BY_NAME) == len(SCENARIOS) + len(SCENARIOS2), "a scenario's name is its identity across rounds"

# What a log must show for its class to be said in it: the words of the OS, torch, the shell or
# the launcher that name the fault (not the reader's signs: a labelling rule, written before the
# reader was tuned on these logs). A log without them is labelled class null, "unsaid": its
# surrounding did not print why it failed (plain python killed by a signal prints nothing;
# torch's writer says "cannot be opened" without the OS's reason), and the reader must not guess.
EVIDENCE = {
    # ... or a short write to a regular file (torch's writer: "unexpected pos N vs M"; numpy: "N
    # requested and M written"): only a full disk (or a quota) writes less than asked
    "disk_full": r"No space left on device|Errno 28|ENOSPC|unexpected pos \d+ vs \d+|file write failed|\d+ requested and \d+ written",
    "read_only_fs": r"Read-only file system|Errno 30|EROFS",
    "permission_denied": r"Permission denied|Errno 13|EACCES|Operation not permitted|EPERM",
    "shm_full": r"No space left on device|Errno 28|ENOSPC|Bus error|SIGBUS",
    "too_many_open_files": r"Too many open files|Errno 24|EMFILE|ancdata",
    "host_oom": r"can't allocate memory|Cannot allocate memory|Unable to allocate|MemoryError|bad_alloc|Errno 12|ENOMEM",
    "oom_killed": r"Killed|SIGKILL|Signal 9\b|exitcode: -9\b|exit code 137|\b137\b",
    "segfault": r"Segmentation fault|SIGSEGV|Signal 11\b|exitcode: -11\b|\b139\b",
    "job_terminated": r"Terminated|SIGTERM|Signal 15\b|exitcode: -15\b|\b143\b|death signal",
    "file_missing": r"No such file or directory|Errno 2\b|FileNotFoundError",
    "import_error": r"ModuleNotFoundError|ImportError|No module named",
    # ... weights_only's "Unsupported operand 60": the file's first byte ('<') is no pickle opcode
    "checkpoint_corrupt": r"PytorchStreamReader|central directory|invalid load key|corrupt|Unsupported operand \d+",
    "checkpoint_weights_only": r"Unsupported global|add_safe_globals|safe_globals",
    "checkpoint_cuda_on_cpu": r"deserialize object on a CUDA device|cuda\.is_available\(\) is False",
    # ... and the OS's own words, capitalised, as Python's OSError prints them (round 2)
    "address_in_use": r"[Aa]ddress already in use|EADDRINUSE|errno: 98\b|Errno 98\b",
    "rendezvous_timeout": r"[Tt]imed out|[Tt]imeout",
    "collective_timeout": r"[Tt]imed out|[Tt]imeout|monitoredBarrier",
    "collective_mismatch": r"[Mm]ismatch|differ",
    "peer_lost": r"Connection closed by peer|Connection reset by peer|Broken pipe|terminated with exit code|exitcode: 1\b",
    "loss_nonfinite": r"\b(?:nan|inf)\b",
}


def label(sc: Scenario, text: str) -> tuple[str | None, str | None]:
    """(class, negative) of a log of ``sc``: its class when the log shows the fault's words."""
    if sc.cls is None:
        return None, sc.negative
    if re.search(EVIDENCE[sc.cls], text, re.I if sc.cls == "loss_nonfinite" else 0):
        return sc.cls, None
    return None, "unsaid"


def noise_of(scenario: str, surrounding: str) -> list[str]:
    """A varied, reproducible mix of noise for one log."""
    h = int(hashlib.sha256(f"{scenario}/{surrounding}".encode()).hexdigest(), 16)
    kinds = ["tqdm", "logging", "warnings", "cpp_info"]
    chosen = [k for i, k in enumerate(kinds) if (h >> i) & 1]
    return chosen or [kinds[h % 4]]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prepare(work: Path) -> None:
    """The inputs the scenarios read: a truncated checkpoint, an HTML page saved as weights, a
    checkpoint whose storages say CUDA (saved on this CPU box with a location tag registered
    for it, as a GPU box writes them), an extension that does not load."""
    (work / "ckpt_in").mkdir(parents=True, exist_ok=True)
    (work / "shards").mkdir(exist_ok=True)
    (work / "home").mkdir(exist_ok=True)
    ext = work / "ext"
    ext.mkdir(exist_ok=True)
    (ext / "fused_adam_cuda.cpython-311-x86_64-linux-gnu.so").write_bytes(b"version https://git-lfs.github.com/spec/v1\n")
    (work / "ckpt_in" / "pytorch_model.bin").write_text(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><title>Sign in</title></head><body>Redirecting</body></html>\n")
    code = (
        "import sys, torch\n"
        "d = sys.argv[1]\n"
        "torch.save({'model': torch.nn.Linear(16, 1).state_dict()}, d + '/full.pt')\n"
        "b = open(d + '/full.pt', 'rb').read(); open(d + '/truncated.pt', 'wb').write(b[: len(b) // 2])\n"
        "import argparse, numpy\n"
        "torch.save({'model': torch.nn.Linear(16, 1).state_dict(), 'args': argparse.Namespace(lr=0.05, epochs=3)}, d + '/with_args.pt')\n"
        "torch.save({'model': torch.nn.Linear(16, 1).state_dict(), 'best_loss': numpy.float64(0.25)}, d + '/with_numpy.pt')\n"
        "torch.serialization.register_package(1, lambda o: 'cuda:0' if o.device.type == 'cpu' else None, lambda o, loc: None)\n"
        "torch.save({'model': torch.nn.Linear(16, 1).state_dict()}, d + '/gpu_trained.pt')\n"
    )
    subprocess.run([sys.executable, "-c", code, str(work / "ckpt_in")], check=True)
    for p in [work, *work.rglob("*")]:
        os.chmod(p, 0o755 if p.is_dir() else 0o644)


def prepare2(work: Path) -> None:
    """Round 2's inputs, each made the way the fault makes it: an optimizer.pt whose first half
    another writer's file overwrote, a snapshot two saves appended to, a whole model and a
    dataclass pickled by torch.save, checkpoints whose storages say CUDA (a location tag
    registered on this CPU box, as a GPU box writes them), sample files and h5 shards."""
    inputs = work / "inputs"
    code = (
        "import dataclasses, os, sys, torch, numpy, h5py\n"
        "d = sys.argv[1]\n"
        "os.makedirs(d + '/checkpoint-2', exist_ok=True); os.makedirs(d + '/samples', exist_ok=True)\n"
        "os.makedirs(d + '/shards', exist_ok=True)\n"
        "m = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 1))\n"
        "opt = torch.optim.AdamW(m.parameters()); m(torch.randn(4, 16)).sum().backward(); opt.step()\n"
        "p = d + '/checkpoint-2/optimizer.pt'; torch.save(opt.state_dict(), p)\n"
        "torch.save({'ema': torch.randn(200000)}, d + '/other.pt')\n"
        "mine, other = open(p, 'rb').read(), open(d + '/other.pt', 'rb').read()\n"
        "open(p, 'wb').write(other[: len(mine) // 2] + mine[len(mine) // 2:]); os.remove(d + '/other.pt')\n"
        "t = torch.nn.Linear(10, 10); sd = {'module.net1.weight': t.weight.data, 'module.net1.bias': t.bias.data}\n"
        "with open(d + '/snapshot.pt', 'ab') as f: torch.save({**sd, 'optimizer': {'exp_avg': torch.randn(50000)}}, f)\n"
        "with open(d + '/snapshot.pt', 'ab') as f: torch.save(sd, f)\n"
        "torch.save(m, d + '/whole_model.pt')\n"
        "@dataclasses.dataclass\n"
        "class TrainingArguments:\n"
        "    output_dir: str = 'out'\n"
        "    learning_rate: float = 5e-05\n"
        "torch.save(TrainingArguments(), d + '/checkpoint-2/training_args.bin')\n"
        "for i in range(32): numpy.save(f'{d}/samples/sample_{i:05d}.npy', numpy.random.rand(16).astype('float32'))\n"
        "for i in range(320):\n"
        "    with h5py.File(f'{d}/shards/shard-{i:03d}.h5', 'w') as f: f['x'] = numpy.zeros((8, 16), 'float32')\n"
        "torch.serialization.register_package(1, lambda o: 'cuda:0' if o.device.type == 'cpu' else None, lambda o, loc: None)\n"
        "torch.save(m.state_dict(), d + '/gpu_trained.pt')\n"
        "t = torch.nn.Linear(10, 10)\n"
        "torch.save({'module.net1.weight': t.weight.data, 'module.net1.bias': t.bias.data}, d + '/gpu_ddp.checkpoint')\n"
    )
    inputs.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-c", code, str(inputs)], check=True)
    for p in [work, *work.rglob("*")]:
        os.chmod(p, 0o755 if p.is_dir() else 0o644)


def mount_script(sc: Scenario, work: Path) -> str:
    """Shell lines run inside the private mount namespace before the job."""
    mnt = work / "mnt"
    lines = ["set -e"]
    if sc.mount == "full":
        lines += [f"mount -t tmpfs -o size=1m tmpfs {mnt}", f"mkdir -p {mnt}/ckpt {mnt}/cache",
                  f"head -c 900k /dev/zero > {mnt}/.filler 2>/dev/null || true"]
    elif sc.mount == "ro":
        lines += [f"mount -t tmpfs -o size=8m tmpfs {mnt}", f"mkdir -p {mnt}/ckpt {mnt}/cache",
                  f"mount -o remount,ro {mnt}"]
    elif sc.mount == "perm":
        lines += [f"mount -t tmpfs -o size=8m,mode=0755 tmpfs {mnt}", f"mkdir -p {mnt}/ckpt {mnt}/cache",
                  f"echo step,loss > {mnt}/metrics.csv"]
    elif sc.mount == "shm":
        lines += ["mount -t tmpfs -o size=4m tmpfs /dev/shm"]
    if sc.user:
        lines += [f"mount --bind {Path(sys.prefix)} {work}/python"]
    return "\n".join(lines)


def python_of(sc: Scenario, work: Path) -> str:
    if sc.user:
        return str(work / "python" / Path(sys.executable).relative_to(sys.prefix))
    return sys.executable


def job_command(sc: Scenario, surrounding: str, work: Path, ports: dict) -> list[str]:
    py = python_of(sc, work)
    job = [str(work / JOBS[sc.round].name), sc.name, str(work)]
    if surrounding == "python" or (surrounding == "batch" and (sc.round == 2 or not sc.name.startswith("rdzv_"))):
        return [py, *job]
    run = [py, "-m", "torch.distributed.run"]
    if sc.torchrun:
        args = sc.torchrun.format(**ports).split()
    elif sc.round == 2:
        args = ["--standalone", "--nproc-per-node", "2"]
    elif sc.name == "addr_taken":
        args = ["--nnodes", "1", "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(ports["busy"])]
    elif sc.name == "rdzv_alone":
        args = ["--nnodes", "2", "--nproc-per-node", "2", "--rdzv-backend", "c10d", "--rdzv-id", "job42",
                "--rdzv-endpoint", f"127.0.0.1:{ports['free']}", "--rdzv-conf", "join_timeout=6"]
    elif sc.name == "rdzv_client":
        args = ["--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
                "--master-port", str(ports["dead"]), "--rdzv-conf", "timeout=6,read_timeout=6"]
    else:
        args = ["--standalone", "--nproc-per-node", "2"]
    return [*run, *args, *job]


BATCH = """#!/bin/bash
#SBATCH --job-name={name}
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --time=00:20:00
#SBATCH --output=%x-%j.out
set -e
{trap}echo "job $SLURM_JOB_ID starting on $(hostname) at $(date -u +%FT%TZ)"
export OMP_NUM_THREADS=1
cd {work}
{limit}{command}
echo "training finished, exit code $?"
"""


def command_of(sc: Scenario, surrounding: str, work: Path, ports: dict) -> list[str]:
    cmd = job_command(sc, surrounding, work, ports)
    quoted = " ".join(_q(c) for c in cmd)
    if surrounding == "batch":
        h = int(hashlib.sha256(sc.name.encode()).hexdigest(), 16)
        trap = "trap 'echo \"job script: exit status $?\"' EXIT\n" if h % 2 else ""
        script = work / f"{sc.name}.sbatch"
        script.write_text(BATCH.format(name=sc.name, trap=trap, work=work, command=quoted,
                                       limit=f"ulimit {sc.ulimit}\n" if sc.ulimit else ""))
        os.chmod(script, 0o755)
        inner = f"exec bash {_q(str(script))}"
    else:
        inner = (f"ulimit {sc.ulimit}; " if sc.ulimit else "") + f"exec {quoted}"
    if sc.user:
        inner = f"exec setpriv --reuid {NOBODY} --regid {NOBODY} --clear-groups bash -c {_q(inner)}"
    if sc.mount or sc.user:
        return ["unshare", "-m", "--propagation", "private", "bash", "-c", mount_script(sc, work) + "\n" + inner]
    return ["bash", "-c", inner]


def _q(s: str) -> str:
    return "'" + s.replace("'", "'\\''") + "'"


def env_of(sc: Scenario, surrounding: str, work: Path, ports: dict) -> dict:
    noise = noise_of(sc.name, surrounding)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH", "JOB_", "UPS_", "PYTEST", "MASTER_", "RANK",
                                                                     "WORLD_SIZE", "LOCAL_"))}
    env.update({"JOB_NOISE": ",".join(noise), "HOME": str(work / "home"), "PYTHONUNBUFFERED": "1",
                "JOB_BUSY_PORT": str(ports["busy"]), "JOB_DEAD_PORT": str(ports["dead"]), "OMP_NUM_THREADS": "1",
                "SLURM_JOB_ID": str(4_200_000 + int(hashlib.sha256(sc.name.encode()).hexdigest()[:4], 16))})
    if sc.name == "addr_taken" and surrounding != "torchrun":
        env.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(ports["busy"])})
    if sc.user:  # the interpreter bind-mounted where uid 65534 reaches it finds its packages here
        env["PYTHONPATH"] = str(work / "python" / Path(sysconfig.get_paths()["purelib"]).relative_to(sys.prefix))
    if "cpp_info" in noise:
        env["TORCH_CPP_LOG_LEVEL"] = "INFO"
    env.update(sc.env)
    return env


def descendants(pid: int) -> list[int]:
    """Every process under ``pid`` (torchrun puts each rank in a process group of its own)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                kids = [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
            out += kids
            todo += kids
    return out


def signal_job(pid: int, sig: int, shell_too: bool = True) -> None:
    """``sig`` to every process of the job, as a scheduler signals a job step's processes
    (``shell_too=False``: not the batch script's shell, as ``scancel --signal`` spares it)."""
    for p in [pid] * shell_too + descendants(pid):
        try:
            os.kill(p, sig)
        except ProcessLookupError:
            pass


def reap_all() -> None:
    """Kill and reap whatever the job left: this process is their subreaper, so an orphan (a
    rank whose torchrun died) is still its descendant."""
    for _ in range(50):
        left = descendants(os.getpid())
        if not left:
            return
        for p in left:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            pass
        time.sleep(0.1)


def send_signal(sc: Scenario, surrounding: str, proc: subprocess.Popen, work: Path, deadline: float) -> str:
    """Wait until the failing process says it is at its step, then signal it from outside."""
    while time.monotonic() < deadline and proc.poll() is None:
        ready = list(work.glob("ready.*"))
        if ready:
            pid = int(ready[0].suffix[1:])
            time.sleep(0.5)  # its peers reach their collective
            if sc.signal in ("kill_one", "kill_worker"):
                os.kill(pid, signal.SIGKILL)  # the OOM killer kills one process
                return f"SIGKILL to pid {pid}"
            if sc.signal == "kill_all":  # a cgroup's OOM kill (memory.oom.group): the whole step at once
                signal_job(proc.pid, signal.SIGKILL, shell_too=surrounding != "batch")
                return "SIGKILL to every process of the job step"
            if sc.signal == "term_top":  # `kill PID` of the launcher (batch: of the script's command)
                top = proc.pid if surrounding != "batch" else (descendants(proc.pid) or [proc.pid])[0]
                os.kill(top, signal.SIGTERM)
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    pass
                return f"SIGTERM to the job's top process {top}"
            signal_job(proc.pid, signal.SIGTERM, shell_too=surrounding != "batch")
            try:
                proc.wait(timeout=8)
            except subprocess.TimeoutExpired:
                signal_job(proc.pid, signal.SIGKILL)
                return "SIGTERM to every process of the job, SIGKILL 8 s later"
            return "SIGTERM to every process of the job"
        time.sleep(0.1)
    return "never ready"


def run_one(sc: Scenario, surrounding: str, work: Path, logs: Path) -> dict:
    for p in work.glob("ready.*"):
        p.unlink()
    (work / "mnt").mkdir(exist_ok=True)
    (work / "python").mkdir(exist_ok=True)
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    ports = {"busy": busy.getsockname()[1], "dead": free_port(), "free": free_port()}
    cmd = command_of(sc, surrounding, work, ports)
    log_path = logs / f"{sc.name}.{surrounding}.log"
    sent = ""
    t0 = time.monotonic()
    try:
        with open(log_path, "wb") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=env_of(sc, surrounding, work, ports), cwd=work, start_new_session=True)
            try:
                if sc.signal:
                    sent = send_signal(sc, surrounding, proc, work, time.monotonic() + 90)
                rc = proc.wait(timeout=sc.limit)
            except subprocess.TimeoutExpired:  # the time limit: as a scheduler ends a job
                signal_job(proc.pid, signal.SIGTERM, shell_too=surrounding != "batch")
                sent = "time limit: SIGTERM to every process of the job"
                try:
                    rc = proc.wait(timeout=8)
                except subprocess.TimeoutExpired:
                    rc = None
            finally:
                signal_job(proc.pid, signal.SIGKILL)  # anything of the job still there
                proc.wait()
                reap_all()
    finally:
        busy.close()
    cls, negative = label(sc, log_path.read_text(encoding="utf-8", errors="replace"))
    return {"log": log_path.name, "class": cls, "negative": negative, "expect": sc.expect, "scenario": sc.name,
            "surrounding": surrounding, "exit_code": rc, "signal_sent": sent or None,
            "noise": noise_of(sc.name, surrounding), "note": sc.note, "seconds": round(time.monotonic() - t0, 1)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--round", type=int, choices=sorted(ROUNDS), default=1,
                   help="which scenarios --only picks from by default: 1 (failure_job.py) or 2 (failure_job2.py)")
    p.add_argument("--only", default="", help="comma-separated scenario names (default: all of --round's)")
    p.add_argument("--surroundings", default=",".join(SURROUNDINGS))
    p.add_argument("--relabel", action="store_true", help="only label OUT's logs again (the scenarios' classes, EVIDENCE)")
    args = p.parse_args()
    if args.relabel:
        path = args.out / "manifest.json"
        manifest = json.loads(path.read_text())
        for e in manifest["logs"]:
            text = (args.out / "logs" / e["log"]).read_text(encoding="utf-8", errors="replace")
            sc = BY_NAME[e["scenario"]]
            e["class"], e["negative"] = label(sc, text)
            e["note"], e["expect"] = sc.note, sc.expect
        path.write_text(json.dumps(manifest, indent=1) + "\n")
        return 0
    names = [n for n in args.only.split(",") if n] or [s.name for s in ROUNDS[args.round]]
    unknown = [n for n in names if n not in BY_NAME]
    surroundings = [s for s in args.surroundings.split(",") if s]
    if unknown or not set(surroundings) <= set(SURROUNDINGS):
        print(f"make_failure_logs.py: unknown scenario or surrounding: {unknown or surroundings}", file=sys.stderr)
        return 2
    privileged = [n for n in names if BY_NAME[n].mount or BY_NAME[n].user]
    if privileged and (os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("setpriv") is None):
        print(f"make_failure_logs.py: {', '.join(privileged)} need root, unshare and setpriv (private mounts, a second "
              "user); leave them out with --only", file=sys.stderr)
        return 2
    import ctypes

    import torch

    ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: orphans of a job stay ours to reap
    out = args.out.resolve()
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"failure-logs-{os.getpid()}"
    work.mkdir(mode=0o755)
    try:
        for job in JOBS.values():
            shutil.copy(job, work / job.name)
        prepare(work)
        if any(BY_NAME[n].round == 2 for n in names):
            prepare2(work)
        manifest_path = out / "manifest.json"
        old = json.loads(manifest_path.read_text())["logs"] if manifest_path.exists() else []
        entries = {(e["scenario"], e["surrounding"]): e for e in old}
        order = {s.name: i for i, s in enumerate(SCENARIOS + SCENARIOS2)}
        for name in names:
            for surrounding in surroundings:
                entry = run_one(BY_NAME[name], surrounding, work, logs)
                entries[(name, surrounding)] = entry
                print(json.dumps({k: entry[k] for k in ("log", "class", "exit_code", "seconds")}), flush=True)
                rows = sorted(entries.values(), key=lambda e: (order.get(e["scenario"], 999), SURROUNDINGS.index(e["surrounding"])))
                manifest_path.write_text(json.dumps({"torch": torch.__version__, "python": sys.version.split()[0],
                                                     "logs": rows}, indent=1) + "\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
