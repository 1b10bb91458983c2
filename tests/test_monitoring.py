"""`ups exporter`, `ups launch --metrics-port`, the alert rules and the Grafana board of
docs/monitoring/, checked the way their users would: a real Prometheus server scraping a real
2-rank job, its query and alerts APIs; promtool on the shipped rules; the board's every query
run against that server; hostile run folders scraped."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml
from helpers import run_ups, wait_for, why_now
from test_hostile_files import HOSTILE_VALUES, copy_run, plant_hostile_files, record

from ups.runs.rundir import RunDir

REPO = Path(__file__).resolve().parents[1]
RULES = REPO / "docs" / "monitoring" / "alerts.yml"
BOARD = REPO / "docs" / "monitoring" / "grafana-dashboard.json"
DDP = str(Path(__file__).parent / "programs" / "ddp_train.py")
FAST = {"UPS_HEARTBEAT_INTERVAL": "0.3"}
PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
needs_prometheus = pytest.mark.skipif(PROMETHEUS is None or PROMTOOL is None,
                                      reason="the Debian package prometheus is not installed (.ci/run installs it)")


def exposed_names() -> set[str]:
    """Every series name the exporter can write (the families' names as written on the wire)."""
    from ups.exporter.families import SPEC

    names = {"ups_exporter_runs", "ups_exporter_unreadable_runs", "ups_exporter_scrape_seconds"}
    for name, (_, kind, _) in SPEC.items():
        names.add(name + "_info" if kind == "info" else name)
    return names


def board_exprs() -> list[tuple[str, str]]:
    board = json.loads(BOARD.read_text())
    return [(p["title"], t["expr"]) for p in board["panels"] for t in p["targets"]]


def scrape(collector) -> tuple[str, float]:
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    started = time.monotonic()
    text = generate_latest(registry).decode()
    return text, time.monotonic() - started


def series(text: str) -> dict[tuple, float]:
    """The samples of a text exposition, by name and labels (ages left out: they move between two reads)."""
    from prometheus_client.parser import text_string_to_metric_families

    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in text_string_to_metric_families(text)
            for s in f.samples if "_seconds" not in s.name}


def test_the_board_draws_rank_rate_loss_health_gpu_memory_and_verdict_from_exported_metrics():
    board = json.loads(BOARD.read_text())
    assert board["uid"] and board["title"] and board["templating"]["list"][0]["name"] == "run"
    titles = [p["title"] for p in board["panels"]]
    for want in ("Step rate per rank", "Loss per rank", "Health", "GPU memory per rank", "Verdict"):
        assert any(t.startswith(want) for t in titles), (want, titles)
    for p in board["panels"]:
        assert p["type"] in ("timeseries", "stat", "table", "state-timeline") and p["targets"], p["title"]
        assert set(p["gridPos"]) == {"x", "y", "w", "h"} and p["gridPos"]["x"] + p["gridPos"]["w"] <= 24
    exposed = exposed_names()
    for title, expr in board_exprs():
        used = set(re.findall(r"\bups_[a-z_]+", expr)) - {"ups_process_health", "ups_run_state"} | (
            {n for n in ("ups_process_health", "ups_run_state") if re.search(rf"\b{n}\s*[{{(]", expr)})
        assert used and used <= exposed, (title, used - exposed)
    rules = yaml.safe_load(RULES.read_text())["groups"][0]["rules"]
    for rule in rules:
        assert set(re.findall(r"\bups_[a-z_]+", rule["expr"])) - {"ups_run_verdict_mode", "ups_run_state",
                                                                  "ups_process_health"} <= exposed, rule["alert"]


@needs_prometheus
def test_the_shipped_rules_pass_promtool_and_the_hang_rule_names_the_launchers_hang_modes():
    from ups.launch.onhang import HANG_MODES

    res = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and "SUCCESS: 5 rules found" in res.stdout + res.stderr, res.stdout + res.stderr
    rules = {r["alert"]: r for r in yaml.safe_load(RULES.read_text())["groups"][0]["rules"]}
    assert set(rules) == {"UpsHang", "UpsLossNonFinite", "UpsRankDead", "UpsRunFailed", "UpsRestartStorm"}
    modes = re.search(r'ups_run_verdict_mode=~"([^"]+)"', rules["UpsHang"]["expr"]).group(1).split("|")
    assert set(modes) == set(HANG_MODES)


