"""How right `ups why`'s log reader (ups.why.logread) is on failure excerpts from public issue
threads. Prints one JSON line: for each split, the excerpts, how many were named right, the
macro-F1 over the classes, each class's precision and recall, and the negatives (healthy
logs, warnings, the program's own errors) given a class.

    python scripts/bench_why_corpus.py                      dev and test_seen, and the leave-source-out figure
    python scripts/bench_why_corpus.py --split dev          dev only
    python scripts/bench_why_corpus.py --heldout NEW.jsonl  also a held-out file, as its own split "heldout"
    python scripts/bench_why_corpus.py --seen OLD.jsonl     also a file tuned on since, as the split "OLD_seen"
    python scripts/bench_why_corpus.py --table              the per-class Markdown table (docs/benchmarks.md)

Both halves of tests/data/why_corpus/ have now been tuned on: test.jsonl was held out for one
score (0.926), then read, so its split is labelled "test_seen" and is no claim. Two figures
estimate what the reader does on logs it has not seen:

* "leave_source_out": the excerpts of both halves grouped by repository (owner/repo of the
  thread; a forum thread by its host), and the score on test.jsonl's excerpts from
  repositories that dev.jsonl does not have (their wording was never in the dev half). Still
  tuned on, so an upper bound;
* "heldout" (``--heldout PATH``, a jsonl in the corpus's format, never tuned on, scored once by
  whoever collected it): the claim, with the file's sha256.

A held-out file, once scored and then read to tune the reader, is a seen split like test.jsonl:
``--seen PATH`` (repeatable) scores it as "<stem>_seen" (tests/data/why_corpus/heldout.jsonl,
scored once at 0.891 and tuned on since, is "heldout_seen"), with its sha256, and is no claim.

test.jsonl's sha256 is still checked (the file is frozen: never edited or re-split).
Macro-F1 is the mean of the per-class F1 over every class the split has or the reader
predicted (a class predicted that the split does not have counts, at 0). A negative is right
when the reader names no class; its "your code raised X" or "no known class" is not a class.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from collections import Counter
from pathlib import Path
from urllib.parse import urlparse

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
CORPUS = REPO / "tests" / "data" / "why_corpus"
TEST_SHA256 = "64821339a4c4e6f49a09183d18304a801945e5440a599daa7bbb98c0b3c2a5bc"


class FrozenSplitChanged(SystemExit):
    pass


def load(split: str) -> tuple[list[dict], bytes]:
    """One split's records (and bytes). test.jsonl is read only when it hashes to the frozen
    sha256."""
    data = (CORPUS / f"{split}.jsonl").read_bytes()
    if split == "test":
        digest = hashlib.sha256(data).hexdigest()
        if digest != TEST_SHA256:
            raise FrozenSplitChanged(f"refusing to score: test.jsonl's sha256 is {digest}, not the frozen {TEST_SHA256}")
    return records_of(data), data


def records_of(data: bytes) -> list[dict]:
    return [json.loads(line) for line in data.decode("utf-8").splitlines() if line.strip()]


def repository(rec: dict) -> str:
    """Where an excerpt comes from: the thread's owner/repo (case folded), or a forum's host."""
    m = re.match(r"([\w.-]+/[\w.-]+)#\d+$", rec.get("thread", ""))
    if m:
        return m.group(1).lower()
    for url in (rec.get("source"), rec.get("thread")):
        host = urlparse(url or "").netloc.lower()
        if host:
            host = host.removeprefix("www.")
            if host == "github.com":
                parts = urlparse(url).path.strip("/").split("/")
                if len(parts) >= 2:
                    return f"{parts[0]}/{parts[1]}".lower()
            return host
    return rec.get("thread", "") or "?"


def score(records: list[dict]) -> dict:
    """The reader on a list of records."""
    from ups.why.logread import read_log

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


def leave_source_out(dev: list[dict], test: list[dict]) -> dict:
    """The score on test's excerpts from repositories dev does not have."""
    seen = {repository(r) for r in dev}
    unseen = [r for r in test if repository(r) not in seen]
    s = score(unseen)
    return {"repositories": len({repository(r) for r in dev + test}), "dev_repositories": len(seen),
            "test_repositories_not_in_dev": len({repository(r) for r in unseen}),
            **{k: s[k] for k in ("excerpts", "right", "classes", "macro_f1", "negatives", "negatives_given_a_class",
                                 "negatives_given_a_class_pct", "failures_said_unknown", "own_errors_named")}}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--split", choices=("dev", "test", "both"), default="both",
                   help="which half to score (test is reported as test_seen: it has been tuned on)")
    p.add_argument("--heldout", type=Path, metavar="PATH",
                   help="a jsonl in the corpus's format, never tuned on: scored as the split 'heldout'")
    p.add_argument("--seen", type=Path, metavar="PATH", action="append", default=[],
                   help="a jsonl in the corpus's format that has been tuned on (an earlier held-out file): scored as "
                        "the split '<its stem>_seen'; repeatable")
    p.add_argument("--table", action="store_true", help="print the per-class Markdown table instead of the JSON line")
    args = p.parse_args()
    halves = ("dev", "test") if args.split == "both" else (args.split,)
    try:
        loaded = {h: load(h)[0] for h in halves}
    except FrozenSplitChanged as exc:
        print(exc, file=sys.stderr)
        return 2
    label = {"dev": "dev", "test": "test_seen"}
    out: dict = {label[h]: score(recs) for h, recs in loaded.items()}
    if "test" in loaded:
        out["test_sha256"] = TEST_SHA256
    if args.split == "both":
        out["leave_source_out"] = leave_source_out(loaded["dev"], loaded["test"])
    extra = [(f"{path.stem}_seen", path) for path in args.seen]
    if args.heldout is not None:
        extra.append(("heldout", args.heldout))
    names = [name for name, _ in extra]
    clash = next((name for name in names if name in out or names.count(name) > 1), None)
    if clash is not None:
        print(f"two splits would be reported as {clash!r}: rename one of the files", file=sys.stderr)
        return 2
    for name, path in extra:
        try:
            data = path.read_bytes()
            records = records_of(data)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            print(f"cannot read {path}: {exc}", file=sys.stderr)
            return 2
        out[name] = {**score(records), "sha256": hashlib.sha256(data).hexdigest()}
    splits = [s for s in ("dev", "test_seen") if s in out] + names
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
