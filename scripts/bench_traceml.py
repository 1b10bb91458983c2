"""TraceML on bench_straggler's DDP job (issue 48): when and whether TraceML (traceml-ai) names
the slow rank, with which words, what it says on a healthy run and on a one-off pause, and what
its launcher and its lines cost the job. One JSON line (``--out`` also writes it to a file), a
line per case on stderr as it goes.

TraceML's documented way, read from the installed package (traceml-ai 0.5.0): its README (the
package's METADATA, site-packages/traceml_ai-0.5.0.dist-info/METADATA, the same text as
https://pypi.org/project/traceml-ai/0.5.0/), "Plain PyTorch example" and "Distributed
training": ``import traceml_ai as traceml``, ``traceml.init(mode="auto")``, each step's
``optimizer.zero_grad`` through ``optimizer.step`` inside ``with traceml.trace_step(model):``,
launched as ``traceml run train.py --nproc-per-node=N`` (``--args`` for the script's own
arguments, traceml_ai/launcher/cli.py). Its default mode (``summary``) says nothing until the run
ends; the live view is ``--mode=cli`` ("intended for single-node runs", cli.py), a Rich Live
terminal panel (traceml_ai/aggregator/display_drivers/cli.py) whose "Model Step Summary" prints
``Issue:``, ``Why:`` and ``Next:`` from the last 100 steps every ``--interval`` (2 s, the
default, kept here). It needs a terminal: each run here gets a pseudo-terminal (200x100), and its
output is read as it comes, each ``Issue:`` stamped with the time it arrived. The culprit rank is
the one its ``Next:`` line names ("Inspect ... on r1.", "... around r1."). At the end of every run
its ``final_summary.json`` (``logs/<run-name>/``) gives the end-of-run verdict a default-mode
user sees.

The job: pytorch/examples' multigpu_torchrun.py (tests/programs/multigpu_torchrun.py, CPU/gloo,
2 DataLoader workers a rank made anew every 32-step epoch), copied into a temp dir with TraceML's
three lines added and the fault written into the program as a user would rehearse it, on rank 1,
from ``--after`` s (20) past its first step:

- compute x F: (F - 1) x the healthy step time (the healthy run's median step interval on rank
  0, under TraceML) of busy-work (a spin) per batch, in its model's forward (a forward pre-hook:
  a slower rank computes more slowly); ``compute-1.5-step``: the same spin in the step's own code
  (inside ``trace_step``, before ``zero_grad``: outside the phases TraceML times);
- input: its Dataset 1 ms slower per sample (in its DataLoader workers);
- pause: rank 1 stops once for 3 s; healthy: no fault.

Each run stops itself ``--after`` + ``--watch`` s (20 + 30) past its first step (the ranks agree
at an epoch's start, an all_reduce). "named" is the seconds from the fault's start (rank 1's
first step past ``--after``) to the first ``Issue:`` of a straggler kind (``STRAGGLER``,
``INPUT STRAGGLER``, ``COMPUTE STRAGGLER``, ``H2D STRAGGLER``) whose ``Next:`` names r1. Measured
loss: 1 - rank 0's step rate over the fault's 10th s to the end / over the 15 s before it.

Overhead: the healthy job under ``traceml run`` (its default mode) with its lines against the same
program without them under ``torchrun --standalone --nproc-per-node 2``, alternated, ``--repeat``
clean runs each (2), each rank 0's steps/s from 5 s after its first step to its end (30 s), and the
whole job's CPU time per step over the same stretch (every process in the run's folder: launcher,
TraceML's aggregator, torchrun, ranks, DataLoader workers, from /proc), which a busy box moves
less than the step rate (though still some).

A run whose rank 0 writes no step for ``STALL_S`` (20 s) before its end is hung: it gets Ctrl-C,
is reported as ``hung`` (with its training output's tail) and is not used for the overhead.

TraceML lives in its own venv: ``--python`` is that venv's python (default: this one), its
``traceml`` command beside it.

    python -m venv /tmp/venv-traceml && /tmp/venv-traceml/bin/pip install torch traceml-ai==0.5.0
    python scripts/bench_traceml.py --python /tmp/venv-traceml/bin/python [--only healthy,input] [--out FILE]
"""

