"""The user's own ups settings: ``$XDG_CONFIG_HOME/ups/config.toml`` (or ``config.yaml``;
default ``~/.config/ups/``). Today it holds notification defaults and the SMTP server::

    [notify]
    targets = ["https://ntfy.sh/my-runs", "mailto:me@example.org"]   # used when a launch gives no --notify
    min_interval_s = 60          # at most one message per target per minute (a run's end always goes)
    timeout_s = 10               # each delivery's time limit

    [smtp]
    host = "smtp.example.org"
    port = 587
    starttls = true
    user = "me@example.org"
    from = "ups@example.org"
    password_env = "UPS_SMTP_PASSWORD"   # the password only ever comes from this variable

A missing file is an empty config; a broken one is one line naming the file and the problem.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from ups.errors import UpsError


def config_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "ups"


def load_user_config() -> dict[str, Any]:
    folder = config_dir()
    for name in ("config.toml", "config.yaml", "config.yml"):
        path = folder / name
        if not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
            if name.endswith(".toml"):
                if sys.version_info >= (3, 11):
                    import tomllib
                else:  # the same module before it joined the standard library (a 3.10-only dependency)
                    import tomli as tomllib

                data = tomllib.loads(text)
            else:
                import yaml

                data = yaml.safe_load(text) or {}
        except Exception as exc:  # noqa: BLE001 - any parse error is bad input, said in one line
            raise UpsError(f"{path}: not a valid config ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})") from None
        if not isinstance(data, dict):
            raise UpsError(f"{path}: not a valid config (expected a table of settings)")
        for section in ("notify", "smtp"):
            if section in data and not isinstance(data[section], dict):
                raise UpsError(f"{path}: [{section}] must be a table of settings")
        return data
    return {}
