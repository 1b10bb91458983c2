"""The metrics of runs, as prometheus_client metric families (names: docs/monitoring.md).

Names follow Prometheus's conventions: ``ups_`` first, the unit last in base units
(``_seconds``, ``_bytes``), ``_total`` on counters, ``_info`` on the one info metric, and a
state set (one series per state, 1 for the current one) where a value is a word. Labels
take bounded values only: ``run``, ``kind``, ``node``, ``role``, ``rank``, ``worker``, a
collective's ``op`` (one of a known set, else ``other``), a step's ``part`` (one of
:data:`STEP_PARTS`), a state. Free text from a run (a
headline, an item, an error, a path) never becomes a label value of these series; the one
exception is the verdict's headline in ``ups_run_verdict_info``, one series per run at a
time. prometheus_client escapes every label value and help text the Prometheus way.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterable
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
    StateSetMetricFamily,
)
from prometheus_client.samples import Sample

from ups.runs.manifest_spec import RUN_STATES
from ups.runs.view import ProcessView, RunView
from ups.status.health import Health
from ups.status.printable import printable
from ups.status.vocabulary import COLLECTIVE_OPS, COLLECTIVE_WAITS
from ups.why.verdict import MODES, Verdict

HEALTH_STATES = tuple(h.value for h in Health)
RUN_STATE_WORDS = (*RUN_STATES, "unsupervised")
"""``ups_run_state``'s states: run.json's, and ``unsupervised`` (the job runs on without its
launcher: ``ups adopt`` takes it over)."""

RUN_LABELS = ("run", "kind")
RANK_LABELS = ("run", "kind", "node", "rank")
PROCESS_LABELS = ("run", "kind", "node", "role", "rank", "worker")
WORKER_LABELS = ("run", "kind", "node", "rank", "worker")
ROLES_EXPORTED = ("launcher", "agent", "rank", "worker", "helper")
STEP_PARTS = ("step", "data", "collective", "backward", "other")
"""``ups_step_part_seconds``'s ``part`` values: the parts of a record's ``metrics.step_parts``
(ups.status.steptime), as ``ups.status.straggler.RankTime`` names them."""
HEADLINE_MAX = 200
LABEL_MAX = 120
EXPORTED_OPS = COLLECTIVE_OPS | COLLECTIVE_WAITS
"""``op`` label values: torch.distributed's collectives (ups.status.vocabulary), the waits on
them an attached job's stacks show; any other op is ``other``."""

