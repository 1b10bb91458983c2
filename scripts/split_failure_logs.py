"""Split the reproduced failure logs (scripts/make_failure_logs.py) into a dev and a test half,
by scenario, once, before the reader is tuned on them.

    python scripts/split_failure_logs.py OUT                 round 1: dev.jsonl, test.jsonl
    python scripts/split_failure_logs.py OUT2 --round 2      round 2: dev2.jsonl, test2.jsonl (another salt)

Reads ``OUT/manifest.json`` and ``OUT/logs/`` and writes tests/data/repro_corpus/dev.jsonl and
test.jsonl (``--round 2``: dev2.jsonl and test2.jsonl), one record a line in the public-thread corpus's format (tests/data/why_corpus:
``class``, ``negative``, ``expect``, ``thread``, ``source``, ``text``, ``note``) with the
scenario, the surrounding and the torch version that made the log. A scenario (one fault, one
program) is on one side with all its surroundings, so no program's words are in both halves.
Within each class (each kind of negative) the scenarios are ordered by ``sha256(SALT +
scenario)``: the first to test, then alternately. Prints the test half's sha256:
scripts/bench_failure_logs.py and tests/test_why_repro_corpus.py refuse a test half that
differs (it is frozen: never tuned on, edited or re-split).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "tests" / "data" / "repro_corpus"
SALT = "ups-repro-corpus-2026-11"
# round 2 (scripts/failure_job2.py's scenarios): split apart, with a salt of its own, into halves of
# their own, so its test half is frozen before the reader is tuned on round 2's dev half
SALTS = {1: SALT, 2: "ups-repro-corpus-round2-2026-11-27"}
NAMES = {1: ("dev", "test"), 2: ("dev2", "test2")}


def stratum(records: list[dict]) -> str:
    """A scenario's class: its failing logs' class, else its kind of negative."""
    named = [r["class"] for r in records if r["class"]]
    return named[0] if named else f"none:{records[0]['negative']}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path, help="the folder make_failure_logs.py wrote")
    p.add_argument("--round", type=int, choices=sorted(SALTS), default=1, help="which round's scenarios OUT holds")
    args = p.parse_args()
    salt, (dev_name, test_name) = SALTS[args.round], NAMES[args.round]
    manifest = json.loads((args.out / "manifest.json").read_text())
    by_scenario: dict[str, list[dict]] = defaultdict(list)
    for e in manifest["logs"]:
        text = (args.out / "logs" / e["log"]).read_text(encoding="utf-8", errors="replace")
        rec = {"class": e["class"], "thread": f"repro/{e['scenario']}", "scenario": e["scenario"],
               "surrounding": e["surrounding"], "source": f"scripts/make_failure_logs.py {e['scenario']} ({e['surrounding']})",
               "torch": manifest["torch"], "text": text, "note": e["note"], "exit_code": e["exit_code"]}
        if e["negative"]:
            rec["negative"] = e["negative"]
        if e.get("expect"):
            rec["expect"] = e["expect"]
        by_scenario[e["scenario"]].append(rec)
    strata: dict[str, list[str]] = defaultdict(list)
    for scenario, recs in by_scenario.items():
        strata[stratum(recs)].append(scenario)
    test_scenarios: set[str] = set()
    for scenarios in strata.values():
        ordered = sorted(scenarios, key=lambda s: hashlib.sha256((salt + s).encode()).hexdigest())
        test_scenarios.update(ordered[0::2])
    CORPUS.mkdir(parents=True, exist_ok=True)
    halves = {dev_name: [], test_name: []}
    for scenario in sorted(by_scenario):
        half = test_name if scenario in test_scenarios else dev_name
        halves[half] += sorted(by_scenario[scenario], key=lambda r: r["surrounding"])
    for name, rows in halves.items():
        (CORPUS / f"{name}.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in rows))
    digest = hashlib.sha256((CORPUS / f"{test_name}.jsonl").read_bytes()).hexdigest()
    print(json.dumps({"logs": sum(len(v) for v in halves.values()), "scenarios": len(by_scenario),
                      "classes": len({s for s in strata if not s.startswith("none:")}), "dev": len(halves[dev_name]),
                      "test": len(halves[test_name]), "test_scenarios": sorted(test_scenarios),
                      "test_classes": len({strata_of for strata_of, names in strata.items()
                                           if not strata_of.startswith("none:") and set(names) & test_scenarios}), "torch": manifest["torch"],
                      "test_sha256": digest}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
