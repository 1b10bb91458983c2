"""The names ups compares other programs' things against, in one place (ups.status.vocabulary):
torch.distributed's collectives, checked against the installed torch."""

from __future__ import annotations

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