@pytest.mark.slow
def test_a_hostile_run_folder_never_fails_a_scrape_nor_blocks_it(finished_run, tmp_path):
    """Every bad status file of the hostile-input tests, then every hostile value in every
    field of a record and of run.json: each scrape answers text that parses, within 5 s (a few
    ms here; the bound catches a read that blocks, and leaves a loaded box its pauses)."""
    from prometheus_client.parser import text_string_to_metric_families

    from ups.exporter.collector import RunsCollector

    root = tmp_path / "runs"
    root.mkdir()
    run = copy_run(finished_run, root)
    collector = RunsCollector(root, ended_kept_s=1e9)
    plant_hostile_files(run)
    text, took = scrape(collector)
    assert took < 5.0
    samples = {(s.name, s.labels.get("run")): s.value for f in text_string_to_metric_families(text) for s in f.samples}
    assert samples[("ups_run_unreadable_records", run.run_id)] == 18  # every bad file counted, none exported
    assert samples[("ups_rank_step", run.run_id)] == record(run)["step"] and samples[("ups_exporter_runs", None)] == 1

    # Run folders whose run.json is no manifest (the cases of the hostile-manifest test): counted, never read twice.
    for name, plant in (("fifo", lambda p: os.mkfifo(p)), ("dev-zero", lambda p: p.symlink_to("/dev/zero")),
                        ("list", lambda p: p.write_text('["run"]')), ("not-utf8", lambda p: p.write_bytes(b'{"id": "\xff"}'))):
        bad = copy_run(finished_run, root, f"20200101-000000-{name}")
        bad.manifest_path.unlink()
        plant(bad.manifest_path)
    text, took = scrape(collector)
    samples = {(s.name, s.labels.get("run")): s.value for f in text_string_to_metric_families(text) for s in f.samples}
    assert took < 5.0 and samples[("ups_exporter_unreadable_runs", None)] == 4 and samples[("ups_exporter_runs", None)] == 1

    good_record, good_manifest = record(run), json.loads(run.manifest_path.read_text())
    rec_path = run.status_dir / "rank-0.json"
    slowest = 0.0
    for target, good, path in (("record", good_record, rec_path), ("run.json", good_manifest, run.manifest_path)):
        for key in sorted(good):
            for value in HOSTILE_VALUES:
                path.write_text(json.dumps({**good, key: value}))
                text, took = scrape(collector)
                slowest = max(slowest, took)
                try:
                    families = list(text_string_to_metric_families(text))
                except Exception as exc:
                    raise AssertionError(f"{target} field {key!r} = {value!r:.60}: unparseable") from exc
                assert any(f.name == "ups_exporter_runs" for f in families)
        path.write_text(json.dumps(good))
    assert slowest < 5.0, slowest


def test_text_from_a_run_is_escaped_and_never_a_label_name(finished_run, tmp_path):
    from prometheus_client.parser import text_string_to_metric_families

    from ups.exporter.collector import RunsCollector

    root = tmp_path / "runs"
    root.mkdir()
    run = copy_run(finished_run, root)
    host = 'node"1\n} evil{x="y'
    rec = {**record(run), "host": host, "metrics": {'loss"} 1\nups_fake': 3, "loss": "nan"}}
    (run.status_dir / "rank-0.json").write_text(json.dumps(rec))
    assert "ups_rank_loss{" not in scrape(RunsCollector(root, ended_kept_s=1e9))[0]  # another node's rank
    text, _ = scrape(RunsCollector(root, ended_kept_s=1e9, all_nodes=True))
    assert "ups_fake" not in text.replace("\\n", "")
    families = {f.name: f for f in text_string_to_metric_families(text)}
    (loss,) = families["ups_rank_loss"].samples
    assert loss.value != loss.value and loss.labels["node"] == 'node"1\\x0a} evil{x="y'  # NaN; the reader's printable text, escaped
    assert families["ups_rank_loss_nonfinite"].samples[0].value == 1
    # The endpoint's own writer (ups/exporter/text.py) says the same series as prometheus_client's.
    from ups.exporter.text import exposition

    collector = RunsCollector(root, ended_kept_s=1e9, all_nodes=True)
    ours, theirs = [series(t) for t in (exposition(collector.collect()).decode(), scrape(collector)[0])]
    assert ours.keys() == theirs.keys() and len(ours) > 100
    assert {name for name, _ in ours} <= exposed_names()  # the documented names: a counter ends in one _total
    assert all(ours[k] == theirs[k] or ours[k] != ours[k] and theirs[k] != theirs[k] for k in ours)
    names = {k for f in families.values() for s in f.samples for k in s.labels}
    assert names <= {"run", "kind", "node", "role", "rank", "worker", "op", "mode", "headline", "ups_process_health",
                     "ups_run_state", "ups_run_verdict_mode"}


