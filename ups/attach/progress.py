"""How far an attached job is, from outside: the one reader of its log's step and epoch lines,
and the stacks' rhythm where no line counts.

A job ups did not start reports nothing to ups; what it prints says how far it is, in the forms
tutorials and frameworks print (recorded samples, labelled, in tests/data/progress_lines/):

* pytorch/examples' ``[GPU0] Epoch 92 | Batchsize: 32 | Steps: 32`` (multigpu_torchrun.py,
  multinode.py, single_gpu.py) and minGPT-ddp's ``[GPU0] Epoch 2 | Iter 100 | Train Loss ...``;
* tqdm bars (HF Trainer's ``35/500 [00:10<02:15, 3.43it/s]``, Lightning's ``Epoch 3: 45%|...|
  18/40``, the no-trainer scripts') and Lightning's rich bar (``Epoch 3/9 ━━━ 18/40``);
  validation, sanity-check, test and loading bars are not the training's progress;
* step logs: torchtitan's ``step:  10  loss: ...`` (colours and all), nanoGPT's ``iter 100:``,
  ``step N/M``, ``epoch E, step S``, a logged dict's ``'step': 10``, mmdet/mmengine/ppdet's
  ``Epoch [E][k/n]``, pytorch/examples mnist's ``Train Epoch: E [k/n (p%)]``, fairseq's
  ``| epoch 001:  450 / 1891``; accelerate's examples' ``epoch 0: {...}`` (an epoch only).

:func:`read_line` reads one line; :class:`LogProgress` follows them over time, by rank where a
line names its rank (``[GPU1]``, torchrun's ``[rank1]:``, ``[rank 1]``), else for the job, and
gives each rank's counter with its rate and the form it came from. :func:`loop_line` is the
stacks' rhythm: two stack reads of a rank that differ inside but share its own training-loop
frame say it went round its loop.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, fields
from types import SimpleNamespace
from typing import Any

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|#033\[[0-9;]*[A-Za-z]")
MAX_LINE = 600

# The forms, one pattern each (their samples: tests/data/progress_lines/); tqdm's is
# "desc: 45%|####5 | 18/40 [00:12<00:15, 1.45it/s, ...]", or without a terminal "desc: 45% 18/40 [...".
FORMS = (
    dict(  # pytorch/examples' own lines, which name the rank
        EXAMPLES=r"\[GPU(\d+)\] Epoch (\d+) \| Batchsize: \d+ \| Steps: (\d+)",
        MINGPT=r"\[GPU(\d+)\] Epoch (\d+) \| Iter (\d+) \| Train Loss",
    ), dict(  # progress bars: tqdm's (HF Trainer, Lightning), Lightning's rich bar, the rate they print
        TQDM=r"(?:^|(?<=[\s:]))(\d{1,3})%(?:\s*\|[^|]*\||\s)\s*(\d+)/(\d+) \[(?:\d+:)?\d+:\d+(?:<|\])",
        TQDM_NO_TOTAL=r"(?:^|(?<=[\s:]))(\d+)it \[(?:\d+:)?\d+:\d+,",
        RICH=r"Epoch (\d+)/(-?\d+)\s+[━╸╺─ ]+\s*(\d+)/(\d+)",  # "/-2": max_epochs -1 (no end; max_steps set)
        RATE=r"(\d+(?:\.\d+)?)\s?(it|s)/(s|it)\b",
    ), dict(  # a bar that is not the training's; the epoch in a bar's description
        NOT_TRAINING=r"(?i)valid|sanity|test|eval|predict|load|sav|download|map\b|token|shard|class\s+images|"
            r"\bval\b|infer",
        EPOCH_IN_DESC=r"(?i)\bepoch\s*(\d+)(?:\s*/\s*(\d+))?",
    ), dict(  # epoch-and-batch logs (mmdet, mmengine, ppdet; pytorch/examples mnist; fairseq; mmseg)
        BRACKETED=r"\bEpoch(?:\(train\))?:?\s*\[\s*(\d+)(?:\s*/\s*(\d+))?\s*\]\s*\[\s*(\d+)\s*/\s*(\d+)\s*\]",
        MNIST=r"\bTrain Epoch: (\d+) \[(\d+)/(\d+) \(",
        FAIRSEQ=r"\| epoch (\d+):?\s+(\d+) / (\d+) ",
        ITER_BRACKET=r"\bIter \[(\d+)/(\d+)\]",
    ), dict(  # step logs (torchtitan, nanoGPT, any "step N/M"), and epoch-only lines (accelerate's examples)
        TITAN=r"\bstep:\s*(\d+)\s+loss:",
        STEP=r"(?i)(?<![\w.])(?:global_step|step|iter|iteration)['\"]?\s*[:=]?\s*(\d+)(?:\s*/\s*(\d+))?(?![\w(.])",
        EPOCH=r"(?i)(?<![\w.])epoch['\"]?\s*[:=]?\s*(\d+)(?:\s*/\s*(\d+))?(?![\w(.])",
        EPOCH_ONLY=r"(?i)(?:^|\s-\s)epoch (\d+):(?:\s|$)|^Epoch (\d+)/(\d+)$|^epoch (\d+)\b(?! \|)|\bend of epoch (\d+)\b",
        JSON_EPOCH=r"^\{[\"']epoch[\"']:\s*(\d+)(?![.\d])",
    ), dict(  # what is no training progress, and the rank a line names
        NOT_PROGRESS=r"(?i)\bstart(?:s|ing|ed)?\s|\bsav|\bload|\bnum\b|accumulation|per epoch|\beval|valid|\btest|"
            r"^#|^\s*(?:for|if|while|def)\b|line \d+|\)$|\bwarmup\b",
        RANK=r"\[(?:GPU|rank\s?)(\d+)\]|^\[default(\d+)\]:|^rank (\d+)\b",
    ),
)
P = SimpleNamespace(**{name: re.compile(rx) for group in FORMS for name, rx in group.items()})


@dataclass(frozen=True)
class Reading:
    """What one line says of the training's progress. ``k``/``n``: a count and its total (within
    the epoch when ``epoch`` is given with them); ``per_epoch``: the steps of one epoch;
    ``epochs``: the epochs in all; ``rank``: the rank the line names; ``rate``: the rate it prints,
    per second; ``form``: which form it was read as."""

    form: str
    k: int | None = None  # a count: of the epoch's batches when ``epoch`` goes with it
    n: int | None = None
    epoch: int | None = None
    epochs: int | None = None  # the epochs in all
    per_epoch: int | None = None
    rank: int | None = None  # the rank the line names
    rate: float | None = None

    def stated(self) -> dict[str, int]:
        """The fields the line states (its rate and form aside)."""
        return {f.name: v for f in fields(self) if f.name not in ("form", "rate") and (v := getattr(self, f.name)) is not None}

    @property
    def counts(self) -> bool:
        return self.k is not None or self.epoch is not None

    def steps(self) -> tuple[int, int | None, str]:
        """(a counter that only grows over the run, its total if known, its unit)."""
        if self.per_epoch is not None and self.epoch is not None:
            return self.epoch * self.per_epoch + (self.k or 0), (self.epochs * self.per_epoch if self.epochs else None), "steps"
        if self.k is not None and self.epoch is not None and self.n:
            return self.epoch * self.n + self.k, (self.epochs * self.n if self.epochs else None), "steps"
        if self.k is not None:
            return self.k, (self.n if self.epoch is None else None), "steps"
        return self.epoch or 0, self.epochs, "epochs"


def _rate(text: str) -> float | None:
    m = P.RATE.search(text)
    if not m:
        return None
    v = float(m.group(1))
    return v if m.group(2) == "it" else (1.0 / v if v > 0 else None)


def _rank(line: str) -> int | None:
    m = P.RANK.search(line)
    return int(next(g for g in m.groups() if g is not None)) if m else None


def read_line(line: str) -> Reading | None:
    """The training progress one printed line states, or None."""
    line = ANSI.sub("", line).strip()
    if not line or len(line) > MAX_LINE:
        return None
    rank = _rank(line)
    if (m := P.TQDM.search(line) or P.TQDM_NO_TOTAL.search(line)) is not None:
        rank = _rank(line[:m.start()])  # a bar's own; what follows it on the line is another write
    if m := P.EXAMPLES.search(line):
        return Reading("pytorch/examples epoch line", epoch=int(m.group(2)), per_epoch=int(m.group(3)), rank=int(m.group(1)))
    if m := P.MINGPT.search(line):
        return Reading("pytorch/examples minGPT iteration line", k=int(m.group(3)), epoch=int(m.group(2)), rank=int(m.group(1)))
    if m := P.RICH.search(line):
        last = int(m.group(2))  # the bar prints max_epochs - 1: -2 where max_epochs is -1, no end in epochs
        return Reading("Lightning rich progress bar", k=int(m.group(3)), n=int(m.group(4)), epoch=int(m.group(1)),
                       epochs=last + 1 if last >= 0 else None, rank=rank, rate=_rate(line[m.end():]))
    if m := P.TQDM.search(line) or P.TQDM_NO_TOTAL.search(line):
        desc = line[:m.start()]
        if P.NOT_TRAINING.search(desc) or "/" in desc.split("|")[-1].strip(" :")[:12]:
            return None  # an evaluation's, a loader's or a saver's bar; a YOLO row ("0/299 15.8G ...")
        k, n = (int(m.group(2)), int(m.group(3))) if m.re is P.TQDM else (int(m.group(1)), None)
        e = P.EPOCH_IN_DESC.search(desc)
        form = "Lightning progress bar" if e else "tqdm progress bar"
        return Reading(form, k=k, n=n, epoch=int(e.group(1)) if e else None,
                       epochs=int(e.group(2)) if e and e.group(2) else None, rank=rank, rate=_rate(line[m.end():]))
    for rx, form in ((P.BRACKETED, "Epoch [e][k/n] log"), (P.MNIST, "pytorch/examples mnist line"), (P.FAIRSEQ, "fairseq log")):
        if m := rx.search(line):
            g = m.groups()
            if rx is P.BRACKETED:
                return Reading(form, k=int(g[2]), n=int(g[3]), epoch=int(g[0]), epochs=int(g[1]) if g[1] else None, rank=rank)
            return Reading(form, k=int(g[1]), n=int(g[2]), epoch=int(g[0]), rank=rank)
    if m := P.ITER_BRACKET.search(line):
        return Reading("Iter [k/n] log", k=int(m.group(1)), n=int(m.group(2)), rank=rank)
    if m := P.TITAN.search(line):
        return Reading("torchtitan step log", k=int(m.group(1)), rank=rank)
    if m := P.JSON_EPOCH.search(line):
        return Reading("epoch record", epoch=int(m.group(1)), rank=rank)
    if P.NOT_PROGRESS.search(line):
        return None
    step, epoch = P.STEP.search(line), P.EPOCH.search(line)
    if step:
        k, n = int(step.group(1)), int(step.group(2)) if step.group(2) else None
        if n is not None and (n == 0 or k > n):
            n = None
        return Reading("step log", k=k, n=n, epoch=int(epoch.group(1)) if epoch and epoch.start() < step.start() else None,
                       rank=rank, rate=_rate(line))
    if m := P.EPOCH_ONLY.search(line):
        g = [int(x) if x else None for x in m.groups()]
        return Reading("epoch log", epoch=next(x for i, x in enumerate(g) if x is not None and i != 2), epochs=g[2],
                       rank=rank)
    return None


@dataclass
class _Track:
    """One form's counter for one rank (or the job's): its latest reading and timed points."""

    reading: Reading
    steps: int
    total: int | None
    unit: str
    at: float  # when it last advanced (or was first read)
    text: str
    points: deque  # (at, steps) read after the attach: the rate


RATE_WINDOW_S = 60.0


class LogProgress:
    """Feed it the job's lines (``at`` None: printed before the attach, whose times are not known:
    a count, no rate); :meth:`counter` is a rank's progress, from its own lines or else the job's."""

    def __init__(self) -> None:
        self._tracks: dict[tuple[int | None, str], _Track] = {}

    def feed(self, line: str, at: float | None, when: float) -> None:
        """``when``: now, the time a backlog line is taken as read."""
        for seg in line.split("\r"):
            r = read_line(seg)
            if r is None or not r.counts:
                continue
            steps, total, unit = r.steps()
            key = (r.rank, r.form + ("" if r.n is None or r.epoch is not None else f":{r.n}"))
            t = self._tracks.get(key)
            if t is None:
                if len(self._tracks) >= 64:
                    continue
                t = self._tracks[key] = _Track(r, steps, total, unit, when, seg.strip()[:200], deque(maxlen=64))
            elif steps != t.steps:
                t.at = when
            t.reading, t.steps, t.total, t.unit, t.text = r, steps, total, unit, ANSI.sub("", seg).strip()[:200]
            if at is not None:
                if t.points and steps < t.points[-1][1]:
                    t.points.clear()  # a new pass (a bar of the next run of the loop): the rate starts again
                t.points.append((at, steps))
                while len(t.points) > 2 and at - t.points[0][0] > RATE_WINDOW_S:
                    t.points.popleft()

    def counter(self, rank: int | None) -> dict | None:
        """Rank ``rank``'s counter ({k, n, unit, at, rate, text, epoch, source}); from the lines
        that name that rank, else from those that name none. Among several forms, the live one
        with the largest total (a training bar, not the evaluation bar printed inside it)."""
        mine = [t for (r, _), t in self._tracks.items() if r == rank and rank is not None]
        mine = mine or [t for (r, _), t in self._tracks.items() if r is None]
        if not mine:
            return None
        newest = max(t.at for t in mine)
        best = max(mine, key=lambda t: (t.at >= newest - RATE_WINDOW_S, t.total or 0, t.at))
        rate = None
        if len(best.points) >= 2 and best.points[-1][0] > best.points[0][0] and best.points[-1][1] > best.points[0][1]:
            (t0, s0), (t1, s1) = best.points[0], best.points[-1]
            rate = (s1 - s0) / (t1 - t0)
        elif best.reading.rate is not None and best.unit == "steps" and best.reading.per_epoch is None:
            rate = best.reading.rate
        return {"k": best.steps, "n": best.total, "unit": best.unit, "at": best.at, "rate": rate, "text": best.text,
                "epoch": best.reading.epoch, "source": f"log: {best.reading.form}"}


def own(frame: tuple) -> bool:
    """A frame of the program's own code (not the standard library's or a package's)."""
    path = str(frame[0]).replace("\\", "/")
    return not ("site-packages" in path or "dist-packages" in path or "/lib/python3" in path or path.startswith("<"))


