"""Running the doctor's checks concurrently, each bounded by its timeout."""

from __future__ import annotations

import concurrent.futures as cf
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ups.doctor.checks import CHECKS, FAIL, SKIP, WARN, Check, Options, Verdict
from ups.errors import UpsError

SCHEMA = 1


@dataclass(frozen=True)
class CheckResult:
    id: str
    title: str
    status: str
    detail: str
    hint: str
    duration_s: float


@dataclass(frozen=True)
class DoctorReport:
    results: tuple[CheckResult, ...]
    duration_s: float

    @property
    def ok(self) -> bool:
        return not any(r.status == FAIL for r in self.results)

    def summary(self) -> dict[str, int]:
        out = {"ok": 0, "warn": 0, "fail": 0, "skip": 0}
        for r in self.results:
            out[r.status] += 1
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "ok": self.ok, "summary": self.summary(), "duration_s": round(self.duration_s, 3),
                "checks": [asdict(r) for r in self.results]}


def options_from(config: Path | None, root: Path | None, cache_dir: Path | None, runs_dir: Path, timeout_scale: float) -> Options:
    """Doctor options from a job config (precompute keys) plus explicit folders; config errors
    are kept for the config check instead of stopping the doctor."""
    o = Options(config=config, runs_dir=runs_dir, timeout_scale=timeout_scale)
    if config is not None:
        import yaml

        from ups.launch.config import ConfigError, PrecomputeConfig, TrainConfig, load_config

        try:
            data = yaml.safe_load(Path(config).read_text()) or {}
        except FileNotFoundError:
            raise UpsError(f"{config}: config file not found") from None
        except (OSError, yaml.YAMLError) as exc:
            raise UpsError(f"{config}: not readable YAML ({str(exc).splitlines()[0]})") from None
        cls = TrainConfig if isinstance(data, dict) and ("steps" in data or "lr" in data) else PrecomputeConfig
        try:
            cfg = load_config(cls, config)
            if isinstance(cfg, PrecomputeConfig):
                o.root, o.num_workers, o.batch_size = Path(cfg.root), cfg.num_workers, cfg.batch_size
                o.prefetch_factor = cfg.prefetch_factor
            o.cache_dir, o.tasks, o.splits = Path(cfg.cache_dir), list(cfg.tasks), list(cfg.splits)
        except ConfigError as exc:
            o.config_error = str(exc)
    if root is not None:
        o.root = root
    if cache_dir is not None:
        o.cache_dir = cache_dir
    return o


def select(only: list[str] | None, skip: list[str] | None) -> list[Check]:
    ids = {c.id for c in CHECKS}
    for name in (only or []) + (skip or []):
        if name not in ids:
            raise UpsError(f"unknown check {name!r} (checks: {', '.join(c.id for c in CHECKS)})")
    return [c for c in CHECKS if (not only or c.id in only) and c.id not in (skip or [])]


def run_doctor(options: Options, checks: list[Check], *, quick: bool = False) -> DoctorReport:
    started = time.monotonic()
    results: dict[str, CheckResult] = {}

    def one(check: Check) -> CheckResult:
        t = time.monotonic()
        try:
            v = check.run(options)
        except Exception as exc:  # noqa: BLE001 - a broken check is a failed check, not a crash
            v = Verdict(FAIL, f"check crashed: {type(exc).__name__}: {exc}")
        return CheckResult(check.id, check.title, v.status, v.detail, v.hint, round(time.monotonic() - t, 3))

    runnable = []
    for c in checks:
        if quick and c.probe:
            results[c.id] = CheckResult(c.id, c.title, SKIP, "skipped by --quick (subprocess probe)", "", 0.0)
        else:
            runnable.append(c)
    pool = cf.ThreadPoolExecutor(max_workers=max(1, len(runnable)), thread_name_prefix="ups-doctor")
    futures = {c.id: (c, pool.submit(one, c), time.monotonic()) for c in runnable}
    for cid, (c, fut, t0) in futures.items():
        remaining = c.timeout * options.timeout_scale - (time.monotonic() - t0)
        try:
            results[cid] = fut.result(timeout=max(0.1, remaining))
        except cf.TimeoutError:
            results[cid] = CheckResult(c.id, c.title, FAIL, f"did not finish within {c.timeout * options.timeout_scale:g} s",
                                       "this check hung: run it alone with --only " + c.id, round(time.monotonic() - t0, 3))
    pool.shutdown(wait=False, cancel_futures=True)
    ordered = tuple(results[c.id] for c in checks)
    return DoctorReport(ordered, time.monotonic() - started)


__all__ = ["DoctorReport", "CheckResult", "run_doctor", "options_from", "select", "WARN"]
