"""End to end: jupyterhub-idle-culler with per-role timeouts, on real servers.

Short timeouts (20–40 s) instead of 30 minutes; everything else is the real
thing: the culler as a hub-managed service with its RBAC role, the arbiter
hook reading the quota table, activity from jupyterhub-singleuser and the
proxy. The GPU monitor in the containers reads a FAKE NVML from a mounted
folder (tests/fake_nvml_container/), which the test makes busy or idle.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from harness import (
    Hub,
    container_for,
    containers,
    fake_nvml_config,
    install_fake_nvml,
    teardown,
    write_fake_gpus,
)

pytestmark = pytest.mark.e2e

PREFIX = "qscull"
GPU = f"GPU-{PREFIX}-0"
CULL_EVERY = 3
ACTIVITY = 2  # seconds: the servers' and the hub's activity intervals here
QUOTAS = """\
images:
  pytorch: {image: "quota-spawner/pytorch:latest"}
roles:
  idle20: {cpus: 0.5, memory: 512M, images: [pytorch], idle_timeout: 20s}
  idle40: {cpus: 0.5, memory: 512M, images: [pytorch], idle_timeout: 40s}
  aged: {cpus: 0.5, memory: 512M, images: [pytorch], idle_timeout: 10m, max_age: 30s}
  gpu20: {cpus: 0.5, memory: 512M, images: [pytorch], idle_timeout: 20s, gpus: 1}
assignments:
  default: [idle20, idle40, aged, gpu20]
"""


@pytest.fixture(scope="module")
def cull_hub(docker_client, tmp_path_factory):
    fake = install_fake_nvml(tmp_path_factory.mktemp("fake-nvml-cull"))
    write_fake_gpus(fake, [{"uuid": GPU, "utilization": 0}])
    monitor = ("--GpuMonitor.interval=0.5", "--GpuMonitor.busy_window=4")
    hub = Hub(tmp_path_factory.mktemp("cullhub"), quota_text=QUOTAS, prefix=PREFIX,
              extra_config=fake_nvml_config(fake, PREFIX, ACTIVITY, monitor) + f"""
from spawner.hubconfig.culling import culler_service
culler, culler_role = culler_service(c.QuotaSpawner.quota_file, timeout=600,
                                     cull_every={CULL_EVERY})
c.JupyterHub.services.append(culler)
c.JupyterHub.load_roles.append(culler_role)
c.JupyterHub.last_activity_interval = {ACTIVITY}
c.QuotaSpawner.gpu_inventory = [{{"uuid": {GPU!r}, "memory": "16G"}}]
""").start()
    hub.fake_nvml = fake
    yield hub
    teardown(hub, docker_client, "culling")


def assigned_gpus(client, user: str) -> list[str]:
    return container_for(client, user).labels["quota-spawner.gpus"].split(",")


def test_culling_follows_roles_activity_and_busy_gpus(cull_hub, docker_client):
    hub = cull_hub
    roles = {"idle-a": "idle20", "traffic-b": "idle20", "slow-c": "idle40", "aged-d": "aged",
             "gpu-e": "gpu20"}
    for name in roles:
        hub.create_user(name)
    tokens = {name: hub.user_token(name) for name in ("traffic-b", "aged-d")}
    write_fake_gpus(hub.fake_nvml, [{"uuid": GPU, "utilization": 90}])  # e's GPU is busy

    requested: dict[str, float] = {}  # the server's "started" is no earlier than this
    ready: dict[str, float] = {}  # and its last activity no later than this

    def start(name: str) -> None:
        requested[name] = time.monotonic()
        hub.start_server(name, {"profile": roles[name]})
        ready[name] = time.monotonic()

    with ThreadPoolExecutor(len(roles)) as pool:
        list(pool.map(start, roles))
    assert assigned_gpus(docker_client, "gpu-e") == [GPU]

    culled: dict[str, float] = {}
    flipped_idle = None
    t0 = time.monotonic()
    while time.monotonic() - t0 < 95 and len(culled) < 4 + (flipped_idle is not None):
        now = time.monotonic()
        for name in ("traffic-b", "aged-d"):  # proxied traffic, as a browser would make
            if name not in culled:
                requests.get(f"{hub.url}/user/{name}/api/status", timeout=10,
                             headers={"Authorization": f"token {tokens[name]}"})
        for name in roles:
            if name not in culled and not hub.user(name)["servers"]:
                culled[name] = now
        if flipped_idle is None and now - t0 >= 45:
            assert "gpu-e" not in culled, "a server with a busy GPU was culled"
            write_fake_gpus(hub.fake_nvml, [{"uuid": GPU, "utilization": 0}])
            flipped_idle = now
        time.sleep(1)

    log = hub.log()
    missing = set(roles) - {"traffic-b"} - set(culled)
    assert not missing, f"not culled: {missing}\n{log[-3000:]}"
    since_request = {name: round(culled[name] - requested[name], 1) for name in culled}
    since_ready = {name: round(culled[name] - ready[name], 1) for name in culled}
    timing = (since_request, since_ready)
    # Idle for 20 s: culled no sooner, and within 20 s + one check + one activity
    # interval (+ slack for a 2-core machine).
    assert since_request["idle-a"] >= 20, timing
    assert since_ready["idle-a"] <= 20 + CULL_EVERY + ACTIVITY + 8, timing
    # The other role's 40 s holds for its server.
    assert since_request["slow-c"] >= 40, timing
    assert since_ready["slow-c"] <= 40 + CULL_EVERY + ACTIVITY + 8, timing
    # max_age 30 s culls even a server with traffic.
    assert since_request["aged-d"] >= 30, timing
    assert since_ready["aged-d"] <= 30 + CULL_EVERY + 8, timing
    # traffic through the proxy keeps a 20 s server alive for the whole run
    assert "traffic-b" not in culled, timing
    # the GPU server lived while busy, and was culled once idle for its 20 s
    assert flipped_idle is not None
    assert 20 <= culled.get("gpu-e", 999) - flipped_idle <= 20 + 4 + CULL_EVERY + ACTIVITY + 8

    # Each cull is in the hub's log with user, role, reason and idle time.
    assert "Culling idle-a (role idle20): idle for 00:00:2" in log
    assert "Culling aged-d (role aged): reached max_age 00:00:30" in log
    assert "Culling gpu-e (role gpu20): idle for" in log
    # Container removed, GPU back in the pool, home volume kept.
    assert containers(docker_client, "gpu-e") == []
    assert f"GPU {GPU} released by {PREFIX}-gpu" in log  # the container name, escaped
    assert docker_client.volumes.list(filters={"name": f"{PREFIX}-home-idle"})  # name escaped
    hub.create_user("gpu-next")
    hub.start_server("gpu-next", {"profile": "gpu20"})
    assert assigned_gpus(docker_client, "gpu-next") == [GPU]
    for name in ("traffic-b", "gpu-next"):
        hub.stop_server(name)
