"""A user's own program behind ``ups launch``: ``torchrun ...`` and ``python ...`` lines.

``ups launch torchrun --nproc-per-node 2 train.py --lr 3e-4`` runs exactly the line the user
had, with three additions to torchrun's own options when the user gave none of that kind:
``--standalone`` (no rendezvous option given: a busy port 29500 never matters), a
``--log-dir`` inside the run, and ``--redirects 3 --tee 3`` (each rank's output in its own
file and in the job log). Everything else passes through untouched, ``--`` included.

The job's processes are instrumented through ``ups.instrument`` (no code change); this
module only builds the command and checks what can be checked before anything starts.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ups.errors import UpsError

# torchrun's options (torch.distributed.run, torch 2.2 ... 2.14) that take no value; every
# other option takes one. tests/test_instrument.py checks this against torch's parser.
TORCHRUN_FLAGS = frozenset({
    "--standalone", "--no-python", "--no_python", "-m", "--module", "--run-path", "--run_path",
    "--virtual-local-rank", "--virtual_local_rank", "-h", "--help",
})
TORCHRUN_VALUE_OPTIONS = frozenset({
    "--nnodes", "--nproc-per-node", "--nproc_per_node", "--rdzv-backend", "--rdzv_backend", "--rdzv-endpoint",
    "--rdzv_endpoint", "--rdzv-id", "--rdzv_id", "--rdzv-conf", "--rdzv_conf", "--max-restarts", "--max_restarts",
    "--monitor-interval", "--monitor_interval", "--start-method", "--start_method", "--role", "--log-dir", "--log_dir",
    "-r", "--redirects", "-t", "--tee", "--local-ranks-filter", "--local_ranks_filter", "--node-rank", "--node_rank",
    "--master-addr", "--master_addr", "--master-port", "--master_port", "--local-addr", "--local_addr",
    "--logs-specs", "--logs_specs", "--numa-binding", "--numa_binding", "--signals-to-handle", "--signals_to_handle",
    "--event-log-handler", "--event_log_handler", "--duplicate-stdout-filters", "--duplicate_stdout_filters",
    "--duplicate-stderr-filters", "--duplicate_stderr_filters", "--shutdown-timeout", "--shutdown_timeout",
})
RENDEZVOUS = ("standalone", "rdzv_endpoint", "rdzv_backend", "rdzv_id", "rdzv_conf", "master_addr", "master_port")


def _canonical(option: str) -> str:
    return option.lstrip("-").replace("-", "_")


@dataclass
class ProgramLine:
    """A parsed ``torchrun`` or ``python`` command line."""

    launcher: str  # "torchrun" | "python"
    options: list[str]  # the launcher's own options, as given
    target: list[str]  # python: ["train.py"], ["-m", "pkg.train"], ["-c", "code"]; torchrun: [script or module]
    args: list[str]  # the program's arguments
    values: dict[str, str | None] = field(default_factory=dict)  # canonical option -> value

    @property
    def is_module(self) -> bool:
        return self.target[:1] == ["-m"] or self.has("m", "module")

    @property
    def name(self) -> str:
        """A short name for the run id: the script's stem or the module's last part."""
        if not self.target:
            return self.launcher
        if self.target[0] == "-c":
            return "inline"
        if self.is_module:
            return self.target[-1].rsplit(".", 1)[-1] or self.launcher
        return Path(self.target[-1]).stem or self.launcher

    def has(self, *canonical: str) -> bool:
        return any(c in self.values for c in canonical)


def parse_torchrun(argv: list[str]) -> ProgramLine:
    """Split a torchrun line into its options, the script (or module) and the script's args."""
    values: dict[str, str | None] = {}
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok == "--":  # argparse: what follows is the script and its arguments
            return ProgramLine("torchrun", argv[: i + 1], argv[i + 1 : i + 2], argv[i + 2 :], values)
        if not tok.startswith("-") or tok == "-":
            # torchrun's -m is one of its own flags (already in the options): the target is the name.
            return ProgramLine("torchrun", argv[:i], [tok], argv[i + 1 :], values)
        name, eq, value = tok.partition("=")
        if len(name) > 2 and not name.startswith("--") and name[:2] in ("-r", "-t"):
            values[_canonical(name[:2])] = name[2:]  # -r3: a short option with its value attached
            i += 1
            continue
        known = _resolve_torchrun_option(name)
        if known in TORCHRUN_FLAGS:
            values[_canonical(known)] = None
            i += 1
        elif eq:
            values[_canonical(known)] = value
            i += 1
        else:
            if i + 1 >= len(argv):
                raise UpsError(f"torchrun option {tok} needs a value")
            values[_canonical(known)] = argv[i + 1]
            i += 2
    raise UpsError("no training script in the torchrun line (expected: ups launch torchrun [torchrun options] SCRIPT|-m MODULE [ARGS...])")


