"""The checks of ``ups doctor``: each returns (status, detail, hint), each bounded in time.

Checks that can hang (torch/CUDA init, HDF5 opens, DataLoader workers, DDP) run as
subprocess probes (:func:`run_probe`) started in their own session and killed with their
whole process group at their timeout; nothing heavy is imported in the doctor itself.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"
NETWORK_FS = ("nfs", "nfs4", "cifs", "smb3", "smbfs", "sshfs", "fuse", "fuse.sshfs", "fuse.s3fs", "fuse.gcsfuse",
              "lustre", "glusterfs", "ceph", "beegfs", "9p", "afs")
PACKAGES = ("typer", "textual", "h5py", "psutil", "nvidia-ml-py", "wandb", "PyYAML", "torch", "numpy")


@dataclass
class Options:
    config: Path | None = None
    root: Path | None = None
    cache_dir: Path | None = None
    runs_dir: Path = Path("runs")
    tasks: list[str] = field(default_factory=list)  # empty: every task found
    splits: list[str] = field(default_factory=list)  # empty: every split found
    num_workers: int = 2
    batch_size: int = 8
    prefetch_factor: int = 2
    timeout_scale: float = 1.0
    config_error: str | None = None


@dataclass(frozen=True)
class Verdict:
    status: str
    detail: str
    hint: str = ""


@dataclass(frozen=True)
class Check:
    id: str
    title: str
    run: Callable[[Options], Verdict]
    timeout: float
    probe: bool = False  # runs a subprocess that can hang: skipped by --quick


# ------------------------------------------------------------------------- probes
@dataclass(frozen=True)
class ProbeResult:
    returncode: int | None  # None: killed at the timeout
    out: str
    err: str


def run_probe(args: list[str], timeout: float, env: dict[str, str] | None = None, preexec: Any = None) -> ProbeResult:
    """Run ``args`` in a new session; at ``timeout`` kill its whole process group."""
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL, preexec_fn=preexec)
    try:
        out, err = proc.communicate(timeout=timeout)
        return ProbeResult(proc.returncode, out, err)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, err = proc.communicate()
        return ProbeResult(None, out, err)


def python_probe(code: str, timeout: float, **kw: Any) -> ProbeResult:
    return run_probe([sys.executable, "-c", textwrap.dedent(code)], timeout, **kw)


def last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:200] if lines else ""


# ------------------------------------------------------------------------- checks
def check_python(o: Options) -> Verdict:
    missing, versions = [], []
    for pkg in PACKAGES:
        try:
            versions.append(f"{pkg} {importlib.metadata.version(pkg)}")
        except importlib.metadata.PackageNotFoundError:
            missing.append(pkg)
    py = f"Python {sys.version.split()[0]}"
    if missing:
        hint = "pip install torch==2.13.0 (CPU) or a CUDA build, then pip install -e ." if "torch" in missing else "pip install -e ."
        return Verdict(FAIL, f"{py}; missing: {', '.join(missing)}", hint)
    return Verdict(OK, f"{py}; " + ", ".join(versions))


def check_config(o: Options) -> Verdict:
    if o.config is None:
        return Verdict(SKIP, "no --config given")
    if o.config_error:
        return Verdict(FAIL, o.config_error, "fix the named key in the config file")
    return Verdict(OK, f"{o.config} is valid")


TORCH_PROBE = """
import json, torch
info = {"torch": torch.__version__, "cuda": torch.cuda.is_available(), "devices": 0, "nccl": None}
if info["cuda"]:
    info["devices"] = torch.cuda.device_count()
    try:
        info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception as exc:
        info["nccl"] = f"unavailable ({exc})"
    torch.zeros(1, device="cuda")  # a real CUDA context: this is where a broken driver hangs
