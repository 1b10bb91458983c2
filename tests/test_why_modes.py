"""`ups why` on the ten failure modes of the issue, each built for real (tests/why_drills.py):
the verdict names the mode, who and where within 15 s of the failure becoming visible under
the run's thresholds, with no flag asked of the operator, and no verdict on the way (asked
every 0.2 s) blames another process."""

from __future__ import annotations

import pytest
from helpers import run_ups
from why_drills import DRILLS, VERDICT_WITHIN_S, ended, run_drill

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("drill", DRILLS, ids=[d.name for d in DRILLS])
def test_the_verdict_names_who_where_and_what_to_do(drill, runs_root, tmp_path):
    try:
        out = run_drill(drill, tmp_path)
        run = out["run"]
        assert out["visible_s"] is not None, f"the failure never showed: {run.read_manifest().get('summary')}"
        assert out["problem"] is None, f"{out['problem']}\nverdict: {out['verdict'] and out['verdict']['text']}"
        assert out["verdict_s"] <= VERDICT_WITHIN_S
        # Asked every 0.2 s from launch on (as a console does), no verdict blamed anyone else.
        assert not out["wrong"], "a verdict on the way blamed another process:\n" + "\n".join(map(str, out["wrong"][:6]))
        res = run_ups("why", str(run.path), "--json")  # what the operator runs says the same
        assert res.returncode == 1 and f'"mode": "{drill.mode}"' in res.stdout, res.stdout + res.stderr
        if not ended(run):
            assert run_ups("kill", str(run.path), "--grace", "3").returncode == 0
    finally:
        if drill.cleanup:
            drill.cleanup()
