"""End to end: jupyterhub-idle-culler with per-role timeouts, on real servers.

Seconds instead of minutes: the roles' idle_timeout and max_age (8 to 16 s), the culler's
check (every second) and the activity intervals (2 s) are the product's own settings, so
the test waits about half a minute, not the 30 minutes of a real hub. Everything else is
the real thing: the culler as a hub-managed service with its RBAC role, the arbiter hook
reading the quota table, activity from jupyterhub-singleuser and the proxy. The GPU
monitor in the containers reads a FAKE NVML from a mounted folder
(tests/fake_nvml_container/), which the test makes busy or idle.
"""

from __future__ import annotations

import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import hubs
import pytest
import requests
from hubs import ONE_GPU, ONE_GPU_PREFIX, on_hub

from harness import container_for, containers, write_fake_gpus

pytestmark = pytest.mark.e2e

# The shared one-GPU hub's (tests/hubs.py): its prefix, its GPU, the culler's check every
# second (the culler's least), the servers' and the proxy's activity every 2 s, and the GPU
# monitor's busy window
PREFIX, GPU, CULL_EVERY, ACTIVITY = ONE_GPU_PREFIX, ONE_GPU, hubs.CULL_EVERY, hubs.ACTIVITY
BUSY_WINDOW = 4
IDLE = 8  # the short roles' idle_timeout; well above the activity interval and the check
IDLE_LONG = 2 * IDLE  # another role's, to tell the two apart
MAX_AGE = 12
BUSY_FOR = IDLE + 4  # the GPU stays busy this long: well past IDLE, only the busy GPU kept it
SLACK = 8  # for a 2-core machine
SHORT, LONG, GPU_ROLE = f"idle{IDLE}", f"idle{IDLE_LONG}", f"gpu{IDLE}"
QUOTAS = f"""\
images:
  pytorch: {{image: "quota-spawner/pytorch:latest"}}
roles:
  {SHORT}: {{cpus: 0.5, memory: 512M, images: [pytorch], idle_timeout: {IDLE}s}}
  {LONG}: {{cpus: 0.5, memory: 512M, images: [pytorch], idle_timeout: {IDLE_LONG}s}}
  aged: {{cpus: 0.5, memory: 512M, images: [pytorch], idle_timeout: 10m, max_age: {MAX_AGE}s}}
  {GPU_ROLE}: {{cpus: 0.5, memory: 512M, images: [pytorch], idle_timeout: {IDLE}s, gpus: 1}}
assignments:
  default: [{SHORT}, {LONG}, aged, {GPU_ROLE}]
"""


@pytest.fixture(scope="module")
def cull_hub(one_gpu_hub):
    """The session's one-GPU hub, its culler and its FAKE NVML, with this module's table."""
    assert f"--GpuMonitor.busy_window={BUSY_WINDOW}" in hubs.ONE_GPU_MONITOR
    write_fake_gpus(one_gpu_hub.fake_nvml, [{"uuid": GPU, "utilization": 0}])
    with on_hub(one_gpu_hub, QUOTAS):
        yield one_gpu_hub


def assigned_gpus(client, user: str) -> list[str]:
    return container_for(client, user).labels["quota-spawner.gpus"].split(",")