def loop_line(before: tuple, now: tuple) -> tuple | None:
    """The stacks' rhythm: the program's own frame (file, line, function) that two stack reads
    of a rank share while what runs inside it differs: it went round that loop (a training loop
    returns to its ``for`` line at every step). None when the reads are the same (it stayed in
    one call) or share none of the program's own frames. Frames outermost first or innermost
    first alike; a function is compared by its last dotted part (py-spy 0.4.3 prints
    ``Class.method``, older ones ``method``)."""
    if not before or not now or before == now:
        return None

    def key(f: tuple) -> tuple:
        return f[0], f[1], str(f[2]).rsplit(".", 1)[-1]
    mine = {key(f) for f in before if own(f)}
    shared = [f for f in now if own(f) and key(f) in mine]
    if not shared:
        return None
    return shared[0]  # the innermost of them (faulthandler's order: most recent call first)


POSITIONS_KEPT = 16
FIT_LOOP = "stacks: Lightning's optimizer_step(epoch, batch_idx) between stack reads"


def note_position(s: Any, d: Any) -> None:
    """A rank's stack read that caught its fit loop in a step (``d.position``: Lightning's
    epoch and batch): kept, timed, for :func:`position_counter`."""
    points = s.extra.setdefault("positions", deque(maxlen=POSITIONS_KEPT))
    points.append((d.at, d.position["epoch"], d.position["batch_idx"]))
    if d.position.get("max_epochs"):
        s.extra["max_epochs"] = d.position["max_epochs"]