from __future__ import annotations

import argparse
import codecs
import fcntl
import json
import os
import re
import select
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
import time
from pathlib import Path

from ups.status import procfs  # the one reader of /proc
from ups.status.printable import plain_text  # every escape sequence out, as ups reads a log

ROOT = Path(__file__).resolve().parent.parent
PROGRAM = ROOT / "tests/programs/multigpu_torchrun.py"
ARGS = ["1000000", "100000"]  # total_epochs, save_every: it runs until it stops itself
COLS, ROWS = 200, 100
STALL_S = 20  # rank 0 writes a line every epoch (< 2 s): none for this long, and no end, is a hang
STRAGGLER_WORDS = ("STRAGGLER", "INPUT STRAGGLER", "COMPUTE STRAGGLER", "H2D STRAGGLER")
CASES = ["healthy", "compute-1.1", "compute-1.25", "compute-1.5", "compute-2", "compute-1.5-step", "input", "pause"]

# What the bench adds to the program: its clock, its fault and its stop. Not TraceML's.
BENCH_HEAD = '''
import mmap as _bmmap
import struct as _bstruct
import time as _btime

import torch.distributed as _bdist

_BENCH = dict(kind=os.environ.get("BENCH_FAULT", ""), ms=float(os.environ.get("BENCH_MS", "0")),
              after=float(os.environ.get("BENCH_AFTER", "20")), run=float(os.environ.get("BENCH_RUN_S", "50")),
              out=os.environ.get("BENCH_OUT", "."))
_BCLOCK = _bmmap.mmap(-1, 8)  # rank 1's fault start, shared with the DataLoader workers it forks
_BSTATE = {"t0": None, "last": None, "said": False, "paused": False, "gaps": [], "steps": 0}


def _bench_fault_on():
    (at,) = _bstruct.unpack_from("d", _BCLOCK)
    return bool(at) and _btime.time() >= at


def _bench_spin():
    end = _btime.perf_counter() + _BENCH["ms"] / 1e3
    while _btime.perf_counter() < end:
        pass


def _bench_step(rank, where):
    """At each batch: the rank's clock, its step gaps, and rank 1's fault."""
    now = _btime.time()
    st = _BSTATE
    if where == "start":
        if st["t0"] is None:
            st["t0"] = now
            if rank == 1:
                _bstruct.pack_into("d", _BCLOCK, 0, now + _BENCH["after"])
        elif st["last"] is not None:
            st["gaps"].append(now - st["last"])
        st["last"] = now
        st["steps"] += 1
        if rank == 1 and _BENCH["kind"] and _bench_fault_on():
            if not st["said"]:
                st["said"] = True
                with open(os.path.join(_BENCH["out"], "fault_start"), "w") as f:
                    f.write(repr(now))
            if _BENCH["kind"] == "pause" and not st["paused"]:
                st["paused"] = True
                _btime.sleep(3.0)
            elif _BENCH["kind"] == "compute-step":
                _bench_spin()


def _bench_epoch(rank):
    """At each epoch's start: rank 0's steps so far, and whether every rank stops now."""
    st = _BSTATE
    now = _btime.time()
    if rank == 0 and st["t0"] is not None:
        with open(os.path.join(_BENCH["out"], "steps"), "a") as f:
            f.write(f"{now!r} {st['steps']}\\n")
    st["last"] = None  # a new epoch's first step waits for its new workers: not a step gap
    stop = torch.tensor([1.0 if st["t0"] is not None and now >= st["t0"] + _BENCH["run"] else 0.0])
    _bdist.all_reduce(stop, op=_bdist.ReduceOp.MAX)
    if stop.item():
        with open(os.path.join(_BENCH["out"], f"gaps-{rank}"), "w") as f:
            f.write(json.dumps(sorted(st["gaps"])))
        return True
    return False


def _bench_forward_pre_hook(module, args):
    if _BENCH["kind"] == "compute-forward" and int(os.environ["RANK"]) == 1 and _bench_fault_on():
        _bench_spin()
'''


def _sub(src: str, old: str, new: str) -> str:
    if old not in src:
        raise SystemExit(f"bench_traceml: {PROGRAM.name} has changed: {old.strip()[:60]!r} not found")
    return src.replace(old, new, 1)


