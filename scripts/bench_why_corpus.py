"""Per-class precision and recall of `ups why`'s log classifier (ups.why.classify) on real
failure excerpts from public issue threads (tests/data/failure_corpus.json). Prints one JSON line.

    python scripts/bench_why_corpus.py [--table]   (--table: the Markdown table in docs/benchmarks.md)
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
CORPUS = REPO / "tests" / "data" / "failure_corpus.json"


def evaluate() -> dict:
    from ups.why.classify import classify

    excerpts = json.loads(CORPUS.read_text())["excerpts"]
    tp, fp, fn = Counter(), Counter(), Counter()
    wrong = []
    for e in excerpts:
        m = classify(e["text"])
        got = m.cls.name if m else None
        if got == e["class"]:
            tp[got] += 1
        else:
            fn[e["class"]] += 1
            if got is not None:
                fp[got] += 1
            wrong.append({"source": e["source"], "class": e["class"], "got": got})
    classes = sorted({e["class"] for e in excerpts} | set(fp))
    per = {}
    for c in classes:
        p = tp[c] / (tp[c] + fp[c]) if tp[c] + fp[c] else None
        r = tp[c] / (tp[c] + fn[c]) if tp[c] + fn[c] else None
        per[c] = {"n": tp[c] + fn[c], "precision": None if p is None else round(p, 3), "recall": None if r is None else round(r, 3)}
    scored = [v for v in per.values() if v["precision"] is not None and v["recall"] is not None]
    f1 = [2 * v["precision"] * v["recall"] / (v["precision"] + v["recall"]) if v["precision"] + v["recall"] else 0.0 for v in scored]
    return {"excerpts": len(excerpts), "classes": len(per), "right": sum(tp.values()),
            "macro_f1": round(sum(f1) / len(per), 3) if per else None, "per_class": per, "wrong": wrong}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--table", action="store_true", help="print a Markdown table instead of the JSON line")
    args = p.parse_args()
    out = evaluate()
    if args.table:
        print("| class | excerpts | precision | recall |\n|---|---|---|---|")
        for c, v in out["per_class"].items():
            print(f"| {c} | {v['n']} | {v['precision']} | {v['recall']} |")
        return 0
    print(json.dumps(out))
    return 0 if not out["wrong"] else 1


if __name__ == "__main__":
    sys.exit(main())