def position_counter(points: Iterable[tuple[float, int, int]] | None, max_epochs: int | None = None) -> dict | None:
    """A counter from the stack reads that caught a rank's fit loop: (at, epoch, batch) each. Where
    the epoch moved between the reads of the last minute, epochs and epochs a second; where it
    did not, the batch of this epoch and batches a second (a long epoch); one read, its epoch and
    no rate. Reads seconds apart cannot count the steps of a fast loop's epochs, so none is
    claimed."""
    points = list(points or ())
    if not points:
        return None
    at, epoch, batch = points[-1]
    recent = [p for p in points if p[0] >= at - RATE_WINDOW_S and p[1] <= epoch]
    t0, e0, b0 = recent[0]
    base = {"at": at, "text": None, "epoch": epoch, "source": FIT_LOOP}
    if epoch == e0 and batch > b0 and at > t0:
        return {**base, "k": batch, "n": None, "unit": "steps", "rate": (batch - b0) / (at - t0)}
    rate = (epoch - e0) / (at - t0) if epoch > e0 and at > t0 else None
    return {**base, "k": epoch, "n": max_epochs if max_epochs and max_epochs > 0 else None, "unit": "epochs",
            "rate": rate}


def rank_counter(logged: dict | None, turns: int, turned_at: float | None, fit_loop: dict | None = None) -> dict | None:
    """A rank's counter: its log's, else its fit loop's position read from its stacks
    (:func:`position_counter`), else the stacks' rhythm (how many stack reads found it back at
    its own loop line, after going inside it: a lower bound of its steps, with no rate)."""
    if logged is not None:
        return logged
    if fit_loop is not None:
        return fit_loop
    if turns and turned_at is not None:
        return {"k": turns, "n": None, "unit": "loop turns seen", "at": turned_at, "rate": None, "text": None,
                "epoch": None, "source": "stacks: back at its own loop line between stack reads"}
    return None