def make_program(traceml: bool) -> str:
    """The job's source with the bench's clock and fault, and TraceML's lines when ``traceml``."""
    src = PROGRAM.read_text()
    src = _sub(src, "import os\n", "import json\nimport os\n")
    src = _sub(src, "from torch.utils.data.distributed import DistributedSampler\n",
               "from torch.utils.data.distributed import DistributedSampler\n" + BENCH_HEAD)
    # The input fault: rank 1's Dataset, 1 ms more a sample once the fault is on.
    src = _sub(src, "        return self.data[index]\n",
               "        if _BENCH['kind'] == 'input' and int(os.environ['RANK']) == 1 and _bench_fault_on():\n"
               "            _btime.sleep(_BENCH['ms'] / 1e3)\n"
               "        return self.data[index]\n")
    src = _sub(src, "    model = torch.nn.Linear(20, 1)  # load your model\n",
               "    model = torch.nn.Linear(20, 1)  # load your model\n"
               "    model.register_forward_pre_hook(_bench_forward_pre_hook)\n")
    src = _sub(src, "        for epoch in range(self.epochs_run, max_epochs):\n",
               "        for epoch in range(self.epochs_run, max_epochs):\n"
               "            if _bench_epoch(self.global_rank):\n"
               "                break\n")
    body = ("        self.optimizer.zero_grad()\n        output = self.model(source)\n"
            "        loss = F.cross_entropy(output, targets)\n        loss.backward()\n        self.optimizer.step()\n")
    if traceml:  # TraceML's quickstart: its import, init() once, each step inside trace_step(model)
        src = _sub(src, "import torch\n", "import torch\nimport traceml_ai as traceml\n")
        src = _sub(src, "    ddp_setup()\n", "    ddp_setup()\n    traceml.init(mode=\"auto\")\n")
        src = _sub(src, body, "        with traceml.trace_step(self.model):\n"
                   "            _bench_step(self.global_rank, 'start')\n"
                   + "".join("    " + line + "\n" for line in body.splitlines()))
    else:
        src = _sub(src, body, "        _bench_step(self.global_rank, 'start')\n" + body)
    return src


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kill_leftovers(case_dir: Path) -> None:
    """End what is still running in the case's folder (processes this bench started)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if Path(os.readlink(proc / "cwd")).resolve() == case_dir.resolve():
                os.kill(int(proc.name), signal.SIGKILL)
        except (OSError, ValueError):
            pass


def tree_cpu_s(case_dir: Path) -> float:
    """CPU seconds of every process running in the case's folder (launcher, aggregator, torchrun,
    ranks, DataLoader workers), with what their reaped children used (cutime, cstime)."""
    total = 0.0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if Path(os.readlink(proc / "cwd")) != case_dir:
                continue
        except OSError:
            continue
        st = procfs.stat(int(proc.name))
        total += st.cpu_s(children=True) if st else 0.0
    return total


def run_job(python: str, case_dir: Path, *, traceml: bool, mode: str, env_extra: dict, limit_s: float) -> dict:
    """Run the program once (under ``traceml run`` in a pseudo-terminal, or plain torchrun); its
    terminal output as (time, text) pieces and its wall clock."""
    case_dir.mkdir(parents=True)
    (case_dir / "train.py").write_text(make_program(traceml))
    env = {**os.environ, **env_extra, "BENCH_OUT": str(case_dir), "COLUMNS": str(COLS), "LINES": str(ROWS),
           "TERM": "xterm-256color", "PYTHONUNBUFFERED": "1"}
    env.pop("UPS_FAULTS", None)
    if traceml:
        cmd = [str(Path(python).parent / "traceml"), "run", "train.py", "--nproc-per-node", "2", "--mode", mode,
               "--logs-dir", str(case_dir / "logs"), "--run-name", "run", "--master-port", str(free_port()),
               "--aggregator-port", str(free_port()), "--args", *ARGS]
    else:
        cmd = [python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "train.py", *ARGS]
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLS, 0, 0))
    started = time.time()
    proc = subprocess.Popen(cmd, cwd=case_dir, env=env, stdin=slave, stdout=slave, stderr=slave,
                            start_new_session=True)
    os.close(slave)
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    pieces: list[tuple[float, str]] = []
    cpu: list[tuple[float, float]] = []
    carry, interrupted, stalled = "", False, False
    while True:
        ready, _, _ = select.select([master], [], [], 0.5)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:
                data = b""
            if not data:
                break
            text = carry + decoder.decode(data)
            cut = text.rfind("\x1b")
            carry, text = (text[cut:], text[:cut]) if cut >= 0 and cut > len(text) - 16 else ("", text)
            pieces.append((time.time(), plain_text(text)))
        elif proc.poll() is not None:
            break
        if not cpu or time.time() >= cpu[-1][0] + 0.5:
            cpu.append((time.time(), tree_cpu_s(case_dir)))
        steps = case_dir / "steps"
        stalled = stalled or (steps.exists() and time.time() - steps.stat().st_mtime > STALL_S
                              and not list(case_dir.glob("gaps-*")))
        if (time.time() > started + limit_s or stalled) and not interrupted:
            interrupted = True
            os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: TraceML's launcher ends its children
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    os.close(master)
    kill_leftovers(case_dir)
    return {"pieces": pieces, "cpu": cpu, "rc": proc.returncode, "interrupted": interrupted, "stalled": stalled,
            "wall_s": time.time() - started}


def issues(pieces: list[tuple[float, str]]) -> list[dict]:
    """Every ``Issue:`` the live panel printed, with its ``Why:``, ``Next:``, the rank ``Next:``
    names and the time it arrived."""
    text, ends = "", []
    for t, piece in pieces:
        text += piece
        ends.append((len(text), t))
    out = []
    pat = re.compile(r"Issue: (.+?)\s*[│|].*?Why: (.+?)\s*[│|].*?Next: (.+?)\s*[│|]", re.S)
    for m in pat.finditer(text):
        at = next(t for end, t in ends if end >= m.end())
        nxt = m.group(3).strip()
        named = re.findall(r"\br(\d+)\b", nxt)
        out.append({"t": at, "status": m.group(1).strip(), "why": m.group(2).strip(), "next": nxt,
                    "rank": int(named[-1]) if named else None})
    return out


def read_steps(case_dir: Path) -> list[tuple[float, int]]:
    try:
        return [(float(a), int(b)) for a, b in (line.split() for line in (case_dir / "steps").read_text().splitlines())]
    except (OSError, ValueError):
        return []


def rate(steps: list[tuple[float, int]], t0: float, t1: float) -> float | None:
    inside = [s for s in steps if t0 <= s[0] <= t1]
    if len(inside) < 3 or inside[-1][0] <= inside[0][0]:
        return None
    return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])


def cpu_per_step(steps: list[tuple[float, int]], cpu: list[tuple[float, float]], t0: float, t1: float) -> float | None:
    """The whole job's CPU ms per step between t0 and t1 (the CPU samples nearest before each)."""
    inside = [s for s in steps if t0 <= s[0] <= t1]
    if len(inside) < 3:
        return None
    (a, sa), (b, sb) = inside[0], inside[-1]
    ca = [c for t, c in cpu if t <= a]
    cb = [c for t, c in cpu if t <= b]
    if not ca or not cb or sb <= sa:
        return None
    return (cb[-1] - ca[-1]) / (sb - sa) * 1e3