# name -> (help, kind, labels); kind: gauge | counter | stateset | info
SPEC: dict[str, tuple[str, str, tuple[str, ...]]] = {
    # per rank
    "ups_rank_step": ("The rank's progress counter: optimizer steps for training, items for a data job.", "gauge", RANK_LABELS),
    "ups_rank_total_steps": ("The steps (or items) the rank will make, where known.", "gauge", RANK_LABELS),
    "ups_rank_steps_per_second": ("The rank's step rate over its recent window.", "gauge", RANK_LABELS),
    "ups_rank_samples_per_second": ("Samples per second the rank's DataLoaders delivered.", "gauge", RANK_LABELS),
    "ups_rank_tokens_per_second": ("Tokens per second (integer input_ids batches).", "gauge", RANK_LABELS),
    "ups_rank_loss": ("The last loss backward() was called on (NaN or +-Inf when it was).", "gauge", RANK_LABELS),
    "ups_rank_loss_nonfinite": ("1 once any loss of the rank was NaN or Inf, else 0.", "gauge", RANK_LABELS),
    "ups_rank_learning_rate": ("param_groups[0]['lr'] of the optimizer that stepped.", "gauge", RANK_LABELS),
    "ups_rank_grad_norm": ("What clip_grad_norm_ returned last.", "gauge", RANK_LABELS),
    "ups_rank_gpu_memory_allocated_bytes": ("CUDA memory the rank's tensors hold (torch).", "gauge", RANK_LABELS),
    "ups_rank_gpu_memory_reserved_bytes": ("CUDA memory torch's caching allocator reserved.", "gauge", RANK_LABELS),
    "ups_rank_gpu_memory_peak_bytes": ("The peak of allocated CUDA memory.", "gauge", RANK_LABELS),
    "ups_rank_collectives_total": ("Collectives the rank entered.", "counter", RANK_LABELS),
    "ups_step_part_seconds": ("The median over the rank's recent steps (~10 s) of its step and of where the step went "
                              "(data: waiting for its DataLoader; collective: in collectives; backward: backward() "
                              "less the collectives in it; other: the rest), in seconds.", "gauge", (*RANK_LABELS, "part")),
    "ups_straggler_score": ("The best rank's own step time (its step less its waits for peers) over this rank's: 1 for "
                            "the best; a rank below the run's threshold (0.85 by default) the others wait for.",
                            "gauge", RANK_LABELS),
    # per process (launcher, agent, rank, worker, helper)
    "ups_process_health": ("The process's health, as `ups status` says it (1 for the current state).", "stateset", PROCESS_LABELS),
    "ups_process_seconds_since_progress": ("Seconds since the process's work last advanced or its phase changed (not for workers).", "gauge", PROCESS_LABELS),
    "ups_process_seconds_since_heartbeat": ("Seconds since the process last wrote its record (not for workers).", "gauge", PROCESS_LABELS),
    "ups_process_collective_seconds": ("Seconds the process has been inside its current collective (absent outside one).", "gauge", (*PROCESS_LABELS, "op")),
    # per DataLoader worker
    "ups_worker_items_total": ("Items the DataLoader worker fetched.", "counter", WORKER_LABELS),
    # per run
    "ups_run_state": ("The run's state (1 for the current one).", "stateset", RUN_LABELS),
    "ups_run_attempt": ("The run's attempt: 1, then 2 after its first restart on a hang ...", "gauge", RUN_LABELS),
    "ups_run_restarts_total": ("Restarts of the run after a proven hang (--on-hang restart).", "counter", RUN_LABELS),
    "ups_run_processes": ("Processes of the run with a readable record.", "gauge", RUN_LABELS),
    "ups_run_unreadable_records": ("Status files of the run that could not be read (ups status names them).", "gauge", RUN_LABELS),
    "ups_run_verdict_mode": ("`ups why`'s verdict on the run: its mode (1 for the current one).", "stateset", RUN_LABELS),
    "ups_run_verdict": ("`ups why`'s verdict on the run: its mode, who (rank, worker) and headline; value 1.", "info", (*RUN_LABELS, "mode", "rank", "worker", "headline")),
}


class StateSets(StateSetMetricFamily):
    """A state set family kept as its groups, one per labelled thing: (labels, states, the
    current state). Its ``samples`` (one per state, 1 for the current one, states sorted, as
    StateSetMetricFamily writes them) are made when asked for; the endpoint's text
    (ups.exporter.text) writes the groups as they are, without a Sample per state: the state
    sets are most of a big job's series (10 health states for each of 2,304 processes)."""

    def __init__(self, name: str, documentation: str, labels: tuple[str, ...]) -> None:
        self.groups: list[tuple[dict[str, str], tuple[str, ...], str | None]] = []
        super().__init__(name, documentation, labels=labels)

    def add_group(self, labels: dict[str, str], states: tuple[str, ...], current: str | None) -> None:
        """``labels`` (the family's label names to values) in ``current`` of ``states`` (sorted)."""
        self.groups.append((labels, states, current))

    @property  # type: ignore[override]
    def samples(self) -> list[Sample]:
        name = self.name
        return [*self.extra, *(Sample(name, {**base, name: state}, 1 if state == current else 0)
                               for base, states, current in self.groups for state in states)]

    @samples.setter
    def samples(self, value: list[Sample]) -> None:  # Metric.__init__ sets []; add_metric's appends land here
        self.extra = value


def _family(name: str) -> Metric:
    doc, kind, labels = SPEC[name]
    if kind == "counter":
        return CounterMetricFamily(name, doc, labels=labels)
    if kind == "stateset":
        return StateSets(name, doc, labels=labels)
    if kind == "info":
        return InfoMetricFamily(name, doc, labels=labels[: -len(_INFO_KEYS)])
    return GaugeMetricFamily(name, doc, labels=labels)


