"""The log reader of `ups why` on the previous corpus's real failure excerpts
(tests/data/failure_corpus.json, each with its owner/repo#number; its patterns were written
while reading it, so it is part of the dev half of tests/data/why_corpus, never of test):
every excerpt is named by its class, in today's names (scripts/split_why_corpus.py maps the
old ones). The held-out score is scripts/bench_why_corpus.py's."""

from __future__ import annotations

import importlib.util
import json
import re
from collections import Counter
from pathlib import Path

import pytest

from ups.why.logread import BY_NAME, read_log

REPO = Path(__file__).resolve().parents[1]
CORPUS = json.loads((REPO / "tests" / "data" / "failure_corpus.json").read_text())["excerpts"]


def _old_names() -> dict[str, str]:
    spec = importlib.util.spec_from_file_location("split_why_corpus", REPO / "scripts" / "split_why_corpus.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.OLD_NAMES


NAMES = _old_names()


@pytest.mark.parametrize("excerpt", CORPUS, ids=[f"{e['class']}:{e['source']}" for e in CORPUS])
def test_each_real_excerpt_is_named_by_its_class(excerpt):
    m = read_log(excerpt["text"])
    want = NAMES.get(excerpt["class"], excerpt["class"])
    assert m.cls is not None and m.cls.name == want, f"{excerpt['source']}: got {m.name}"
    assert m.cls.fix and m.cls.what


def test_the_corpus_cites_every_excerpt_and_covers_each_class():
    assert all(re.fullmatch(r"[\w.-]+/[\w.-]+#\d+", e["source"]) for e in CORPUS)
    counts = Counter(NAMES.get(e["class"], e["class"]) for e in CORPUS)
    assert set(counts) <= set(BY_NAME)
    thin = {c: n for c, n in counts.items() if n < 3}
    assert not thin, thin  # the issue asks for at least 3 real excerpts per class


def test_a_log_that_says_nothing_known_is_not_classified():
    assert read_log("epoch 3 loss 0.41\nsaving checkpoint\n").cls is None