def final_summary(case_dir: Path) -> dict | None:
    try:
        summary = json.loads(next((case_dir / "logs").rglob("final_summary.json")).read_text())
    except (StopIteration, OSError, ValueError):
        return None
    primary = summary.get("primary_diagnosis") or {}
    return {k: primary.get(k) for k in ("status", "severity", "summary", "action")}


def counts(found: list[dict]) -> dict:
    return {s: sum(1 for f in found if f["status"] == s) for s in sorted({f["status"] for f in found})}


def run_case(python: str, tmp: Path, name: str, fault: str, ms: float, args) -> dict:
    case_dir = tmp / name
    env = {"BENCH_FAULT": fault, "BENCH_MS": str(ms), "BENCH_AFTER": str(args.after),
           "BENCH_RUN_S": str(args.after + args.watch)}
    job = run_job(python, case_dir, traceml=True, mode="cli", env_extra=env, limit_s=args.after + args.watch + 150)
    found = issues(job["pieces"])
    steps = read_steps(case_dir)
    out: dict = {"case": name, "fault": fault or None, "fault_ms": round(ms, 2) if fault else None,
                 "rc": job["rc"], "interrupted": job["interrupted"], "hung": job["stalled"]}
    try:
        gaps = json.loads((case_dir / "gaps-0").read_text())
        out["step_ms"] = round(statistics.median(gaps) * 1e3, 2) if gaps else None
    except (OSError, ValueError):
        out["step_ms"] = None
    try:
        start = float((case_dir / "fault_start").read_text())
    except (OSError, ValueError):
        start = None
    first = steps[0][0] if steps else None
    if fault == "" and first is not None:
        start = first + args.after  # no fault: its "before" and "after" split the run where a fault would start
    before = [f for f in found if start is None or f["t"] < start]
    after = [f for f in found if start is not None and f["t"] >= start]
    out["issues_before"] = counts(before)
    out["issues_after"] = counts(after)
    alarms = [f for f in (found if not fault or fault == "pause" else before) if f["status"] in STRAGGLER_WORDS]
    out["straggler_issues_without_straggler"] = len(alarms)
    if alarms:
        out["first_false"] = {"status": alarms[0]["status"], "rank": alarms[0]["rank"], "why": alarms[0]["why"],
                              "at_s": round(alarms[0]["t"] - start, 1) if start else None}
    if steps:
        out["steps_for_s"] = round(steps[-1][0] - steps[0][0], 1)  # rank 0's first epoch line to its last
    if job["interrupted"]:  # it did not end by itself: what its ranks said last
        tail = "".join(f.read_text(errors="replace") for f in (case_dir / "logs").rglob("training.std*.log"))
        out["training_output_tail"] = re.sub(r"\s+", " ", tail[-800:])
    if start is not None and first is not None and steps:
        r0 = rate(steps, max(first + 5, start - 15), start - 1)
        r1 = rate(steps, start + 10, steps[-1][0])
        if r0 and r1:
            out["rate_before"], out["rate_after"] = round(r0, 1), round(r1, 1)
            out["measured_loss"] = round(max(0.0, 1 - r1 / r0), 3)
    if fault and fault != "pause":
        hits = [f for f in after if f["status"] in STRAGGLER_WORDS]
        right = [f for f in hits if f["rank"] == 1]
        out["seconds_to_named"] = round(right[0]["t"] - start, 1) if right else None
        if right:
            out["named"] = {"rank": 1, "status": right[0]["status"], "why": right[0]["why"], "next": right[0]["next"]}
        out["straggler_issues_after"] = {f"{s} r{r}": sum(1 for h in hits if h["status"] == s and h["rank"] == r)
                                         for s, r in sorted({(h["status"], h["rank"]) for h in hits}, key=str)}
    out["last_issue"] = ({"status": found[-1]["status"], "why": found[-1]["why"], "rank": found[-1]["rank"]}
                         if found else None)
    out["final_summary"] = final_summary(case_dir)
    if not found:
        tail = "".join(p for _, p in job["pieces"])[-600:]
        out["no_issue_output_tail"] = re.sub(r"\s+", " ", tail)
    return out