def test_culling_follows_roles_activity_and_busy_gpus(cull_hub, docker_client):
    hub = cull_hub
    roles = {"idle-a": SHORT, "traffic-b": SHORT, "slow-c": LONG, "aged-d": "aged",
             "gpu-e": GPU_ROLE}
    for name in roles:
        hub.create_user(name)
    tokens = {name: hub.user_token(name) for name in ("traffic-b", "aged-d")}
    write_fake_gpus(hub.fake_nvml, [{"uuid": GPU, "utilization": 90}])  # e's GPU is busy

    requested: dict[str, float] = {}  # the server's "started" is no earlier than this
    ready: dict[str, float] = {}  # and its last activity no later than this
    culled: dict[str, float] = {}
    done = threading.Event()

    def browse(name: str) -> None:
        """Proxied traffic, as a browser would make, about every second from the moment
        the server is ready (an IDLE of a few seconds leaves no room to wait for the
        other starts)."""
        while name not in culled and not done.is_set():
            requests.get(f"{hub.url}/user/{name}/api/status", timeout=10,
                         headers={"Authorization": f"token {tokens[name]}"})
            done.wait(1)

    def start(name: str) -> None:
        requested[name] = time.monotonic()
        hub.start_server(name, {"profile": roles[name]})
        ready[name] = time.monotonic()
        if name in tokens:
            threading.Thread(target=browse, args=(name,), daemon=True).start()

    try:
        with ThreadPoolExecutor(len(roles)) as pool:
            list(pool.map(start, roles))
        assert assigned_gpus(docker_client, "gpu-e") == [GPU]

        flipped_idle = None
        t0 = time.monotonic()
        bound = BUSY_FOR + IDLE + BUSY_WINDOW + CULL_EVERY + ACTIVITY + 3 * SLACK
        # until the four that go are gone (traffic-b never is; gpu-e only once idle)
        while time.monotonic() - t0 < bound and len(culled) < 4:
            now = time.monotonic()
            for name in roles:
                if name not in culled and not hub.user(name)["servers"]:
                    culled[name] = now
            if flipped_idle is None and now - t0 >= BUSY_FOR:
                assert "gpu-e" not in culled, "a server with a busy GPU was culled"
                write_fake_gpus(hub.fake_nvml, [{"uuid": GPU, "utilization": 0}])
                flipped_idle = now
            time.sleep(0.5)
    finally:
        done.set()

    log = hub.log()
    missing = set(roles) - {"traffic-b"} - set(culled)
    assert not missing, f"not culled: {missing}\n{log[-3000:]}"
    since_request = {name: round(culled[name] - requested[name], 1) for name in culled}
    since_ready = {name: round(culled[name] - ready[name], 1) for name in culled}
    timing = (since_request, since_ready)
    # Idle for IDLE: culled no sooner, and within IDLE + one check + one activity
    # interval (+ slack for a 2-core machine).
    assert since_request["idle-a"] >= IDLE, timing
    assert since_ready["idle-a"] <= IDLE + CULL_EVERY + ACTIVITY + SLACK, timing
    # The other role's IDLE_LONG holds for its server.
    assert since_request["slow-c"] >= IDLE_LONG, timing
    assert since_ready["slow-c"] <= IDLE_LONG + CULL_EVERY + ACTIVITY + SLACK, timing
    # max_age culls even a server with traffic.
    assert since_request["aged-d"] >= MAX_AGE, timing
    assert since_ready["aged-d"] <= MAX_AGE + CULL_EVERY + SLACK, timing
    # traffic through the proxy keeps an IDLE server alive for the whole run
    assert "traffic-b" not in culled, timing
    # the GPU server lived while busy, and was culled once idle for its IDLE
    assert flipped_idle is not None
    assert IDLE <= culled.get("gpu-e", 999) - flipped_idle <= \
        IDLE + BUSY_WINDOW + CULL_EVERY + ACTIVITY + SLACK

    # Each cull is in the hub's log with user, role, reason and idle time (no less than
    # the role's idle_timeout).
    idle_for = re.search(rf"Culling idle-a \(role {SHORT}\): idle for 00:00:(\d\d)", log)
    assert idle_for and int(idle_for[1]) >= IDLE, log[-3000:]
    assert f"Culling aged-d (role aged): reached max_age 00:00:{MAX_AGE:02d}" in log
    assert f"Culling gpu-e (role {GPU_ROLE}): idle for" in log
    # Container removed, GPU back in the pool, home volume kept.
    assert containers(docker_client, "gpu-e") == []
    assert f"GPU {GPU} released by {PREFIX}-gpu" in log  # the container name, escaped
    assert docker_client.volumes.list(filters={"name": f"{PREFIX}-home-idle"})  # name escaped
    hub.create_user("gpu-next")
    hub.start_server("gpu-next", {"profile": GPU_ROLE})
    assert assigned_gpus(docker_client, "gpu-next") == [GPU]
    for name in ("traffic-b", "gpu-next"):
        hub.stop_server(name)