print(json.dumps(info))
"""


def check_torch(o: Options) -> Verdict:
    t = 30 * o.timeout_scale
    r = python_probe(TORCH_PROBE, t)
    if r.returncode is None:
        return Verdict(FAIL, f"importing torch / initialising CUDA did not return within {t:g} s", "check the driver: nvidia-smi; a hung GPU needs a reset")
    if r.returncode != 0:
        return Verdict(FAIL, f"torch probe failed: {last_line(r.err)}", "pip install torch==2.13.0 (CPU) or the CUDA build for this driver")
    info = json.loads(last_line(r.out))
    if not info["cuda"]:
        return Verdict(WARN, f"torch {info['torch']}, no CUDA: jobs run on the CPU (gloo)", "on a GPU box: install the CUDA build of torch and the NVIDIA driver")
    return Verdict(OK, f"torch {info['torch']}, CUDA with {info['devices']} device(s), NCCL {info['nccl']}")


def check_gpu(o: Options) -> Verdict:
    from ups.gpu import attribute, get_provider, records_for_attribution

    view = attribute(get_provider().snapshot(), records_for_attribution(o.runs_dir))
    g = view.gpu
    if not g.available:
        return Verdict(WARN, f"No visible devices found: {g.reason}", "expected on a CPU box; on a GPU box install the driver or check CUDA_VISIBLE_DEVICES")
    used = ", ".join(f"GPU{d.index} {d.name}: {_gib(d.memory_used)}/{_gib(d.memory_total)} used" for d in g.devices)
    orphans = view.orphans()
    if orphans:
        held = sum(p.used_memory or 0 for p in orphans)
        who = ", ".join(f"pid {p.pid} ({p.user}: {(p.command or '?')[:40]})" for p in orphans[:3])
        return Verdict(WARN, f"{used}; {_gib(held)} held by processes in no run: {who}", "kill them (ups gpu lists them) or the next launch may OOM")
    return Verdict(OK, f"driver {g.driver_version}; {used}")


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("0.0.0.0", port))
            return True
        except OSError:
            return False


def check_torchrun(o: Options) -> Verdict:
    import importlib.util

    have = shutil.which("torchrun") or importlib.util.find_spec("torch.distributed.run") is not None
    if not have:
        return Verdict(FAIL, "torchrun not found", "install torch (it ships torchrun)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    if not _port_free(29500):
        return Verdict(WARN, f"torchrun present; free port {free} bindable; port 29500 is busy",
                       "ups launch uses --standalone (a free port) and is unaffected; a hand-written torchrun on 29500 will collide")
    return Verdict(OK, f"torchrun present; free port {free} bindable; 29500 free")


def _sample_bytes(o: Options) -> int:
    """Bytes of one raw sample, from the data manifests (no shard is opened here)."""
    if o.root:
        for man in Path(o.root).glob("*.index.json"):
            try:
                shape = json.loads(man.read_text())["shards"][0]["sample_shape"]
                n = 4
                for s in shape:
                    n *= int(s)
                return n
            except (OSError, ValueError, KeyError, IndexError):
                continue
    return 16 * 64 * 4  # a small 1D sample


def check_shm(o: Options) -> Verdict:
    try:
        st = os.statvfs("/dev/shm")
    except OSError:
        return Verdict(WARN, "/dev/shm not found", "DataLoader workers pass tensors through shared memory; mount a tmpfs on /dev/shm")
    size = st.f_blocks * st.f_frsize
    free = st.f_bavail * st.f_frsize
    need = max(1, o.num_workers) * o.prefetch_factor * o.batch_size * _sample_bytes(o) * 2
    detail = f"/dev/shm {_gib(size)} ({_gib(free)} free); {o.num_workers} workers need about {_mib(need)}"
    if free < need:
        return Verdict(FAIL, detail, "docker run --shm-size=8g, or fewer workers / smaller batches")
    if free < 4 * need:
        return Verdict(WARN, detail, "little headroom: raise --shm-size")
    return Verdict(OK, detail)


def check_ulimit(o: Options) -> Verdict:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = 256 + max(1, o.num_workers) * o.prefetch_factor * (o.batch_size * 3 + 16)
    detail = f"ulimit -n {soft} (hard {hard}); {o.num_workers} workers need about {need}"
    if soft < need:
        return Verdict(FAIL, detail, f"ulimit -n {min(max(need * 2, 4096), hard)} (workers hand tensors over as file descriptors)")
    return Verdict(OK, detail)


def _free(path: Path) -> tuple[Path, int]:
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    return p, shutil.disk_usage(p).free


def _estimated_cache_bytes(o: Options) -> int:
    samples = 0
    if o.root:
        for man in Path(o.root).glob("*.index.json"):
            try:
                samples += sum(int(s["count"]) for s in json.loads(man.read_text())["shards"])
            except (OSError, ValueError, KeyError):
                continue
    return samples * 32 * 16 * 32 * 2  # T x tokens x dim fp16, defaults


def check_disk(o: Options) -> Verdict:
    need = _estimated_cache_bytes(o)
    parts, worst = [], OK
    for label, path in (("runs", o.runs_dir), ("cache", o.cache_dir)):
        if path is None:
            continue
        where, free = _free(Path(path))
        parts.append(f"{label} {where}: {_gib(free)} free")
        if label == "cache" and need and free < need:
            worst = FAIL
        elif free < 1 << 30 and worst == OK:
            worst = WARN
    detail = "; ".join(parts) + (f"; cache needs about {_mib(need)}" if need else "")
    return Verdict(worst, detail, "" if worst == OK else "free disk space or choose another --cache-dir")


def check_ram(o: Options) -> Verdict:
    import psutil

    avail = psutil.virtual_memory().available
    size = 0
    if o.cache_dir and Path(o.cache_dir).is_dir():
        size = sum(p.stat().st_size for p in Path(o.cache_dir).glob("*/sample_*.pt"))
    size = size or _estimated_cache_bytes(o)
    detail = f"{_gib(avail)} available; cache preload needs about {_mib(size * 1.2)} (with 20% margin)"
    if size * 1.2 > avail:
        return Verdict(WARN, detail, "training will read the cache from disk (slower); or add RAM")
    return Verdict(OK, detail)


def fs_type(path: Path) -> tuple[str, str]:
    """(mount point, file-system type) holding ``path``, from /proc/mounts (longest prefix)."""
    target = str(_free(Path(path).resolve())[0])
    best = ("/", "?")
    try:
        with open("/proc/mounts") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) < 3:
                    continue
                mnt = parts[1].replace("\\040", " ")
                if (target == mnt or target.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best[0]):
                    best = (mnt, parts[2])
    except OSError:
        pass
    return best


def check_fs(o: Options) -> Verdict:
    found, worst = [], OK
    for label, path in (("data", o.root), ("cache", o.cache_dir)):
        if path is None:
            continue
        mnt, kind = fs_type(Path(path))
        found.append(f"{label} on {kind} ({mnt})")
        if kind in NETWORK_FS or kind.startswith("fuse"):
            worst = WARN
    if not found:
        return Verdict(SKIP, "no --root or --cache-dir")
    hint = "network and FUSE mounts hang h5py.File() with the GIL held; copy shards to local disk first" if worst == WARN else ""
    return Verdict(worst, "; ".join(found), hint)


def check_hdf5(o: Options) -> Verdict:
    """Every shard of every task and split found under the root (the config's lists when
    given), each opened and one sample read, in a probe process killed if it hangs."""
    if o.root is None:
        return Verdict(SKIP, "no --root or config root")
    from ups.data.probe import probe_shards
    from ups.data.tasks import SPLITS, TASKS

    given = bool(o.tasks)  # from a config: each of its task/splits must have shards
    pairs = [(t, s) for t in (o.tasks or TASKS) for s in (o.splits or SPLITS)]
    t = 5 * o.timeout_scale
    survey = probe_shards(o.root, pairs, timeout=t, require=given, read_sample=True, deadline=50 * o.timeout_scale)
    files = survey.files
    bad = [survey.bad[p] for p in files if p in survey.bad]
    if bad:
        return Verdict(FAIL, f"{len(bad)} of {len(files)} shard(s) bad: " + "; ".join(bad + survey.problems),
                       "fix or move the named shards (a FIFO or hung mount blocks h5py.File()), "
                       "or launch with --skip-bad-shards to cache the rest")
    if survey.problems:
        return Verdict(FAIL, "; ".join(survey.problems), "check --root / the config's root, or make data with `ups data synth`")
    if not files:
        return Verdict(FAIL, f"no shards under {o.root}", "make some with `ups data synth` or check --root")
    return Verdict(OK, f"{len(files)} shard(s) of {', '.join(survey.splits)} opened, one sample read from each")


def check_cache(o: Options) -> Verdict:
    if o.cache_dir is None:
        return Verdict(SKIP, "no --cache-dir or config cache_dir")
    if not Path(o.cache_dir).is_dir():
        return Verdict(SKIP, f"{o.cache_dir} does not exist yet")
    t = 60 * o.timeout_scale
    r = run_probe([sys.executable, "-m", "ups", "cache", "verify", str(o.cache_dir), "--json"], t)
    if r.returncode is None:
        return Verdict(FAIL, f"verifying {o.cache_dir} did not finish within {t:g} s", "run `ups cache verify` by hand")
    try:
        data = json.loads(r.out)
    except ValueError:
        return Verdict(FAIL, f"cache verify failed: {last_line(r.err)}")
    if data["ok"]:
        n = sum(s["valid"] for s in data["splits"].values())
        return Verdict(OK, f"{n} valid samples in {len(data['splits'])} split(s)")
    first = data["problems"][0]
    kinds = sorted({p["kind"] for p in data["problems"]})
    hint = "ups cache fix " + str(o.cache_dir) if {"cuda", "temp"} & set(kinds) else "rerun the precompute (it resumes)"
    return Verdict(FAIL, f"{len(data['problems'])} problem(s) ({', '.join(kinds)}); first: {first['path']}: {first['detail']}", hint)


DATALOADER_PROBE = """
import torch
class D(torch.utils.data.Dataset):
    def __len__(self): return 16
    def __getitem__(self, i): return torch.full((4,), float(i))
