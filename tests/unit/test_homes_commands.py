"""The one runner of the homes' commands: what it returns, and the error that names the
command, its exit code and its stderr (spawner/homes/commands.py)."""

from __future__ import annotations

import pytest

from spawner.homes.commands import CommandError, CommandRunner
from spawner.homes.errors import HomeError


def test_stdout_comes_back_in_the_c_locale():
    assert CommandRunner()(["sh", "-c", 'echo "$LC_ALL $LANG"']) == "C C\n"


def test_a_failure_names_the_command_its_exit_code_and_its_stderr():
    with pytest.raises(CommandError) as failed:
        CommandRunner()(["sh", "-c", "echo out; echo 'ERROR: no room' >&2; exit 3"])
    assert isinstance(failed.value, HomeError)
    assert str(failed.value) == ("`sh -c 'echo out; echo '\"'\"'ERROR: no room'\"'\"' >&2; "
                                 "exit 3'` failed with exit code 3: ERROR: no room")
    assert (failed.value.returncode, failed.value.stderr) == (3, "ERROR: no room\n")


def test_exit_codes_that_mean_success_are_given():
    assert CommandRunner()(["sh", "-c", "echo fixed; exit 1"], ok=(0, 1)) == "fixed\n"


def test_a_long_stderr_keeps_its_end():
    with pytest.raises(CommandError) as failed:
        CommandRunner()(["sh", "-c", "yes noise | head -c 5000 >&2; echo THE REASON >&2; "
                         "exit 1"])
    assert str(failed.value).endswith("THE REASON") and len(str(failed.value)) < 800


def test_a_command_past_its_time_is_stopped_and_said_so():
    with pytest.raises(CommandError, match=r"^`sleep 5` timed out after 0.2 s$") as failed:
        CommandRunner(timeout=0.2)(["sleep", "5"])
    assert failed.value.returncode is None


def test_a_missing_tool_is_named():
    with pytest.raises(CommandError, match="could not run: no-such-tool-x is not installed"):
        CommandRunner()(["no-such-tool-x", "--version"])