def _resolve_torchrun_option(name: str) -> str:
    if name in TORCHRUN_FLAGS or name in TORCHRUN_VALUE_OPTIONS:
        return name
    if name.startswith("--"):  # argparse accepts unambiguous prefixes (--nproc for --nproc-per-node)
        matches = {o for o in TORCHRUN_FLAGS | TORCHRUN_VALUE_OPTIONS if o.startswith(name)}
        actions = {_canonical(o) for o in matches}
        if len(actions) == 1:
            return sorted(matches)[0]
    raise UpsError(f"{name} is not a torchrun option this ups knows (see `torchrun --help`)")


_PYTHON_VALUE_OPTIONS = ("-W", "-X", "--check-hash-based-pycs")


def parse_python(argv: list[str]) -> ProgramLine:
    """Split a python line into interpreter options, the script/module/code and its args."""
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok in ("-m", "-c"):
            if i + 1 >= len(argv):
                raise UpsError(f"python {tok} needs a {'module' if tok == '-m' else 'command'}")
            return ProgramLine("python", argv[:i], [tok, argv[i + 1]], argv[i + 2 :])
        if tok.startswith("-m") and len(tok) > 2:
            return ProgramLine("python", argv[:i], ["-m", tok[2:]], argv[i + 1 :])
        if tok == "--":
            return ProgramLine("python", argv[: i + 1], argv[i + 1 : i + 2], argv[i + 2 :])
        if tok in _PYTHON_VALUE_OPTIONS:
            i += 2
            continue
        if tok.startswith("-") and tok != "-":
            i += 1
            continue
        return ProgramLine("python", argv[:i], [tok], argv[i + 1 :])
    raise UpsError("no script in the python line (expected: ups launch python [python options] SCRIPT|-m MODULE [ARGS...])")


def check_script(line: ProgramLine) -> None:
    """A script that does not exist is bad input, named before anything starts."""
    if not line.target or line.is_module or line.target[0] == "-c" or line.has("no_python"):
        return
    script = line.target[0]
    if script != "-" and not Path(script).is_file():
        raise UpsError(f"{script}: no such script (in {os.getcwd()})")


def torchrun_executable() -> list[str]:
    """The user's ``torchrun`` (their environment's), else this Python's torch.distributed.run."""
    found = shutil.which("torchrun")
    if found:
        return [found]
    if importlib.util.find_spec("torch") is not None:
        return [sys.executable, "-m", "torch.distributed.run"]
    raise UpsError("torchrun is not on PATH and torch is not installed for this Python")


def python_executable() -> str:
    """The ``python`` the user's shell would run (their venv's), else the one running ups."""
    return shutil.which("python") or shutil.which("python3") or sys.executable


def torchrun_command(line: ProgramLine, *, rdzv_id: str | None = None) -> list[str]:
    """torchrun + our additions (only where the user gave none of their own) + their line.

    ``{RUN}`` is replaced by the run folder when the run is created. ``rdzv_id`` (a run
    across nodes: its run id) becomes ``--rdzv-id`` when the line has none: two runs on
    one endpoint never meet in torchrun's default rendezvous id."""
    extra: list[str] = []
    if rdzv_id and not line.has("rdzv_id"):
        extra += ["--rdzv-id", rdzv_id]
    if not line.has(*RENDEZVOUS):
        extra.append("--standalone")  # it picks a free port; never `--master-port 0` without it
    if not line.has("log_dir"):
        extra += ["--log-dir", "{RUN}/logs/torchrun"]
    if not line.has("redirects", "r", "tee", "t"):
        extra += ["--redirects", "3", "--tee", "3"]
    return [*torchrun_executable(), *extra, *line.options, *line.target, *line.args]


def world_size(line: ProgramLine) -> int | None:
    """nnodes x nproc-per-node when both are plain numbers (not "gpu", "auto", "1:4")."""
    try:
        nproc = int(line.values.get("nproc_per_node") or 1)
        nnodes = int(line.values.get("nnodes") or 1)
    except ValueError:
        return None
    return nproc * nnodes


