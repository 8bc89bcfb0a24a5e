"""End to end: the GPU monitor inside a real notebook container, through the hub's proxy.

The container gets a GPU from a declared fake inventory, and reads a FAKE
pynvml (tests/fake_nvml_container/) from a folder the test mounts first on
its PYTHONPATH, because this machine has no NVML. Everything else is real:
the image's extension, jupyterhub-singleuser, the proxy and the hub.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone

import pytest
import requests
from hubs import GPU_HUB_GPUS, on_hub

from harness import Hub, container_for, exec_text, write_fake_gpus

pytestmark = pytest.mark.e2e

QUOTAS = """\
images:
  pytorch: {image: "quota-spawner/pytorch:latest"}
roles:
  gpu:
    cpus: 0.5
    memory: 512M
    gpus: 1
    gpu_mode: shared
    gpu_share: 2
    gpu_memory: 8G
    images: [pytorch]
assignments:
  default: [gpu]
"""
GPUS = GPU_HUB_GPUS  # the shared hub's two fake GPUs (tests/hubs.py)
GiB = 2**30


def write_state(folder, used: float, utilization: int) -> None:
    """What the fake NVML reports: GPU 0 as given; GPU 1 (not this server's) busy."""
    write_fake_gpus(folder, [
        {"uuid": GPUS[0], "memory": 16 * GiB, "used": int(used * GiB), "utilization": utilization},
        {"uuid": GPUS[1], "memory": 16 * GiB, "used": 15 * GiB, "utilization": 100},
    ])


@pytest.fixture(scope="module")
def mon_hub(gpu_hub):
    """The session's 2-GPU hub, whose containers read the FAKE NVML of
    ``gpu_hub.fake_nvml`` (the monitor reads every 0.5 s, a 3 s busy window), with this
    module's table."""
    write_state(gpu_hub.fake_nvml, used=1, utilization=0)
    with on_hub(gpu_hub, QUOTAS):
        yield gpu_hub


@pytest.fixture(scope="module")
def fake_nvml(mon_hub):
    return mon_hub.fake_nvml


@pytest.fixture(scope="module")
def server(mon_hub):
    name = "gpu-watcher"
    mon_hub.create_user(name)
    mon_hub.start_server(name)
    yield name
    mon_hub.stop_server(name)


def metrics(hub: Hub, name: str, token: str | None, **params) -> requests.Response:
    headers = {"Authorization": f"token {token}"} if token else {}
    return requests.get(f"{hub.url}/user/{name}/api/gpu/metrics", headers=headers,
                        params=params, timeout=30, allow_redirects=False)


def test_metrics_through_the_proxy_need_the_users_token(mon_hub, server, docker_client):
    token = mon_hub.user_token(server)
    r = metrics(mon_hub, server, token)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["status"] == "ok", body
    # Only the GPU the hub assigned, although the fake NVML has two.
    assert [g["uuid"] for g in body["gpus"]] == [GPUS[0]]
    assert body["gpu_memory_limit"] == 8 * GiB  # the role's soft cap
    assert body["gpus"][0]["memory_limit_source"] == "GPU_MEMORY_LIMIT"

    assert metrics(mon_hub, server, None).status_code in (302, 401, 403)
    # Another user's token does not open this server.
    mon_hub.create_user("someone-else")
    other = mon_hub.user_token("someone-else")
    assert metrics(mon_hub, server, other).status_code in (302, 403, 404)

    page = requests.get(f"{mon_hub.url}/user/{server}/gpu", timeout=30,
                        headers={"Authorization": f"token {token}"})
    assert page.status_code == 200 and "GPU usage" in page.text


def test_warning_follows_the_users_cap(mon_hub, server, fake_nvml):
    token = mon_hub.user_token(server)
    write_state(fake_nvml, used=7.5, utilization=0)  # 94% of the 8G cap, 47% of the card
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        body = metrics(mon_hub, server, token).json()
        if body["warning"]:
            break
        time.sleep(0.3)
    assert body["warning"] == "GPU memory at 94% of your 8 GiB limit"
    write_state(fake_nvml, used=1, utilization=0)


def test_busy_gpu_is_reported_to_the_hub_as_activity(mon_hub, server, fake_nvml,
                                                     docker_client):
    token = mon_hub.user_token(server)

    def hub_activity() -> datetime:
        stamp = mon_hub.user(server)["servers"][""]["last_activity"]
        return datetime.fromisoformat(stamp.replace("Z", "+00:00"))

    def server_activity() -> str:
        """The server's own record, what jupyterhub-singleuser reports to the hub
        (/api/status does not count as activity itself)."""
        r = requests.get(f"{mon_hub.url}/user/{server}/api/status", timeout=30,
                         headers={"Authorization": f"token {token}"})
        assert r.status_code == 200, r.text
        return r.json()["last_activity"]

    # Idle GPU: polling the metrics is not activity for the server. (The proxy stamps
    # every request it forwards, and the hub copies that stamp, as documented in
    # docs/culling.md, so the hub's record is not what this step can compare.)
    write_state(fake_nvml, used=1, utilization=0)
    time.sleep(5)
    before = server_activity()
    for _ in range(10):
        assert metrics(mon_hub, server, token).status_code == 200
        time.sleep(0.5)
    assert server_activity() == before
    polled_until = datetime.now(timezone.utc)

    # A busy GPU (90% over the window) is activity: singleuser reports it within its
    # 2 s interval. Nothing goes through the proxy from here on, so only that report
    # can move the hub's record past the last poll.
    write_state(fake_nvml, used=4, utilization=90)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and hub_activity() <= polled_until:
        time.sleep(0.5)
    assert hub_activity() > polled_until
    assert server_activity() != before
    assert metrics(mon_hub, server, token).json()["busy"] is True
    write_state(fake_nvml, used=1, utilization=0)

    c = container_for(docker_client, server)
    code, out = exec_text(c, "jupyter server extension list 2>&1")
    assert "spawner.monitor" in out and "enabled" in out, out


def test_home_page_links_the_gpu_page(mon_hub, server):
    browser = mon_hub.login(server)
    page = browser.get(f"{mon_hub.url}/hub/home", timeout=30).content.decode()
    assert f'href="/user/{server}/gpu"' in page
    assert "GPU usage" in page