_INFO_KEYS = ("mode", "rank", "worker", "headline")
# the samples' names: a counter's is its name with one "_total" (CounterMetricFamily's rule)
_SAMPLE_NAMES = {name: name.removesuffix("_total") + "_total" if kind == "counter" else name
                 for name, (_, kind, _) in SPEC.items() if kind in ("gauge", "counter")}


def number(value: Any) -> float | None:
    """A record's figure as a float: a JSON number, or the word a non-finite one is written
    as ("nan", "inf", "-inf"); None for anything else (a hostile value is left out)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if value == "nan":
        return math.nan
    if value in ("inf", "-inf"):
        return math.inf if value == "inf" else -math.inf
    return None


_QUANTITY = re.compile(r"(?<![\w.])(?:\d+/)?\d+(?:\.\d+)?(?:e-?\d+)?(?=\s?(?:s|ms|min|h|steps/s|items/s|samples/s|"
                       r"steps|items|samples|processes|process record\(s\)|%)(?!\w))")


def stable_headline(headline: str) -> str:
    """The headline as the info metric's label: its running quantities (ages, rates, counts:
    "no progress for 42 s", "3 steps, 0.46 steps/s") shown as "…", so that the series changes
    when the verdict does, not at every scrape. Ranks, steps named ("at step 40"), pids stay."""
    return _QUANTITY.sub("…", printable(headline))[:HEADLINE_MAX]


def label(value: Any) -> str:
    """A bounded, one-line label value (a host, a run id, a kind): what a reader shows, cut."""
    if value is None:
        return ""
    return printable(str(value))[:LABEL_MAX]


def collective_op(op: Any) -> str:
    """A collective's op as a label value: one of the known ops, else ``other``."""
    return op if isinstance(op, str) and op in EXPORTED_OPS else "other"


