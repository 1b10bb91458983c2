"""Job configuration: typed dataclasses, loaded from YAML plus CLI overrides, validated.

No torch here: the CLI validates a config before anything is launched.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

from ups.errors import UpsError

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"


class ConfigError(UpsError):
    """A config file or value is wrong: names the key and what is expected."""


@dataclass
class PrecomputeConfig:
    """Latent-cache precompute: which data, which encoder, and how hangs are handled."""

    root: str = "data/demo"
    """Folder with the HDF5 shards ({task}_{split}.h5 or {task}_{split}_*.h5, or raw PDEBench)."""
    tasks: list[str] = field(default_factory=lambda: ["advection1d"])
    """Tasks to encode (advection1d, burgers1d, darcy2d)."""
    splits: list[str] = field(default_factory=lambda: ["train"])
    """Splits to encode (train, val, test)."""
    cache_dir: str = "cache/demo"
    """Where cache_dir/{task}_{split}/sample_XXXXX.pt files go."""
    num_workers: int = 2
    """DataLoader worker processes reading raw fields; 0 reads in the main process (legacy)."""
    batch_size: int = 8
    """Samples encoded together on the device."""
    prefetch_factor: int = 2
    """Batches each worker reads ahead."""
    latent_dim: int = 32
    """Width of each latent token."""
    latent_tokens: int = 16
    """Latent tokens per time step."""
    cache_dtype: str = "float16"
    """Dtype of stored latents: float16 or float32."""
    device: str = "auto"
    """Encoder device: cpu, cuda, or auto (cuda when available)."""
    seed: int = 0
    """Encoder weight seed (when no checkpoint is given)."""
    encoder_checkpoint: str | None = None
    """Optional encoder state dict; its weights hash goes into the cache metadata."""
    overwrite: bool = False
    """Replace a cache written with another hash instead of refusing."""
    dataloader_timeout: float = 30.0
    """Seconds the main process waits for one batch before rebuilding the loader."""
    worker_timeout: float = 20.0
    """A worker stalled or unresponsive this long gets its stack dumped and is killed."""
    unresponsive_after: float = 5.0
    """No heartbeat for this long (pid alive) means a worker is blocked in a C call."""
    heartbeat_interval: float = 1.0
    """Seconds between status record writes."""
    quarantine_after: int = 2
    """A sample (or file open) in flight on this many hung or dead workers is skipped."""
    fallback_after: int = 2
    """Worker failures after which the job falls back to num_workers=0."""
    write_workers: int = -1
    """Processes writing cache files in parallel mode; -1 picks min(4, CPUs // 4), 0 on small boxes."""
    write_timeout: float = 120.0
    """A batch of cache files not written after this long fails the job (hung storage)."""
    shard_open_timeout: float = 5.0
    """Seconds the launch check gives each shard to open before calling it bad (a FIFO, a hung mount)."""
    skip_shards: dict[str, str] = field(default_factory=dict)
    """Shard file names left out of the job -> why (`ups launch precompute --skip-bad-shards`
    fills it from the launch check); the run then ends partial, naming them."""

    def validate(self) -> PrecomputeConfig:
        _check_tasks_and_splits(self.tasks, self.splits)
        if not self.tasks or not self.splits:
            raise ConfigError("tasks and splits must not be empty")
        _check(self.num_workers >= 0, "num_workers", self.num_workers, ">= 0")
        _check(self.batch_size >= 1, "batch_size", self.batch_size, ">= 1")
        _check(self.prefetch_factor >= 1, "prefetch_factor", self.prefetch_factor, ">= 1")
        _check(self.latent_dim >= 1, "latent_dim", self.latent_dim, ">= 1")
        _check(self.latent_tokens >= 1, "latent_tokens", self.latent_tokens, ">= 1")
        _check(self.cache_dtype in ("float16", "float32"), "cache_dtype", self.cache_dtype, "float16 or float32")
        _check(self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:"), "device", self.device, "cpu, cuda[:N] or auto")
        for name in ("dataloader_timeout", "worker_timeout", "unresponsive_after", "heartbeat_interval"):
            _check(getattr(self, name) > 0, name, getattr(self, name), "> 0 seconds")
        _check(self.quarantine_after >= 1, "quarantine_after", self.quarantine_after, ">= 1")
        _check(self.fallback_after >= 1, "fallback_after", self.fallback_after, ">= 1")
        _check(self.write_workers >= -1, "write_workers", self.write_workers, "-1 (auto), 0 or more")
        _check(self.write_timeout > 0, "write_timeout", self.write_timeout, "> 0 seconds")
        _check(self.shard_open_timeout > 0, "shard_open_timeout", self.shard_open_timeout, "> 0 seconds")
        return self

    def latent_hash_parts(self) -> dict[str, Any]:
        """What changes the latents (and nothing that does not, like worker counts)."""
        return {
            "latent_dim": self.latent_dim,
            "latent_tokens": self.latent_tokens,
            "cache_dtype": self.cache_dtype,
            "seed": self.seed,
            "encoder_checkpoint": self.encoder_checkpoint,
        }

    def thresholds(self) -> dict[str, Any]:
        """Health thresholds for the run (run.json "thresholds")."""
        return {
            "heartbeat_interval": self.heartbeat_interval,
            "unresponsive_after": self.unresponsive_after,
            "stalled_after": self.worker_timeout,
            "startup_grace": max(self.worker_timeout, 10.0),
        }


def _check_tasks_and_splits(tasks: list[str], splits: list[str]) -> None:
    from ups.data.tasks import SPLITS, TASKS

    for t in tasks:
        if t not in TASKS:
            raise ConfigError(f"tasks: unknown task {t!r} (known: {', '.join(TASKS)})")
    for s in splits:
        if s not in SPLITS:
            raise ConfigError(f"splits: unknown split {s!r} (known: {', '.join(SPLITS)})")


def _check(ok: bool, key: str, value: Any, expected: str) -> None:
    if not ok:
        raise ConfigError(f"{key}: {value!r} is not valid (expected {expected})")


C = TypeVar("C")


def _declared_type(cls: type, key: str) -> type:
    """The type a field holds: ``float`` for ``float | None`` (its default says nothing)."""
    import typing

    hint = typing.get_type_hints(cls).get(key, str)
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if args and isinstance(args[0], type) else (hint if isinstance(hint, type) else str)


def _coerce(cls: type, key: str, value: Any, default: Any) -> Any:
    if value is None:
        return None
    kind = type(default) if default is not None else _declared_type(cls, key)
    if isinstance(default, list):
        if isinstance(value, str):
            value = [v for v in value.replace(",", " ").split() if v]
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        return [str(v) for v in value]
    if kind is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true or false, got {value!r}")
    try:
        if kind is int and isinstance(value, float) and not value.is_integer():
            raise ValueError
        return kind(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{key}: expected {kind.__name__}, got {value!r}") from None


def load_config(cls: type[C], path: str | os.PathLike[str] | None = None, overrides: dict[str, Any] | None = None) -> C:
    """Defaults, then the YAML file's keys, then non-None overrides; every key checked."""
    values: dict[str, Any] = {}
    if path is not None:
        import yaml

        p = Path(path)
        try:
            data = yaml.safe_load(p.read_text()) or {}
        except FileNotFoundError:
            raise ConfigError(f"{p}: config file not found") from None
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"{p}: not readable YAML ({str(exc).splitlines()[0]})") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{p}: expected a mapping of keys to values")
        values.update(data)
    values.update({k: v for k, v in (overrides or {}).items() if v is not None})
    known = {f.name: f for f in fields(cls)}  # type: ignore[arg-type]
    defaults = cls()
    kwargs = {}
    for key, value in values.items():
        if key not in known:
            where = f" in {path}" if path else ""
            raise ConfigError(f"unknown config key {key!r}{where} (known: {', '.join(known)})")
        kwargs[key] = _coerce(cls, key, value, getattr(defaults, key))
    cfg = dataclasses.replace(defaults, **kwargs)
    return cfg.validate() if hasattr(cfg, "validate") else cfg


@dataclass
class TrainConfig:
    """Latent-operator training under torchrun (or one plain process)."""

    cache_dir: str = "cache/demo"
    """Latent cache root written by the precompute ({task}_{split}/ folders)."""
    tasks: list[str] = field(default_factory=lambda: ["advection1d"])
    """Tasks whose caches to train on."""
    splits: list[str] = field(default_factory=lambda: ["train"])
    """Splits to train on."""
    steps: int = 50
    """Optimizer steps in total."""
    batch_size: int = 16
    """Pairs (z_t, z_t+1) per rank per step."""
    lr: float = 1e-3
    """AdamW learning rate (cosine decay to 10%)."""
    hidden: int = 64
    """Hidden width of the operator's MLPs."""
    depth: int = 2
    """Mixer blocks."""
    seed: int = 0
    """Model init and sampling seed."""
    device: str = "auto"
    """cpu, cuda or auto (each rank takes cuda:LOCAL_RANK)."""
    preload: str = "auto"
    """ram, disk, or auto (ram when the cache fits in available memory with a 20% margin)."""
    checkpoint_every: int = 25
    """Steps between checkpoints (rank 0, atomic); one more at the end."""
    checkpoint_dir: str | None = None
    """Where checkpoints go; default RUN/checkpoints (or ./checkpoints outside ups)."""
    resume: bool = False
    """Continue from the last checkpoint in checkpoint_dir."""
    max_oom_skips: int = 3
    """Consecutive steps skipped for OOM on any rank before every rank stops."""
    eval_batches: int = 2
    """Batches of held-out pairs evaluated at the end."""
    log_every: int = 10
    """Steps between log lines (rank 0)."""
    wandb_mode: str = "offline"
    """offline, online or disabled (W&B runs on rank 0 only)."""
    wandb_project: str = "ups"
    """W&B project name."""
    heartbeat_interval: float = 1.0
    """Seconds between status record writes."""
    stalled_after: float | None = None
    """No step for this long (heartbeat alive): stalled (waiting in a collective, hung in Python).
    Unset: learned from the run, 5 x each rank's recent p99 step time (at least 10 s), with
    limits of their own for the first step, eval and checkpoint."""
    unresponsive_after: float = 10.0
    """No heartbeat for this long (pid alive): unresponsive."""

    def validate(self) -> TrainConfig:
        _check_tasks_and_splits(self.tasks, self.splits)
        _check(self.steps >= 1, "steps", self.steps, ">= 1")
        _check(self.batch_size >= 1, "batch_size", self.batch_size, ">= 1")
        _check(self.lr > 0, "lr", self.lr, "> 0")
        _check(self.hidden >= 1 and self.depth >= 1, "hidden/depth", (self.hidden, self.depth), ">= 1")
        _check(self.device in ("auto", "cpu", "cuda"), "device", self.device, "cpu, cuda or auto")
        _check(self.preload in ("auto", "ram", "disk"), "preload", self.preload, "auto, ram or disk")
        _check(self.checkpoint_every >= 1, "checkpoint_every", self.checkpoint_every, ">= 1")
        _check(self.max_oom_skips >= 1, "max_oom_skips", self.max_oom_skips, ">= 1")
        _check(self.wandb_mode in ("offline", "online", "disabled"), "wandb_mode", self.wandb_mode, "offline, online or disabled")
        for name in ("heartbeat_interval", "unresponsive_after", *(("stalled_after",) if self.stalled_after is not None else ())):
            _check(getattr(self, name) > 0, name, getattr(self, name), "> 0 seconds")
        return self

    def thresholds(self) -> dict[str, Any]:
        return {
            "heartbeat_interval": self.heartbeat_interval,
            "unresponsive_after": self.unresponsive_after,
            **({"stalled_after": self.stalled_after, "startup_grace": max(30.0, self.stalled_after)}
               if self.stalled_after is not None else {}),
        }


def parse_job_args(cls: type[C], prog: str, argv: list[str] | None) -> C:
    """``--config FILE`` plus ``--set KEY=VALUE`` overrides (values parsed as JSON when they
    parse), as the job entry points take them."""
    import argparse
    import json

    ap = argparse.ArgumentParser(prog=prog, description=(cls.__doc__ or "").strip().splitlines()[0])
    ap.add_argument("--config", help=f"YAML or JSON config file (keys of {cls.__name__})")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override one key")
    args = ap.parse_args(argv)
    overrides: dict[str, Any] = {}
    for kv in args.set:
        key, _, value = kv.partition("=")
        try:
            overrides[key] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key] = value
    return load_config(cls, args.config, overrides)
