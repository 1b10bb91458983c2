import pytest
from helpers import run_ups

pytestmark = pytest.mark.notorch  # also run on each other Python, without torch (tests/test_pythons.py)


def test_help_lists_core_commands():
    res = run_ups("--help")
    assert res.returncode == 0
    for cmd in ("runs", "status", "kill", "stacks", "logs"):
        assert cmd in res.stdout
