"""The names ups compares other programs' things against, in one place (ups.status.vocabulary):
torch.distributed's collectives, checked against the installed torch."""

from __future__ import annotations

import json
import re
from pathlib import Path

from ups.status.vocabulary import C10D_COLLECTIVES, COLLECTIVE_OPS, FUNCTIONAL_COLLECTIVES


def test_every_collective_named_is_one_of_the_installed_torchs():
    import torch.distributed._functional_collectives as functional
    import torch.distributed.distributed_c10d as c10d

    assert [n for n in C10D_COLLECTIVES if not callable(getattr(c10d, n, None))] == []
    assert [n for n in FUNCTIONAL_COLLECTIVES if not callable(getattr(functional, n, None))] == []


def test_the_collectives_fsdp_calls_are_known_and_exported_as_themselves():
    """FSDP2 and FSDP1 call dist.all_gather_single and dist.reduce_scatter_single (torch 2.13):
    each is a known op, and the exporter's op label is its name, not "other"."""
    import torch.distributed.distributed_c10d as c10d

    from ups.exporter.families import collective_op

    called = set()
    for path in (Path(c10d.__file__).parent / "fsdp").rglob("*.py"):
        called |= set(re.findall(r"\b(?:dist|c10d|torch\.distributed)\.(\w+)\(", path.read_text()))
    helpers = re.compile(r"^(?:get_|is_|new_|init_|destroy_)")
    collectives = {n for n in called if callable(getattr(c10d, n, None)) and not helpers.match(n)}
    assert {"all_gather_single", "reduce_scatter_single"} <= collectives
    assert collectives <= COLLECTIVE_OPS
    for op in (*collectives, "_all_gather_base", "_reduce_scatter_base", "all_gather_tensor", "wait"):
        assert collective_op(op) == op
    assert collective_op("not_a_collective") == "other" and collective_op(None) == "other"


# -- library frames: one definition, the same "own" frame from a run and from its log ----------------
LIBRARY_OPS = '''\
def call(fn, x):
    return fn(x)


def check(x):
    raise ValueError(f"bad value {x}")
'''
GENERATED = "def forward(x):\n    return lib.check(x)\n"  # as torch.fx's GraphModule code: "<eval_with_key>.0"
MAIN = '''\
import importlib.util, sys
spec = importlib.util.spec_from_file_location("ops", sys.argv[1])
lib = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lib)
ns = {"lib": lib}
exec(compile(GENERATED, "<eval_with_key>.0", "exec"), ns)


def step(x):
    return lib.call(ns["forward"], x)


step(3)
'''.replace("GENERATED", repr(GENERATED), 1)


def test_a_run_and_its_log_name_the_same_own_frame(runs_root, tmp_path):
    """A traceback through torch built from source (pytorch/torch/..., not in site-packages) and
    through code torch.fx generates (<eval_with_key>.0): `ups why RUN`, the record's error site
    and `ups why --log` on the run's log all name the program's own frame, main.py's step()."""
    from helpers import run_ups

    from ups.runs.rundir import RunDir
    from ups.why.stacks import latest

    ops = tmp_path / "pytorch" / "torch" / "_ops.py"
    ops.parent.mkdir(parents=True)
    ops.write_text(LIBRARY_OPS)
    main = tmp_path / "main.py"
    main.write_text(MAIN)
    call = '    return lib.call(ns["forward"], x)'
    own = f"main.py:{MAIN.splitlines().index(call) + 1}"
    res = run_ups("launch", "python", "--json", str(main), str(ops), cwd=tmp_path)
    assert res.returncode in (0, 1) and res.stdout.strip(), res.stderr
    run = RunDir(json.loads(res.stdout)["run_dir"])
    verdict = json.loads(run_ups("why", str(run.path), "--json").stdout)["verdict"]
    assert verdict["mode"] == "exception" and verdict["where"]["site"] == own, verdict
    record = json.loads((run.path / "status" / "rank-0.json").read_text())
    assert record["error_site"] == own, record
    section = latest((run.path / "stacks" / "rank-0.txt").read_text(), "exception")
    assert section is not None and section.own_frame is not None and section.own_frame.site == own
    logs = sorted(run.path.glob("logs/*.log"))
    assert logs and any("ValueError: bad value 3" in p.read_text() for p in logs)
    log = next(p for p in logs if "ValueError: bad value 3" in p.read_text())
    read = json.loads(run_ups("why", "--log", str(log), "--json").stdout)
    assert read["exception"] == "ValueError" and read["site"] == own, read