def overhead(python: str, tmp: Path, args) -> dict:
    """Steps/s of the healthy job: ``traceml run`` (default mode) with TraceML's lines against plain
    torchrun without them, alternated."""
    rates: dict[str, list[float]] = {"traceml": [], "torchrun": []}
    hung = {"traceml": 0, "torchrun": 0}
    cpus: dict[str, list[float]] = {"traceml": [], "torchrun": []}
    for i in range(2 * args.repeat):  # a hung run is counted, not measured: another one takes its place
        for kind in ("traceml", "torchrun"):
            if len(rates[kind]) >= args.repeat:
                continue
            case_dir = tmp / f"overhead-{kind}-{i}"
            env = {"BENCH_FAULT": "", "BENCH_RUN_S": str(args.overhead_s)}
            job = run_job(python, case_dir, traceml=kind == "traceml", mode="summary", env_extra=env,
                          limit_s=args.overhead_s + 150)
            steps = read_steps(case_dir)
            r = rate(steps, steps[0][0] + 5, steps[-1][0]) if steps else None
            c = cpu_per_step(steps, job["cpu"], steps[0][0] + 5, steps[-1][0]) if steps else None
            print(json.dumps({"overhead": kind, "run": i, "steps_per_s": r and round(r, 1),
                              "cpu_ms_per_step": c and round(c, 2), "rc": job["rc"], "hung": job["stalled"]}),
                  file=sys.stderr, flush=True)
            if job["stalled"]:
                hung[kind] += 1
            elif r and c:
                rates[kind].append(r)
                cpus[kind].append(c)
    out: dict = {"steps_per_s": {k: [round(r, 1) for r in v] for k, v in rates.items()},
                 "cpu_ms_per_step": {k: [round(c, 2) for c in v] for k, v in cpus.items()}, "hung": hung}
    if rates["traceml"] and rates["torchrun"]:
        out["slowdown"] = round(1 - statistics.mean(rates["traceml"]) / statistics.mean(rates["torchrun"]), 3)
        out["cpu_ratio"] = round(statistics.mean(cpus["traceml"]) / statistics.mean(cpus["torchrun"]), 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", default=sys.executable, help="a python with torch and traceml-ai (its venv's)")
    ap.add_argument("--only", default="", help=f"comma-separated cases of {','.join(CASES)},overhead")
    ap.add_argument("--after", type=float, default=20.0, help="the fault starts this long after rank 1's first step")
    ap.add_argument("--watch", type=float, default=30.0, help="each run goes on this long after that")
    ap.add_argument("--sample-ms", type=float, default=1.0, help="the input fault: ms more a sample")
    ap.add_argument("--step-ms", type=float, default=None, help="the healthy step time (else the healthy run's)")
    ap.add_argument("--repeat", type=int, default=2, help="overhead runs of each kind")
    ap.add_argument("--overhead-s", type=float, default=30.0, help="each overhead run's length after its first step")
    ap.add_argument("--out", default=None)
    ap.add_argument("--keep", action="store_true", help="keep the runs' folders (their programs, TraceML's logs)")
    args = ap.parse_args()
    probe = subprocess.run([args.python, "-c", "import torch, traceml_ai; print(traceml_ai.__version__, torch.__version__)"],
                           capture_output=True, text=True)
    if probe.returncode != 0 or not (Path(args.python).parent / "traceml").exists():
        raise SystemExit(f"bench_traceml: traceml-ai (and its `traceml` command) is not installed for {args.python}: "
                         "pip install traceml-ai==0.5.0 in a venv with torch, and pass --python VENV/bin/python")
    traceml_version, torch_version = probe.stdout.split()
    only = set(filter(None, args.only.split(",")))
    tmp = Path(tempfile.mkdtemp(prefix="bench-traceml-"))
    results, extra = [], {}
    try:
        step_ms = args.step_ms
        for name in CASES:
            if only and name not in only and not (name == "healthy" and step_ms is None
                                                  and any(c.startswith("compute") for c in only)):
                continue
            if name == "healthy":
                fault, ms = "", 0.0
            elif name.startswith("compute"):
                factor = float(name.split("-")[1])
                fault, ms = ("compute-step" if name.endswith("-step") else "compute-forward"), (factor - 1) * step_ms
            else:
                fault, ms = name, (args.sample_ms if name == "input" else 0.0)
            res = run_case(args.python, tmp, name, fault, ms, args)
            if name == "healthy" and step_ms is None:
                step_ms = res.get("step_ms") or 10.0
            results.append(res)
            print(json.dumps(res), file=sys.stderr, flush=True)
        if not only or "overhead" in only:
            extra["overhead"] = overhead(args.python, tmp, args)
    finally:
        if args.keep:
            print(f"bench_traceml: kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    line = json.dumps({"traceml": traceml_version, "torch": torch_version, "cpus": os.cpu_count(),
                       "healthy_step_ms": step_ms, "cases": results, **extra})
    print(line)
    if args.out:
        Path(args.out).write_text(line + "\n")


if __name__ == "__main__":
    main()