def multinode(line: ProgramLine) -> dict[str, str | int | None] | None:
    """A torchrun line across nodes (``--nnodes`` above 1, or a range like ``2:4``): what
    ups records of it; None for one node. Such a line must name its rendezvous (else
    ``--standalone`` would be added and each node would train alone)."""
    nnodes = line.values.get("nnodes") or "1"
    if nnodes.strip() in ("1", "1:1"):
        return None
    if not line.has("rdzv_endpoint", "master_addr"):
        raise UpsError(f"--nnodes {nnodes} needs a rendezvous every node can reach: --rdzv-backend c10d "
                       "--rdzv-endpoint HOST:PORT (the same on every node)")
    try:
        count: int | None = int(nnodes.split(":")[-1])
    except ValueError:
        count = None
    node_rank = line.values.get("node_rank")
    return {"nnodes": count, "node_rank": int(node_rank) if node_rank and node_rank.isdigit() else None,
            "rdzv_endpoint": line.values.get("rdzv_endpoint") or line.values.get("master_addr")}


# ------------------------------------------------------------ accelerate, deepspeed, srun
# The launchers ups runs as they are (their own options untouched): each one's executable, the
# role of the process ups starts, and the options that say how many ranks there will be.
OTHER_LAUNCHERS: dict[str, dict[str, object]] = {
    # accelerate's launcher runs torch's elastic agent in its own process (multi-GPU/CPU):
    # an agent, whose children carry RANK.
    "accelerate": {"top_role": "agent", "procs": ("--num_processes", "--num-processes"),
                   "nodes": ("--num_machines", "--num-machines"), "node_rank": ("--machine_rank", "--machine-rank"),
                   "endpoint": ("--main_process_ip", "--main-process-ip")},
    # deepspeed's runner starts a per-node launcher (a helper) that starts the ranks with RANK set.
    "deepspeed": {"top_role": "agent", "procs": ("--num_gpus", "--num-gpus", "--num_accelerators"),
                  "nodes": ("--num_nodes", "--num-nodes")},
    # srun is no Python: each task it starts is a top process, a rank by its SLURM_PROCID.
    "srun": {"top_role": "rank", "procs": ("-n", "--ntasks"), "nodes": ("-N", "--nodes")},
}


def _option_value(argv: list[str], names: tuple[str, ...]) -> str | None:
    for i, tok in enumerate(argv):
        name, eq, value = tok.partition("=")
        if name in names:
            if eq:
                return value
            return argv[i + 1] if i + 1 < len(argv) else None
        if len(name) > 2 and name[:2] in names and not name.startswith("--"):
            return name[2:]  # -n2
    return None


def parse_other(launcher: str, argv: list[str]) -> ProgramLine:
    """An accelerate / deepspeed / srun line, kept as given: the script (the first ``.py``,
    else the first argument that is no option) names the run."""
    if launcher == "accelerate" and argv[:1] != ["launch"]:
        raise UpsError("expected `ups launch accelerate launch [accelerate options] SCRIPT [ARGS...]`")
    script = next((a for a in argv if a.endswith(".py")), None)
    target = [script] if script else []
    spec = OTHER_LAUNCHERS[launcher]
    values = {key: _option_value(argv, spec[key]) for key in ("procs", "nodes", "node_rank", "endpoint")  # type: ignore[arg-type]
              if key in spec}
    return ProgramLine(launcher, [], target, [], {k: v for k, v in values.items() if v is not None})


def other_world_size(line: ProgramLine) -> int | None:
    """Ranks the line asks for (srun: tasks in all; the others: per node x nodes)."""
    try:
        procs = int(line.values["procs"]) if "procs" in line.values else None
        nodes = int(line.values.get("nodes") or 1)
    except ValueError:
        return None
    if procs is None:
        return None
    return procs if line.launcher == "srun" else procs * nodes


def launcher_executable(launcher: str) -> list[str]:
    found = shutil.which(launcher)
    if found:
        return [found]
    hints = {
        "accelerate": "pip install accelerate",
        "deepspeed": "pip install deepspeed (or run your DeepSpeed script with `ups launch torchrun`: DeepSpeed "
                     "accepts torchrun's environment)",
        "srun": "srun comes with SLURM; outside a SLURM cluster use `ups launch torchrun`",
    }
    raise UpsError(f"{launcher} is not on PATH ({hints[launcher]})")
