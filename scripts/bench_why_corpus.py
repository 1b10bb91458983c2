"""How right `ups why`'s log reader (ups.why.logread) is on failure excerpts from public issue
threads it was not tuned on. Prints one JSON line: for each split (dev, test), the excerpts,
how many were named right, the macro-F1 over the classes, each class's precision and recall,
and the negatives (healthy logs, warnings, the program's own errors) given a class.

    python scripts/bench_why_corpus.py                 both splits; the test score is the claim
    python scripts/bench_why_corpus.py --split dev     dev only (for tuning: never opens test)
    python scripts/bench_why_corpus.py --table         the per-class Markdown table (docs/benchmarks.md)

The corpus (tests/data/why_corpus/, built and split by thread before any pattern was written:
scripts/split_why_corpus.py) has a frozen test half: this script refuses to score a test
half whose sha256 is not the one below (a test half is never tuned on, edited or re-split).
Macro-F1 is the mean of the per-class F1 over every class the split has or the reader
predicted (a class predicted that the split does not have counts, at 0). A negative is right
when the reader names no class; its "your code raised X" or "no known class" is not a class.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
CORPUS = REPO / "tests" / "data" / "why_corpus"
TEST_SHA256 = "64821339a4c4e6f49a09183d18304a801945e5440a599daa7bbb98c0b3c2a5bc"


class FrozenSplitChanged(SystemExit):
    pass


def score(split: str) -> dict:
    """Read one split and score the reader on it. The only code that opens test.jsonl, and
    only after its bytes hash to the frozen sha256."""
    from ups.why.logread import read_log

    data = (CORPUS / f"{split}.jsonl").read_bytes()
    if split == "test":
        digest = hashlib.sha256(data).hexdigest()
        if digest != TEST_SHA256:
            raise FrozenSplitChanged(f"refusing to score: test.jsonl's sha256 is {digest}, not the frozen {TEST_SHA256}")
    records = [json.loads(line) for line in data.decode("utf-8").splitlines() if line.strip()]
    tp, fp, fn = Counter(), Counter(), Counter()
    negatives = given = own = own_right = unknown = 0
    for rec in records:
        reading = read_log(rec["text"])
        got, want = reading.name, rec["class"]
        if want is None:
            negatives += 1
            given += got is not None
            if rec.get("negative") == "user_error":
                own += 1
                own_right += reading.kind == "user_code" and reading.exception == rec.get("expect")
        elif reading.kind == "unknown":
            unknown += 1
        if got == want:
            if want is not None:
                tp[want] += 1
        else:
            if want is not None:
                fn[want] += 1
            if got is not None:
                fp[got] += 1
    classes = sorted(set(tp) | set(fn) | set(fp))
    per, f1s = {}, []
    for c in classes:
        p = tp[c] / (tp[c] + fp[c]) if tp[c] + fp[c] else 0.0
        r = tp[c] / (tp[c] + fn[c]) if tp[c] + fn[c] else 0.0
        f1s.append(2 * p * r / (p + r) if p + r else 0.0)
        per[c] = {"n": tp[c] + fn[c], "precision": round(p, 3), "recall": round(r, 3)}
    right = sum(tp.values()) + (negatives - given)
    return {"excerpts": len(records), "right": right, "classes": len(classes),
            "macro_f1": round(sum(f1s) / len(f1s), 3) if f1s else None,
            "negatives": negatives, "negatives_given_a_class": given,
            "negatives_given_a_class_pct": round(100 * given / negatives, 1) if negatives else None,
            "failures_said_unknown": unknown,
            "own_errors_named": f"{own_right}/{own}",
            "per_class": per}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--split", choices=("dev", "test", "both"), default="both",
                   help="which half to score (dev while tuning: it never opens test.jsonl)")
    p.add_argument("--table", action="store_true", help="print the per-class Markdown table instead of the JSON line")
    args = p.parse_args()
    splits = ("dev", "test") if args.split == "both" else (args.split,)
    try:
        out = {s: score(s) for s in splits}
    except FrozenSplitChanged as exc:
        print(exc, file=sys.stderr)
        return 2
    if "test" in out:
        out["test_sha256"] = TEST_SHA256
    if args.table:
        names = sorted({c for s in splits for c in out[s]["per_class"]})
        print("| class | " + " | ".join(f"{s} n | {s} precision | {s} recall" for s in splits) + " |")
        print("|---|" + "---|---|---|" * len(splits))
        for c in names:
            cells = []
            for s in splits:
                v = out[s]["per_class"].get(c, {"n": 0, "precision": "", "recall": ""})
                cells += [str(v["n"]), str(v["precision"]), str(v["recall"])]
            print(f"| {c} | " + " | ".join(cells) + " |")
        return 0
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
