from helpers import run_ups


def test_help_lists_core_commands():
    res = run_ups("--help")
    assert res.returncode == 0
    for cmd in ("runs", "status", "kill", "stacks", "logs"):
        assert cmd in res.stdout
