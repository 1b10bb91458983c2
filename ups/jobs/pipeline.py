"""The pipeline job: a precompute run, then a train run on its cache; stops at the first failure.

Each stage is a run of its own (launched through the same supervisor, linked to this one by
``parent``), so each keeps its status, stacks and logs; this run records the stages.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from ups.runs.rundir import FINAL_RUN_STATES, RunDir
from ups.status.reporter import ENV_RUN_DIR, Reporter


def run_stage(parent: RunDir, kind: str, command: list[str], config: dict, extra: dict, thresholds: dict, rep) -> RunDir:
    from ups.launch.spawn import launch_run

    rep.phase(kind)
    child = launch_run(
        parent.path.parent, kind, command, argv=[*parent.read_manifest().get("argv", []), f"[{kind} stage]"],
        config=config, thresholds=thresholds, extra={**extra, "parent": parent.run_id},
        files={"config.json": json.dumps(config, indent=1).encode()},
    )
    rep.item(child.run_id)
    parent.append_event("stage.start", actor="job", stage=kind, run_id=child.run_id)
    while child.read_manifest().get("state") not in FINAL_RUN_STATES:
        time.sleep(0.5)
    return child


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    plan = json.loads(Path(args[0]).read_text())
    parent = RunDir(os.environ[ENV_RUN_DIR])
    from ups.launch.config import PrecomputeConfig, TrainConfig
    from ups.launch.plan import torchrun_command

    stages = []
    with Reporter.from_env(total=2, unit="stages") as rep:
        pre_cfg = PrecomputeConfig(**plan["precompute"])
        train_cfg = TrainConfig(**plan["train"])
        for kind, command, cfg, extra in (
            ("precompute", [sys.executable, "-m", "ups.jobs.precompute", "--config", "{RUN}/config.json"], pre_cfg, {}),
            ("train", torchrun_command(plan["nproc"], 1, None, None), train_cfg,
             {"nproc": plan["nproc"], "nnodes": 1, "world_size": plan["nproc"]}),
        ):
            child = run_stage(parent, kind, command, plan[kind], extra, cfg.thresholds(), rep)
            m = child.read_manifest()
            stages.append({"stage": kind, "run_id": child.run_id, "state": m["state"], "summary": m.get("summary")})
            parent.update_manifest(stages=stages)
            rep.advance()
            # With --skip-bad-shards the operator accepted a partial cache: train on the rest.
            accepted = m["state"] == "partial" and kind == "precompute" and bool(pre_cfg.skip_shards)
            if m["state"] != "succeeded" and not accepted:
                print(f"pipeline: {kind} stage {child.run_id} {m['state']}: {m.get('summary')}; stopping", file=sys.stderr)
                rep.fail(f"{kind} stage {m['state']}: {m.get('summary')}")
                return 1
            print(f"pipeline: {kind} stage {child.run_id} {m['state']}"
                  + (f" ({m.get('summary')}); going on with the rest (--skip-bad-shards)" if accepted else ""), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
