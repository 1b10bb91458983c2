"""`ups why` on the ten failure modes of the issue, each built for real (tests/why_drills.py):
the verdict names the mode, who and where within 15 s of the failure becoming visible under
the run's thresholds, with no flag asked of the operator, and no verdict on the way (asked
every 0.2 s) blames another process."""

from __future__ import annotations

import pytest
from why_drills import DRILLS, assert_drill

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("drill", DRILLS, ids=[d.name for d in DRILLS])
def test_the_verdict_names_who_where_and_what_to_do(drill, runs_root, tmp_path):
    try:
        assert_drill(drill, tmp_path)
    finally:
        if drill.cleanup:
            drill.cleanup()
