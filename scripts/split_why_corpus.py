"""Build the failure-log corpus of `ups why` and split it by thread, once, before any pattern.

    python scripts/split_why_corpus.py RAW.jsonl [RAW.jsonl ...] --old tests/data/failure_corpus.json

Each raw record is an excerpt copied verbatim from a public thread (its ``thread`` is
``owner/repo#N`` or a forum URL; ``class`` is the root cause an engineer would name, or null
for a negative: ``negative`` is healthy, warning or user_error). The split is by thread, so
no thread gives excerpts to both halves, and stratified by class (and by kind of negative),
so that every class has excerpts on both sides:

* the previous corpus's threads (its patterns were written while reading it) go to dev only;
* every other thread goes to test or dev by the order of ``sha256(SALT + thread)`` within its
  class: the first of each class's threads to test, then alternately, so test holds about
  half of each class's threads and at least one.

Writes ``tests/data/why_corpus/dev.jsonl`` and ``test.jsonl`` (sorted, one record a line)
and prints the test half's sha256: the README states it, and ``bench_why_corpus.py``
refuses a test half whose hash differs (a test half is frozen, never tuned on or edited).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "tests" / "data" / "why_corpus"
SALT = "ups-why-corpus-2026-11"
# The previous corpus's class names in this corpus's taxonomy.
OLD_NAMES = {
    "nccl_watchdog_timeout": "collective_timeout", "nccl_remote_error": "peer_lost",
    "nccl_version_mismatch": "nccl_invalid_usage", "nccl_socket": "nccl_network",
    "gpu_fallen_off_bus": "gpu_lost", "checkpoint_truncated": "checkpoint_corrupt",
    "module_not_found": "import_error", "dataset_missing": "file_missing", "killed_sigkill": "oom_killed",
}
FIELDS = ("class", "negative", "expect", "thread", "source", "text", "note")


def thread_of(source: str) -> str:
    """``owner/repo#N`` from a GitHub URL or such a reference; anything else as given."""
    s = source.strip()
    if s.startswith("https://github.com/"):
        parts = s.removeprefix("https://github.com/").split("/")
        if len(parts) >= 4 and parts[2] in ("issues", "pull", "discussions"):
            return f"{parts[0]}/{parts[1]}#{parts[3].split('#')[0]}"
    return s


def stratum(rec: dict) -> str:
    return rec["class"] or f"none:{rec.get('negative') or 'healthy'}"


def key(thread: str) -> str:
    return hashlib.sha256((SALT + thread).encode()).hexdigest()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("raw", nargs="+", type=Path)
    p.add_argument("--old", type=Path, default=None, help="the previous corpus (its threads go to dev)")
    args = p.parse_args()
    records: list[dict] = []
    for path in args.raw:
        for line in path.read_text().splitlines():
            if line.strip():
                rec = json.loads(line)
                rec["thread"] = thread_of(rec.get("thread") or rec["source"])
                records.append({k: rec.get(k) for k in FIELDS if rec.get(k) is not None or k == "class"})
    old_threads: set[str] = set()
    if args.old:
        for e in json.loads(args.old.read_text())["excerpts"]:
            t = thread_of(e["source"])
            old_threads.add(t)
            records.append({"class": OLD_NAMES.get(e["class"], e["class"]), "thread": t,
                            "source": f"https://github.com/{t.replace('#', '/issues/')}" if "#" in t else t,
                            "text": e["text"], "note": "from the previous corpus (tuned on: dev only)"})
    # One thread, one side: a thread's stratum is its first record's.
    by_thread: dict[str, list[dict]] = defaultdict(list)
    for rec in records:
        by_thread[rec["thread"]].append(rec)
    strata: dict[str, list[str]] = defaultdict(list)
    for thread, recs in by_thread.items():
        if thread not in old_threads:
            strata[stratum(recs[0])].append(thread)
    test_threads: set[str] = set()
    for threads in strata.values():
        ordered = sorted(threads, key=key)
        test_threads.update(ordered[0::2])  # the first, the third ...: about half, at least one
    dev = sorted((r for r in records if r["thread"] not in test_threads), key=lambda r: (stratum(r), r["thread"], r["text"]))
    test = sorted((r for r in records if r["thread"] in test_threads), key=lambda r: (stratum(r), r["thread"], r["text"]))
    OUT.mkdir(parents=True, exist_ok=True)
    for name, rows in (("dev", dev), ("test", test)):
        (OUT / f"{name}.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in rows))
    digest = hashlib.sha256((OUT / "test.jsonl").read_bytes()).hexdigest()
    classes = sorted({r["class"] for r in records if r["class"]})
    print(json.dumps({"records": len(records), "threads": len(by_thread), "classes": len(classes),
                      "negatives": sum(1 for r in records if not r["class"]), "dev": len(dev), "test": len(test),
                      "test_threads": len(test_threads), "test_sha256": digest}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
