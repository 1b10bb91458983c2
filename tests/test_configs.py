"""Every shipped config loads and validates; bad keys and values are named."""

from pathlib import Path

import pytest

from ups.launch.config import ConfigError, PrecomputeConfig, TrainConfig, load_config

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_configs_validate(path):
    cls = TrainConfig if path.name.startswith("train") else PrecomputeConfig
    cfg = load_config(cls, path)
    assert cfg.validate() is cfg


def test_bad_values_are_named(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("steps: many\n")
    with pytest.raises(ConfigError, match="steps: expected int, got 'many'"):
        load_config(TrainConfig, bad)
    bad.write_text("- a list\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_config(TrainConfig, bad)
    with pytest.raises(ConfigError, match="cache_dtype: 'int8' is not valid"):
        load_config(PrecomputeConfig, None, {"cache_dtype": "int8"})
