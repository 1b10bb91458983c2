"""The Prometheus text format (0.0.4) of metric families, written for the endpoint.

prometheus_client's ``generate_latest`` sorts and escapes every label of every sample again:
about 7 µs a sample, 200 ms for the 28,800 series of a 256-rank job with 8 DataLoader workers
a rank, twice what its whole read costs. The series of one process share their label values, so
here each ``name="value"`` pair is escaped once per scrape and each sample is one join; a state
set kept as groups (ups.exporter.families.StateSets: most of a big job's series) is written a
group at a time, its labels joined once for all its states. The text is the same series as
``generate_latest``'s (tests/test_monitoring.py parses both and compares them); the labels
come in the families' order instead of sorted by name, which the format allows.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

from prometheus_client.core import Metric
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_TYPES = {"counter": "counter", "gauge": "gauge", "info": "gauge", "stateset": "gauge"}


def _escape_value(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _escape_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


class _Pairs(dict[tuple[str, str], str]):
    """``name="value"`` of each label, escaped the first time it is asked for (per scrape)."""

    def __missing__(self, item: tuple[str, str]) -> str:
        pair = self[item] = f'{item[0]}="{_escape_value(item[1])}"'
        return pair


# The values of state sets (most of a big job's series): an int 0 or 1, written as Go writes them.
_STATE_VALUES = {0: "0.0", 1: "1.0"}


@functools.lru_cache(maxsize=1024)
def _state_lines(name: str, states: tuple[str, ...], current: str | None) -> tuple[str, ...]:
    """The ends of a state set's lines, each after its ``name{labels,name="`` (joined by
    that prefix: the first is empty): one per state, 1.0 for ``current``."""
    return ("", *(f'{_escape_value(state)}"}} {"1.0" if state == current else "0.0"}\n' for state in states))


def exposition(metrics: Iterable[Metric]) -> bytes:
    """``metrics`` (gauges, counters, info metrics and state sets, as ups.exporter.families
    makes them) in the text format."""
    pair = _Pairs().__getitem__
    join, state_value = ",".join, _STATE_VALUES.get
    out: list[str] = []
    append = out.append
    for metric in metrics:
        kind = _TYPES.get(metric.type, "untyped")
        name = metric.name + {"counter": "_total", "info": "_info"}.get(metric.type, "")
        append(f"# HELP {name} {_escape_help(metric.documentation)}\n# TYPE {name} {kind}\n")
        groups = getattr(metric, "groups", None)
        if groups is not None:  # a state set kept as groups (ups.exporter.families.StateSets)
            for labels, states, current in groups:
                prefix = f"{name}{{{join(map(pair, labels.items()))},{name}=\""
                append(prefix.join(_state_lines(name, states, current)))
            extra: list[Sample] = metric.extra
            samples: Iterable[Sample] = extra
        else:
            samples = metric.samples
        for sample in samples:
            value = sample.value
            text = (value.__class__ is int and state_value(value)) or floatToGoString(value)
            if sample.labels:
                append(f"{sample.name}{{{join(map(pair, sample.labels.items()))}}} {text}\n")
            else:
                append(f"{sample.name} {text}\n")
    return "".join(out).encode()