def test_a_run_whose_launcher_vanished_is_exported_settled_then_drops_out(finished_run, tmp_path):
    """run.json still says running, its launcher is gone: exported as every reader settles it
    (succeeded, from its records), until --ended-kept after its last sign of life."""
    from ups.exporter.collector import RunsCollector

    root = tmp_path / "runs"
    root.mkdir()
    run = copy_run(finished_run, root)
    m = json.loads(run.manifest_path.read_text())
    m.update(state="running", ended_at=None, summary=None, verdict=None)
    m["launcher"] = {**m["launcher"], "pid_start": 1.0}  # the pid is someone else's now, or nobody's
    run.manifest_path.write_text(json.dumps(m))
    kept = series(scrape(RunsCollector(root, ended_kept_s=1e9))[0])
    assert kept[("ups_run_state", (("kind", "python"), ("run", run.run_id), ("ups_run_state", "succeeded")))] == 1
    assert not any(k[0] == "ups_run_state" for k in series(scrape(RunsCollector(root, ended_kept_s=0))[0]))


def test_the_exporter_command_serves_and_a_taken_port_is_one_line(finished_run, tmp_path, procs):
    root = tmp_path / "runs"
    root.mkdir()
    run = copy_run(finished_run, root)
    server = procs.popen([sys.executable, "-m", "ups", "exporter", "--port", "0", "--ended-kept", "1e9", "--runs-dir",
                          str(root)], stdout=subprocess.PIPE, text=True)
    url = server.stdout.readline().split()[1]
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    body = urllib.request.urlopen(url, timeout=30).read().decode()
    assert f'ups_run_state{{run="{run.run_id}",kind="python",ups_run_state="succeeded"}} 1.0' in body
    with pytest.raises(urllib.error.HTTPError) as posted:  # the endpoint only reads
        urllib.request.urlopen(urllib.request.Request(url, data=b"x", method="POST"), timeout=30)
    assert posted.value.code == 405
    taken = run_ups("exporter", "--port", str(port), "--runs-dir", str(root), timeout=30)
    assert taken.returncode == 2 and taken.stderr.strip().count("\n") == 0
    assert f"cannot serve metrics on 127.0.0.1:{port}" in taken.stderr and "Traceback" not in taken.stderr
    server.terminate()
    assert server.wait(10) == 0


# -- the real thing: Prometheus scraping a live 2-rank job ------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def api(base: str, path: str, **params: str) -> dict:
    url = f"{base}/api/v1/{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
    with urllib.request.urlopen(url, timeout=30) as resp:
        out = json.loads(resp.read())
    assert out["status"] == "success", out
    return out["data"]


def values(base: str, expr: str) -> dict[tuple, float]:
    """An instant query: {label values (sorted by name, without __name__): value}."""
    return {tuple(v for k, v in sorted(r["metric"].items()) if k != "__name__"): float(r["value"][1])
            for r in api(base, "query", query=expr)["result"]}


def launch(*args: str, cwd: Path) -> RunDir:
    res = run_ups("launch", "torchrun", "--detach", "--json", *args, env=FAST, timeout=120, cwd=cwd)
    assert res.returncode == 0, res.stderr
    return RunDir(json.loads(res.stdout)["run_dir"])