n = sum(len(b) for b in torch.utils.data.DataLoader(D(), batch_size=4, num_workers=2, timeout=20))
assert n == 16, n
print("ok")
"""


def check_dataloader(o: Options) -> Verdict:
    t = 40 * o.timeout_scale
    r = python_probe(DATALOADER_PROBE, t)
    if r.returncode is None:
        return Verdict(FAIL, f"a DataLoader with 2 workers did not deliver within {t:g} s", "check /dev/shm and ulimit -n (see those checks)")
    if r.returncode != 0:
        return Verdict(FAIL, f"DataLoader workers failed: {last_line(r.err)}", "check /dev/shm and ulimit -n")
    return Verdict(OK, "2 DataLoader workers started and delivered 16 samples")


def _ddp(backend: str, t: float) -> ProbeResult:
    return run_probe([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                      "-m", "ups.jobs.ddp_probe"], t, env={"UPS_DOCTOR_BACKEND": backend, "OMP_NUM_THREADS": "1"})


def check_ddp(o: Options) -> Verdict:
    t = 60 * o.timeout_scale
    r = _ddp("gloo", t)
    if r.returncode is None:
        return Verdict(FAIL, f"2-process DDP (gloo) did not initialise and all-reduce within {t:g} s",
                       "a firewall or a wrong network interface (GLOO_SOCKET_IFNAME)?")
    if r.returncode != 0:
        return Verdict(FAIL, f"2-process DDP (gloo) failed: {last_line(r.err)}", "run `ups launch train --debug` for details")
    detail = "torchrun --standalone, 2 ranks, gloo all-reduce ok"
    from ups.gpu import get_provider

    snap = get_provider().snapshot()
    if snap.available and len(snap.devices) >= 2:
        r = _ddp("nccl", t)
        if r.returncode != 0:
            why = "did not finish" if r.returncode is None else last_line(r.err)
            return Verdict(FAIL, f"{detail}; NCCL: {why}", "NCCL_DEBUG=INFO; check NCCL_P2P_DISABLE / IB settings")
        detail += "; NCCL all-reduce ok"
    return Verdict(OK, detail)


def check_wandb(o: Options) -> Verdict:
    try:
        version = importlib.metadata.version("wandb")
    except importlib.metadata.PackageNotFoundError:
        return Verdict(WARN, "wandb not installed: training runs without W&B", "pip install wandb")
    mode = os.environ.get("WANDB_MODE", "offline (ups default)")
    key = bool(os.environ.get("WANDB_API_KEY"))
    netrc = Path.home() / ".netrc"
    if not key and netrc.exists():
        try:
            key = "api.wandb.ai" in netrc.read_text()
        except OSError:
            pass
    detail = f"wandb {version}, mode {mode}, API key {'configured' if key else 'not configured'}"
    if str(mode).startswith("online") and not key:
        return Verdict(WARN, detail, "wandb login, or WANDB_MODE=offline and `wandb sync` later")
    return Verdict(OK, detail)


def _gib(n: int | float | None) -> str:
    return "?" if n is None else f"{n / (1 << 30):.1f} GiB"


def _mib(n: int | float) -> str:
    from ups.format import fmt_bytes

    return fmt_bytes(n)


CHECKS: tuple[Check, ...] = (
    Check("python", "Python and packages", check_python, 5),
    Check("config", "Config file", check_config, 5),
    Check("torch", "torch, CUDA, NCCL", check_torch, 35, probe=True),
    Check("gpu", "GPUs and memory held outside runs", check_gpu, 10),
    Check("torchrun", "torchrun and ports", check_torchrun, 5),
    Check("shm", "/dev/shm for DataLoader workers", check_shm, 5),
    Check("ulimit", "Open-file limit", check_ulimit, 5),
    Check("disk", "Free disk for runs and cache", check_disk, 10),
    Check("ram", "RAM for the cache preload", check_ram, 10),
    Check("fs", "File systems of data and cache", check_fs, 5),
    Check("hdf5", "HDF5 shards open and read", check_hdf5, 60, probe=True),
    Check("cache", "Latent cache verification", check_cache, 65, probe=True),
    Check("dataloader", "DataLoader worker start", check_dataloader, 45, probe=True),
    Check("ddp", "2-process DDP smoke test", check_ddp, 130, probe=True),
    Check("wandb", "Weights & Biases", check_wandb, 5),
)