class Families:
    """The families of one scrape: runs are added one by one, each metric name is one family."""

    def __init__(self) -> None:
        self.by_name: dict[str, Metric] = {}
        self.seen: set[tuple[str, ...]] = set()
        self.hosts: dict[Any, str] = {}  # label(host), once per host and scrape

    def add(self, name: str, labels: Iterable[str], value: Any) -> None:
        if value is None:
            return
        fam = self.by_name.get(name)
        if fam is None:
            fam = self.by_name[name] = _family(name)
        sample = _SAMPLE_NAMES.get(name)
        if sample is None:  # an info metric: its own add_metric
            fam.add_metric(list(labels), value)
        else:  # what GaugeMetricFamily / CounterMetricFamily.add_metric append (no timestamp, no _created)
            fam.samples.append(Sample(sample, dict(zip(SPEC[name][2], labels, strict=True)), value))

    def add_state(self, name: str, labels: tuple[str, ...], states: tuple[str, ...], current: str | None) -> None:
        """A state set's series: 1 for ``current``, 0 for the other ``states`` (sorted, as
        StateSetMetricFamily writes them), kept as one group (:class:`StateSets`)."""
        fam = self.by_name.get(name)
        if fam is None:
            fam = self.by_name[name] = _family(name)
        fam.add_group(dict(zip(SPEC[name][2], labels, strict=True)), _sorted(states), current)

    def families(self) -> list[Metric]:
        return list(self.by_name.values())

    def add_run(self, view: RunView, verdict: Verdict | None, processes: Iterable[ProcessView] | None = None) -> None:
        """One run: its own metrics, and those of ``processes`` (default: all it has)."""
        run, kind = label(view.run_id), label(view.kind)
        head = (run, kind)
        state = view.state
        if state in RUN_STATE_WORDS:
            self.add_state("ups_run_state", head, RUN_STATE_WORDS, state)
        manifest = view.manifest or {}
        attempt = manifest.get("attempt")
        self.add("ups_run_attempt", head, attempt if isinstance(attempt, int) and not isinstance(attempt, bool) else 1)
        restarts = manifest.get("restarts")
        self.add("ups_run_restarts_total", head, restarts if isinstance(restarts, int) and not isinstance(restarts, bool) else 0)
        self.add("ups_run_processes", head, len(view.processes))
        self.add("ups_run_unreadable_records", head, len(view.problems))
        if verdict is not None:
            mode = verdict.mode if verdict.mode in MODES else "other"
            self.add_state("ups_run_verdict_mode", head, (*MODES, "other"), mode)
            who = verdict.who or {}
            self.add("ups_run_verdict", head, {
                "mode": mode, "rank": _int_label(who.get("rank")), "worker": _int_label(who.get("worker")),
                "headline": stable_headline(str(verdict.headline or ""))})
        times = view.step_times[0]  # each rank's step window judged against its peers': its straggler score
        for p in view.processes if processes is None else processes:
            self.add_process(head, p, view.read_at, times.get(p.record.name))

    def add_process(self, head: tuple[str, str], p: ProcessView, now: float, step_time: Any = None) -> None:
        """One process; ``step_time``: a rank's ``ups.status.straggler.RankTime``, when it has a step window."""
        r = p.record
        if r.role not in ROLES_EXPORTED:
            return
        node = self.hosts.get(r.host)
        if node is None:
            node = self.hosts[r.host] = label(r.host)
        rank = _int_label(r.rank)
        worker = _int_label(r.worker) if r.loader in (None, 0) else f"{r.loader}.{_int_label(r.worker)}"
        key = (*head, node, r.role, rank, worker)
        if key in self.seen:  # a second helper of one rank, a pid's old record: one series per key
            return
        self.seen.add(key)
        health = p.verdict.health.value
        self.add_state("ups_process_health", key, HEALTH_STATES, health)
        if r.role != "worker":  # a worker's ages are in its health (and 2,048 series of a 256-rank job)
            self.add("ups_process_seconds_since_progress", key, round(p.progress_age, 3))
            self.add("ups_process_seconds_since_heartbeat", key, round(p.heartbeat_age, 3))
        coll = r.collective
        if isinstance(coll, dict) and not r.is_final:
            since = number(coll.get("since"))
            if since is not None and math.isfinite(since):
                self.add("ups_process_collective_seconds", (*key, collective_op(coll.get("op"))), round(max(0.0, now - since), 3))
        if r.role == "worker":
            self.add("ups_worker_items_total", (*head, node, rank, worker), r.step)
        if r.role == "rank":
            self.add_rank((*head, node, rank), p, step_time)

    def add_rank(self, key: tuple[str, ...], p: ProcessView, step_time: Any = None) -> None:
        r = p.record
        m = r.metrics if isinstance(r.metrics, dict) else {}
        self.add("ups_rank_step", key, r.step)
        self.add("ups_rank_total_steps", key, r.total)
        self.add("ups_rank_steps_per_second", key, number(r.rate))
        self.add("ups_rank_samples_per_second", key, number(m.get("samples_per_s")))
        self.add("ups_rank_tokens_per_second", key, number(m.get("tokens_per_s")))
        self.add("ups_rank_loss", key, number(m.get("loss")))
        loss = number(m.get("loss"))
        self.add("ups_rank_loss_nonfinite", key,
                 1 if m.get("loss_nonfinite") or (loss is not None and not math.isfinite(loss)) else 0)
        self.add("ups_rank_learning_rate", key, number(m.get("lr")))
        self.add("ups_rank_grad_norm", key, number(m.get("grad_norm")))
        if r.gpu is not None:
            self.add("ups_rank_gpu_memory_allocated_bytes", key, number(r.gpu.allocated))
            self.add("ups_rank_gpu_memory_reserved_bytes", key, number(r.gpu.reserved))
            self.add("ups_rank_gpu_memory_peak_bytes", key, number(r.gpu.peak))
        self.add("ups_rank_collectives_total", key, r.coll_seq)
        if step_time is not None:  # a running rank's step window (its record's metrics.step_parts): medians
            for part in STEP_PARTS:
                self.add("ups_step_part_seconds", (*key, part), number(getattr(step_time, part)))
            self.add("ups_straggler_score", key, round(step_time.score, 4))


@functools.cache
def _sorted(states: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(sorted(states))


def _int_label(value: Any) -> str:
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else ""
