"""``quota-spawner watchdog`` on the command line: a sentence, never a traceback.

A channel URL with a typo, a misconfigured channel or rule, and the hub
stopping its service (SIGINT, then SIGTERM) each end the command with one plain
line and a known exit status. Run as the hub runs it: the installed command, in
a process of its own, with no engine (its socket does not exist) and no hub.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

COMMAND = Path(sys.executable).parent / "quota-spawner"
SECRET = "S3CRETtoken0123456789"
pytestmark = pytest.mark.skipif(not COMMAND.exists(), reason="quota-spawner is not installed")


def environment(tmp_path: Path) -> dict[str, str]:
    """Nothing of a hub: no API, no state folder, no config file; no engine to reach."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("JUPYTERHUB_", "QUOTA_SPAWNER_", "DOCKER_", "KUBECONFIG"))}
    env["DOCKER_HOST"] = f"unix://{tmp_path}/no-engine.sock"
    return env


def watchdog(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(COMMAND), "watchdog", *args], capture_output=True, text=True,
                          env=environment(tmp_path), cwd=tmp_path, timeout=60)


# --- a channel URL with a typo ---------------------------------------------------------------


def test_the_documented_sentences_are_what_the_command_says(tmp_path):
    """docs/watchdog.md#testing-a-channel shows these two."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "watchdog.md").read_text()
    for url in ("jsn://alerts.example.org/hook", "feishu:///SIGNING-SECRET"):
        done = watchdog(tmp_path, f"--test-channel={url}")
        assert f"$ quota-spawner watchdog --test-channel='{url}'\n{done.stderr}" in doc


@pytest.mark.parametrize(("url", "says"), [
    ("jsn://127.0.0.1:9/x", "jsn:// is not a kind of channel apprise or the watchdog knows"),
    ("feishu:///x", "a feishu:// URL needs its bot's token, as in "
                    "feishu://HOOK-TOKEN[/SIGNING-SECRET]"),
    (f"feishu:///{SECRET}", "a feishu:// URL needs its bot's token"),
    (f"dingtalk://{SECRET}@", "a dingtalk:// URL needs its bot's token"),
    (f"json://{SECRET}:{SECRET}@", "apprise does not accept this JSON URL (json://)"),
    (f"jsn://{SECRET}@127.0.0.1/x", "jsn:// is not a kind of channel"),
    (f"feishu://tok/{SECRET}?base=ftp://x", "its base= must be an http(s) URL"),
    (SECRET, "a channel URL has a scheme and ://"),
])
def test_a_channel_url_with_a_typo_is_one_sentence(tmp_path, url, says):
    done = watchdog(tmp_path, f"--test-channel={url}")
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert "Traceback" not in output and SECRET not in output
    assert done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"Cannot test this channel: {says}") and line.endswith(".")


def test_a_misconfigured_channel_in_the_config_file_is_one_sentence(tmp_path):
    config = tmp_path / "watchdog_config.py"
    config.write_text("c = get_config()  # noqa\n"
                      f"c.Notifier.channels = [{{'name': 'ops', 'url': 'feishu:///{SECRET}'}}]\n")
    for args in ([], ["--test-channel=json://127.0.0.1:9/x"]):
        done = watchdog(tmp_path, f"--config-file={config}", *args)
        output = done.stdout + done.stderr
        assert done.returncode == 2, output
        assert "Traceback" not in output and SECRET not in output
        (line,) = done.stderr.splitlines()
        assert line.endswith(
            "QuotaWatchdog] The watchdog does not start: channel ops: a feishu:// URL needs "
            "its bot's token, as in feishu://HOOK-TOKEN[/SIGNING-SECRET]. Fix it in "
            f"{config} or on the command line.")


@pytest.mark.parametrize(("setting", "says"), [
    ("--WatchdogRules.gpu_memory_clear=0.95",
     "gpu_memory_clear (0.95) must not be above gpu_memory_high (0.9)"),
    ("--WatchdogRules.memory_hold=-1", "memory_hold must be 0 or more, not -1.0"),
    ("--WatchdogRules.disabled_rules=['gpu_mem']", "disabled_rules names unknown rules"),
])
def test_a_wrong_rule_is_one_sentence(tmp_path, setting, says):
    done = watchdog(tmp_path, setting)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    (line,) = done.stderr.splitlines()
    assert f"] The watchdog does not start: {says}" in line
    assert line.endswith("Fix it on the command line.")


# --- stopped by the hub -----------------------------------------------------------------------


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name)
def test_a_signal_stops_it_with_one_line(tmp_path, signum):
    """The hub stops its services with SIGINT, then SIGTERM; compose with SIGTERM."""
    log = tmp_path / "stderr"
    with open(log, "w") as sink:
        process = subprocess.Popen(
            [str(COMMAND), "watchdog", "--interval=0.2", "--QuotaWatchdog.metrics_port=0",
             f"--QuotaWatchdog.state_file={tmp_path / 'incidents.json'}"],
            stdout=subprocess.DEVNULL, stderr=sink, env=environment(tmp_path), cwd=tmp_path)
    try:
        # cycles run (and fail: no engine) until the signal
        deadline = time.monotonic() + 30
        while "Cannot reach the engine" not in log.read_text():
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        time.sleep(0.5)  # a few more cycles
        process.send_signal(signum)
        process.wait(timeout=20)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    stderr = log.read_text()
    assert process.returncode == 0, stderr
    assert "Traceback" not in stderr and "CancelledError" not in stderr
    assert "KeyboardInterrupt" not in stderr
    assert stderr.count("Cannot reach the engine at") == 1  # said once, not every cycle
    assert stderr.rstrip().endswith(f"QuotaWatchdog] Watchdog stopped ({signum.name})")