def progress_fields(c: dict | None) -> dict:
    """A status record's progress fields from a counter (none: no step, as before)."""
    if c is None:
        return {"step": 0, "unit": "steps"}
    return {"step": c["k"], "total": c["n"], "unit": c["unit"], "rate": c["rate"]}


def progress_metrics(c: dict | None) -> dict:
    """Where the counter came from (``progress_from``: ``log: <form>`` or ``stacks: ...``), and the epoch."""
    if c is None:
        return {}
    return {"progress_from": c["source"], **({"epoch": c["epoch"]} if c.get("epoch") is not None else {})}


def take_progress(seen: Iterable, progress: LogProgress, now: float, mono: float) -> None:
    """Each live rank's counter (the observer's ``Seen``s): its log lines' (its own, else the
    job's), else its stacks' rhythm, kept in ``extra["counter"]``; a counter that advanced is
    progress, dated when its line was read."""
    for s in seen:
        if s.gone_at is not None or s.proc.role != "rank":
            continue
        c = rank_counter(progress.counter(s.proc.rank), s.extra.get("turns", 0), s.extra.get("turned_at"),
                         position_counter(s.extra.get("positions"), s.extra.get("max_epochs")))
        before = s.extra.get("counter")
        s.extra["counter"] = c
        if c is None:
            continue
        moved = before is None or (c["k"], c.get("epoch"), c["unit"]) != (before["k"], before.get("epoch"), before["unit"])
        at = c["at"] if moved else 0.0
        if c["source"] == FIT_LOOP:
            # Reads that miss its fit loop (between two epochs, waiting for data) may still see it
            # go round: a turn is progress too, or a rank caught stepping once would look stuck.
            at = max(at, s.extra.get("turned_at") or 0.0)
        if at > s.progress_at:
            s.progress_at, s.progress_mono = at, mono - max(0.0, now - at)


def note_turn(s: Any, before: tuple, frames: tuple, at: float, went_round: bool = False) -> None:
    """A rank's new stack read (the observer's ``Seen``): back at its own loop line is one turn, and
    so is the same stack with other loop counters (``went_round``: Lightning's ``batch_idx``)."""
    if s.proc.role == "rank" and (went_round or loop_line(before, frames) is not None):
        s.extra["turns"] = s.extra.get("turns", 0) + 1
        s.extra["turned_at"] = at
