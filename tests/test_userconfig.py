"""The user's ~/.config/ups/config.toml is read on every Python ups supports (tomllib is in the
standard library from 3.11 only: 3.10 reads it with tomli); a broken one is one line in the
run's events, and the run goes on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import run_ups, wait_for

from ups.runs.rundir import RunDir

pytestmark = pytest.mark.notorch  # also run on each other Python, without torch (tests/test_pythons.py)


def _config_home(tmp_path: Path, text: str) -> dict[str, str]:
    folder = tmp_path / "xdg" / "ups"
    folder.mkdir(parents=True)
    (folder / "config.toml").write_text(text)
    return {"XDG_CONFIG_HOME": str(tmp_path / "xdg")}


def test_the_notify_targets_of_config_toml_hear_a_runs_end(runs_root, tmp_path):
    out = tmp_path / "told.jsonl"
    env = _config_home(tmp_path, f'[notify]\ntargets = ["cmd:cat >> {out}; echo >> {out}"]\nmin_interval_s = 0\n')
    (tmp_path / "prog.py").write_text("print('done', flush=True)\n")
    res = run_ups("launch", "python", "--json", "prog.py", env=env, cwd=tmp_path, timeout=120)
    assert res.returncode == 0, res.stderr
    run = RunDir(json.loads(res.stdout)["run_dir"])
    assert [e for e in run.read_events() if e["event"] == "notify.failed"] == []  # 3.10 without tomli: one, and no message
    told = wait_for(lambda: out.exists() and [json.loads(ln) for ln in out.read_text().splitlines() if ln.strip()],
                    60, message="the end, told to config.toml's target")
    assert [m["event"] for m in told] == ["end"] and told[0]["state"] == "succeeded", told


def test_a_broken_config_toml_is_named_in_the_runs_events_and_the_run_goes_on(runs_root, tmp_path):
    env = _config_home(tmp_path, "[notify\ntargets = 1\n")
    (tmp_path / "prog.py").write_text("print('done', flush=True)\n")
    res = run_ups("launch", "python", "--json", "prog.py", env=env, cwd=tmp_path, timeout=120)
    assert res.returncode == 0, res.stderr
    run = RunDir(json.loads(res.stdout)["run_dir"])
    assert run.read_manifest()["state"] == "succeeded"
    (failed,) = [e for e in run.read_events() if e["event"] == "notify.failed"]
    path = tmp_path / "xdg" / "ups" / "config.toml"
    assert failed["target"] == "config" and failed["error"].startswith(f"{path}: not a valid config (TOMLDecodeError: "), failed
    assert "\n" not in failed["error"]
