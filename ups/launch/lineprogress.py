"""Progress from what a program prints: "converted 5/40 files", "[12/50]", "batch 3 of 9".

A data-preparation script that prints its own counter has a progress signal, with no code
change: the output relay (ups.launch.logrelay) feeds every line of the job's output here, and
the launcher puts the accepted counter in its record (``metrics.output_progress``), which
readers take as the job's progress when its processes report none of their own.

A fraction is not progress by itself ("on 12/31", "1/2 cup", "HTTP/1.1", a path, a one-off
"found 3/10 corrupt files"). A counter is accepted by how it behaves: the same line with every
number blanked (its template) keeps the same total while the count advances, twice, or once
when a progress word or a bracket goes with it; it may go back once (a second pass). A tqdm
bar printed into a log is keyed by its description. Measured on the project's battery of
dates, recipes, paths, URLs, versions and times: nothing accepted.
"""

from __future__ import annotations

import re
import time

PAIR = re.compile(r"(?<![\w.:/\-])(\d{1,12})\s?/\s?(\d{1,12})(?![\w./]|:\d)")
OF = re.compile(r"(?<![\w.])(\d{1,12}) of (\d{1,12})(?![\w.])")
NUMBER = re.compile(r"\d+(?:\.\d+)?(?:e[-+]?\d+)?")
WORDS = re.compile(
    r"(?i)\b(step|steps|iter|iteration|it|batch|batches|epoch|file|files|item|items|sample|samples|shard|shards|"
    r"chunk|chunks|record|records|doc|docs|documents?|task|tasks|job|jobs|converted|processed|done|completed|"
    r"wrote|written|downloaded|uploaded|loaded|saved|encoded|rows?|images?|frames?|parts?|blocks?|progress)\b")
TQDM_METER = re.compile(r"(\d+)/(\d+) \[(\d+:)?\d+:\d+<")  # "45%|####5 | 18/40 [00:12<00:15, 1.45file/s]"
DATE_BEFORE = re.compile(r"(?i)(\b(on|date|due|since|until|jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)\w*\s*$)")
UNIT_AFTER = re.compile(r"(?i)\s*(cups?|tsp|tbsp|inch|in\b|oz|lb|miles?|teaspoons?|tablespoons?)")
MAX_SERIES = 64
MAX_LINE = 400


class _Series:
    __slots__ = ("backwards", "first", "k", "last", "n", "template", "updates", "words")

    def __init__(self, template: str, k: int, n: int, at: float, words: bool) -> None:
        self.template, self.k, self.n, self.last, self.words = template, k, n, at, words
        self.first = (k, at)  # where this pass began: the rate
        self.updates = self.backwards = 0

    def accepted(self) -> bool:
        if self.backwards > 1 or self.n < 2:
            return False
        return self.updates >= 2 or (self.updates >= 1 and self.words)


class LineProgress:
    """Feed it the program's lines; :meth:`current` is the counter it prints, if any."""

    def __init__(self) -> None:
        self._series: dict[tuple[str, int], _Series] = {}

    @staticmethod
    def pairs(line: str) -> list[tuple[int, int, int, int]]:
        """(k, n, start, end) of each fraction in a line that could be a counter."""
        out = []
        for rx in (PAIR, OF):
            for m in rx.finditer(line):
                k, n = int(m.group(1)), int(m.group(2))
                if n == 0 or k > n:
                    continue
                if n <= 31 and k <= 12 and DATE_BEFORE.search(line[max(0, m.start() - 12):m.start()]):
                    continue  # "on 12/31", "due 1/15"
                if UNIT_AFTER.match(line[m.end():m.end() + 12]):
                    continue  # "1/2 cup": a fraction with a unit
                out.append((k, n, m.start(), m.end()))
        return out

    def feed(self, line: str, at: float | None = None) -> None:
        at = time.time() if at is None else at
        for seg in line.split("\r"):
            seg = seg.strip()
            if not seg or len(seg) > MAX_LINE:
                continue
            meter = TQDM_METER.search(seg)
            found = [(int(meter.group(1)), int(meter.group(2)), meter.start(), meter.end())] if meter else self.pairs(seg)
            for i, (k, n, s, e) in enumerate(found):
                if meter:
                    template = re.split(r"\s*\d+%\|", seg, maxsplit=1)[0] + " {k/n} (tqdm)"
                else:
                    template = NUMBER.sub("#", seg[:s]) + "{k/n}" + NUMBER.sub("#", seg[e:])
                words = bool(meter or WORDS.search(seg) or (s > 0 and seg[s - 1] in "[(" and e < len(seg) and seg[e] in "])"))
                series = self._series.get((template, i))
                if series is None:
                    if len(self._series) < MAX_SERIES:
                        self._series[(template, i)] = _Series(template, k, n, at, words)
                    continue
                if n != series.n:  # a new total: a new pass (the next epoch's own count)
                    series.n, series.k, series.updates, series.first = n, k, 0, (k, at)
                elif k > series.k:
                    series.updates += 1
                elif k < series.k:
                    series.backwards += 1
                series.k, series.last, series.words = k, at, series.words or words

    def current(self) -> dict | None:
        """The counter last advanced among the accepted ones: {k, n, at, text}."""
        best = max((s for s in self._series.values() if s.accepted()), key=lambda s: s.last, default=None)
        if best is None:
            return None
        k0, t0 = best.first
        rate = (best.k - k0) / (best.last - t0) if best.last > t0 and best.k > k0 else None
        unit = re.match(r"\s*([A-Za-z]+)", best.template.split("{k/n}", 1)[1])
        return {"k": best.k, "n": best.n, "at": best.last, "rate": rate, "unit": unit.group(1) if unit else "items",
                "text": best.template.replace("{k/n}", f"{best.k}/{best.n}")}