@pytest.mark.slow
@needs_prometheus
def test_prometheus_sees_each_ranks_step_and_loss_the_hung_rank_stall_and_fires_the_hang_alert(runs_root, tmp_path, procs):
    launcher_port = free_port()
    healthy = launch("--metrics-port", str(launcher_port), "--nproc-per-node", "2", DDP, "--steps", "100000",
                     "--workers", "0", "--step-time", "0.1", cwd=tmp_path)
    hung = launch("--stalled-after", "3", "--nproc-per-node", "2", DDP, "--steps", "100000", "--workers", "0",
                  "--step-time", "0.1", "--fail", "sleep", "--fail-rank", "1", "--fail-step", "40", cwd=tmp_path)
    exporter = procs.popen([sys.executable, "-m", "ups", "exporter", "--port", "0", "--runs-dir", str(runs_root)],
                           stdout=subprocess.PIPE, text=True)
    target = exporter.stdout.readline().split()[1].split("//")[1].split("/")[0]
    # The shipped rules, with the hang's `for` cut to 2 s: a test cannot wait a minute.
    rules = yaml.safe_load(RULES.read_text())
    for rule in rules["groups"][0]["rules"]:
        if rule["alert"] == "UpsHang":
            rule["for"] = "2s"
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules))
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(tmp_path / "rules.yml")],
        "scrape_configs": [{"job_name": "ups", "static_configs": [{"targets": [target]}]},
                           {"job_name": "launcher", "static_configs": [{"targets": [f"127.0.0.1:{launcher_port}"]}]}],
    }))
    base = f"http://127.0.0.1:{free_port()}"
    procs.popen([PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                 f"--web.listen-address={base.split('//')[1]}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def step_of(run: RunDir) -> dict[str, float]:
        return {r["metric"]["rank"]: float(r["value"][1])
                for r in api(base, "query", query=f'ups_rank_step{{job="ups", run="{run.run_id}"}}')["result"]}

    wait_for(lambda: _ready(base), 60, interval=0.5, message="Prometheus ready")
    first = wait_for(lambda: (s := step_of(healthy)) and set(s) == {"0", "1"} and all(s.values()) and s, 90,
                     interval=0.5, message="both ranks' steps of the healthy job in Prometheus")
    wait_for(lambda: all(v > first[r] + 3 for r, v in step_of(healthy).items()), 60, interval=0.5,
             message="each rank's step increasing")
    losses = wait_for(lambda: (x := {r["metric"]["rank"]: float(r["value"][1]) for r in api(
        base, "query", query=f'ups_rank_loss{{job="ups", run="{hung.run_id}"}}')["result"]}) and len(x) == 2 and x,
        60, interval=0.5, message="each rank's loss")
    assert all(0 < v < 100 for v in losses.values()), losses
    # The launcher's own endpoint serves its run, and only it.
    launcher_runs = {r["metric"]["run"] for r in api(base, "query", query='ups_rank_step{job="launcher"}')["result"]}
    assert launcher_runs == {healthy.run_id}

    def named():  # `ups why` names rank 1: the moment it does
        v = why_now(hung)
        return not v["ok"] and (v["who"] or {}).get("rank") == 1 and v

    verdict = wait_for(named, 120, interval=0.2, message="`ups why` naming the hung rank 1")
    said_at = time.time()
    mode = verdict["mode"]
    stalled = (f'ups_process_health{{job="ups", run="{hung.run_id}", role="rank", rank="1", '
               f'ups_process_health="stalled"}}')
    shown = f'ups_run_verdict_mode{{job="ups", run="{hung.run_id}", ups_run_verdict_mode="{mode}"}}'
    wait_for(lambda: values(base, f"{stalled} == 1") and values(base, f"{shown} == 1"), 30, interval=0.25,
             message=f"rank 1 stalled and the verdict {mode} in Prometheus")
    # Within 3 scrapes of `ups why`: the scrapes Prometheus made after it said so, up to the first sample
    # that shows each (counted from the samples' own timestamps, not from this box's pace).
    scrapes = [float(t) for t, _ in api(base, "query", query='up{job="ups"}[5m]')["result"][0]["values"]]
    for expr in (stalled, shown):
        first_on = min(float(t) for t, v in api(base, "query", query=f"{expr}[5m]")["result"][0]["values"] if v == "1")
        assert len([t for t in scrapes if said_at < t <= first_on]) <= 3, (expr, said_at, first_on)
    info = api(base, "query", query=f'ups_run_verdict_info{{job="ups", run="{hung.run_id}"}}')["result"]
    assert info[0]["metric"]["mode"] == mode and info[0]["metric"]["rank"] == "1"

    def fired():
        alerts = api(base, "alerts")["alerts"]
        return [a for a in alerts if a["labels"]["alertname"] == "UpsHang" and a["state"] == "firing"] and alerts

    alerts = wait_for(fired, 60, interval=0.5, message="the UpsHang alert firing")
    hangs = [a for a in alerts if a["labels"]["alertname"] == "UpsHang"]
    assert {a["labels"]["run"] for a in hangs} == {hung.run_id}, hangs  # never on the healthy job
    assert "rank 1" in next(a for a in hangs if a["state"] == "firing")["annotations"]["description"]
    # Every query of the board runs on this server, and the rank panels have data.
    for title, expr in board_exprs():
        result = api(base, "query", query=expr.replace("$run", f"{healthy.run_id}|{hung.run_id}"))["result"]
        if title in ("Step rate per rank", "Loss per rank", "Verdict (ups why)", "Health of ranks, agents, launchers"):
            assert result, title
    for run in (healthy, hung):
        assert run_ups("kill", str(run.path), "--grace", "3", timeout=60).returncode == 0


def _ready(base: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base}/-/ready", timeout=5) as resp:
            return resp.status == 200
    except OSError:
        return False


def test_a_bad_or_taken_metrics_port_refuses_the_launch_before_anything_starts(runs_root, tmp_path):
    prog = tmp_path / "prog.py"
    prog.write_text("print('hi')\n")
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        for value, said in (("abc", "--metrics-port 'abc': give a port (1-65535) or ADDRESS:PORT"),
                            (str(port), f"--metrics-port: cannot listen on 127.0.0.1:{port}")):
            res = run_ups("launch", "python", "--metrics-port", value, str(prog), timeout=60)
            assert res.returncode == 2 and said in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert not list(runs_root.iterdir())  # nothing half-written
