"""The hub's runtime is built as the hub starts: its log says which GPUs it has and
whether the engine can give them, before anyone spawns, and the spawners then use
that same runtime.

A real hub (tests/harness.py) with declared GPUs: on the test engine, which has the
FAKE NVIDIA hook, the probe finds the runtime; on a private engine without the hook
(the ``hookless`` fixture, tests/e2e/hookless_engine.py), the hub warns at once.
"""

from __future__ import annotations

import os
import shutil
import time

from hookless_engine import TINY

from harness import ARTIFACTS, Hub, teardown
from spawner.contract import HUB_LABEL
from spawner.docker.engine import PROBE_LABEL

GPUS = [{"uuid": f"GPU-hubstart-{i}", "name": "Fake GPU", "memory": "16G"} for i in range(2)]
BUILT = "Hub runtime of hub "
FOUND = "The Docker engine has an NVIDIA runtime (probe with "
MISSING = "The Docker engine has no NVIDIA runtime, so it cannot give GPUs to containers"


def table(image: str) -> str:
    return f"""\
images:
  pytorch:
    display_name: PyTorch
    image: {image}
roles:
  cpu:
    cpus: 0.5
    memory: 512M
    images: [pytorch]
  gpu:
    cpus: 0.5
    memory: 512M
    gpus: 1
    images: [pytorch]
assignments:
  default: [cpu, gpu]
"""


def wait_for_line(hub: Hub, text: str, timeout: float = 60) -> str:
    """The first line of the hub's log holding ``text``, once there."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [line for line in hub.log().splitlines() if text in line]
        if found:
            return found[0]
        time.sleep(0.2)
    raise AssertionError(f"no {text!r} in the hub's log:\n{hub.log()[-3000:]}")


def position(log: str, text: str) -> int:
    assert text in log, text
    return log.index(text)


def assert_built_at_start_before_any_spawn(hub: Hub, finding: str) -> None:
    line = wait_for_line(hub, finding)
    log = hub.log()
    built = wait_for_line(hub, BUILT)
    assert "built at hub start: 2 GPUs (declared)" in built, built
    assert "the NVIDIA runtime probe is under way" in built
    # the inventory, then the runtime, then the probe's finding: all before any spawn
    assert position(log, "GPU inventory: ") < position(log, BUILT) < position(log, line)
    assert " as role " not in log and "Refused " not in log  # no start was asked for
    assert log.count(BUILT) == 1


def test_the_hub_probes_the_engine_as_it_starts_and_its_spawners_use_that_runtime(
        docker_client, tmp_path):
    prefix = f"qshubstart{os.getpid()}"
    hub_id = f"{prefix}-hub"
    hub = Hub(tmp_path, quota_text=table("quota-spawner/pytorch:latest"), prefix=prefix,
              extra_config=f"c.QuotaSpawner.gpu_inventory = {GPUS!r}\n"
              f"c.QuotaSpawner.hub_id = {hub_id!r}\n")
    try:
        hub.start()
        assert_built_at_start_before_any_spawn(hub, FOUND)
        # this hub's probe is gone; another worker's hub may be probing at this moment
        assert docker_client.containers.list(all=True, filters={
            "label": [PROBE_LABEL, f"{HUB_LABEL}={hub_id}"]}) == []
        # the first spawner (the spawn form) finds the runtime built: no second build
        browser = hub.login("ada")
        page = browser.get(f"{hub.url}/hub/spawn", timeout=60)
        assert page.status_code == 200 and "2 of 2 GPUs free now" in page.text, page.text
        assert hub.log().count(BUILT) == 1, hub.log()[-3000:]
    finally:
        teardown(hub, docker_client, "hub-start")


def test_an_engine_without_the_nvidia_runtime_is_warned_about_at_hub_start(
        hookless, tmp_path):
    hub = Hub(tmp_path, quota_text=table(TINY), prefix=f"qshubstartnv{os.getpid()}",
              network="host", env={"DOCKER_HOST": hookless.host},
              extra_config=f"c.QuotaSpawner.gpu_inventory = {GPUS!r}\n")
    try:
        hub.start()
        assert_built_at_start_before_any_spawn(hub, MISSING)
        warning = wait_for_line(hub, MISSING)
        assert TINY in warning and "NVIDIA Container Toolkit" in warning
        assert hookless.client.containers(all=True, filters={"label": PROBE_LABEL}) == []
    finally:
        hub.stop()
        ARTIFACTS.mkdir(exist_ok=True)
        if hub.log_path.exists():
            shutil.copy(hub.log_path, ARTIFACTS / "hub-hub-start-hookless.log")
