"""How right `ups why --log` is on failures reproduced for real with today's torch
(tests/data/repro_corpus: scripts/make_failure_logs.py made them, scripts/split_failure_logs.py
split them by scenario before the reader was tuned on them). Prints one JSON line.

    python scripts/bench_failure_logs.py            the dev half (tuned on)
    python scripts/bench_failure_logs.py --test     also the frozen test half, as "test_seen" (its sha256 checked)

The test half was scored once, before it was read (macro-F1 0.875, 67 of 75, 0 negatives given a
class, 0 wrong classes: docs/benchmarks.md), then read and tuned on: its split is labelled
"test_seen" and is no claim.

Each split is scored as scripts/bench_why_corpus.py scores the public-thread corpus (macro-F1
over the classes, each class's precision and recall, the negatives given a class, the
program's own errors named with their type), plus ``wrong_class``: failing logs given a class
other than theirs (an "unknown" is not one), and ``by_surrounding``: how many of each
surrounding's logs (torchrun, python, batch) were read right.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
CORPUS = REPO / "tests" / "data" / "repro_corpus"
TEST_SHA256 = "43004b855c61e115307c212143cd4afada4f148183bc5b647af7afbbfdb2ae27"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_why_corpus", REPO / "scripts" / "bench_why_corpus.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def score_split(name: str) -> dict:
    from ups.why.logread import read_log

    data = (CORPUS / f"{name}.jsonl").read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if name == "test" and digest != TEST_SHA256:
        raise SystemExit(f"refusing to score: test.jsonl's sha256 is {digest}, not the frozen {TEST_SHA256}")
    bench = _bench()
    records = bench.records_of(data)
    out = bench.score(records)
    wrong, right_by, all_by = [], Counter(), Counter()
    for rec in records:
        got = read_log(rec["text"]).name
        all_by[rec["surrounding"]] += 1
        if got == rec["class"]:
            right_by[rec["surrounding"]] += 1
        elif got is not None and rec["class"] is not None:
            wrong.append(f"{rec['scenario']}.{rec['surrounding']}: {got}")
    out["wrong_class"] = len(wrong)
    out["wrong"] = wrong
    out["by_surrounding"] = {s: f"{right_by[s]}/{n}" for s, n in sorted(all_by.items())}
    out["torch"] = sorted({r.get("torch", "?") for r in records})
    out["sha256"] = digest
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--test", action="store_true", help="also score the frozen test half (tuned on since its one "
                                                        "scoring: reported as test_seen)")
    args = p.parse_args()
    out = {"dev": score_split("dev")}
    if args.test:
        out["test_seen"] = score_split("test")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
