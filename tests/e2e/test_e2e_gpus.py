"""End to end: GPU assignment through a real hub, proxy and dockerd.

The machine has no GPU, so two things are fake, both at the boundary: the
inventory is declared in the hub config (fake UUIDs), and the test engine
carries the fake NVIDIA hook (scripts/test-dockerd.sh), so containers with
DeviceRequests really start. Assertions are on `docker inspect` and on
NVIDIA_VISIBLE_DEVICES in the container's /proc/1/environ, which dockerd's
nvidia driver writes from the DeviceRequests.
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from hubs import gpu_names, on_hub

from harness import (
    Hub,
    container_for,
    containers,
    exec_text,
    gpu_inventory_config,
    teardown,
)
from spawner.contract import CAP_VARIABLES

pytestmark = pytest.mark.e2e
GiB = 2**30

GPU_QUOTAS = """\
images:
  pytorch:
    display_name: PyTorch
    image: quota-spawner/pytorch:latest
  bare:
    display_name: The local base, which has no Jupyter server
    image: quota-spawner/base:local
roles:
  cpu:
    cpus: 0.5
    memory: 512M
    images: [pytorch]
  excl:
    description: One whole GPU
    cpus: 0.5
    memory: 512M
    gpus: 1
    queue_timeout: 0  # refused at once, as these tests expect
    images: [pytorch]
  shared:
    cpus: 0.5
    memory: 512M
    gpus: 1
    gpu_mode: shared
    gpu_share: 3
    gpu_memory: 4G
    queue_timeout: 0
    images: [pytorch]
  broken:
    description: Its container cannot start
    cpus: 0.5
    memory: 512M
    gpus: 1
    queue_timeout: 0
    images: [bare]
assignments:
  default: [cpu, excl, shared, broken]
  groups:
    gpu-only: [excl]
"""

# A FAKE torch for the memory-cap hook: records the calls the hook makes.
FAKE_TORCH = """mkdir -p /tmp/faketorch/torch && cat > /tmp/faketorch/torch/__init__.py <<'END'
class _Props:
    total_memory = 16 * 2**30
class cuda:
    queued, fractions = [], {}
    _lazy_call = staticmethod(lambda fn: cuda.queued.append(fn))
    device_count = staticmethod(lambda: 1)
    get_device_properties = staticmethod(lambda i: _Props())
    set_per_process_memory_fraction = staticmethod(lambda f, d: cuda.fractions.update({d: f}))
END
"""
EXCL = {"profile": "excl"}
SHARED = {"profile": "shared"}
CPU = {"profile": "cpu"}


@pytest.fixture(scope="module")
def hub4(docker_client, tmp_path_factory):
    """4 fake GPUs: this module's own hub (the shared ones have 1 and 2)."""
    prefix = "qsgpu4"
    hub = Hub(
        tmp_path_factory.mktemp(prefix), quota_text=GPU_QUOTAS, prefix=prefix,
        extra_config=gpu_inventory_config(gpu_names(prefix, 4))
        + "c.QuotaSpawner.gpu_sync_interval = 1\n")
    hub.gpus = gpu_names(prefix, 4)
    hub.start()
    yield hub
    teardown(hub, docker_client, "gpus4")


@pytest.fixture(scope="module")
def hub2(gpu_hub):
    """The session's 2-GPU hub (tests/hubs.py: GPU checks every second, a zombie stopped
    after 10 s, servers kept over a restart) with this module's table."""
    with on_hub(gpu_hub, GPU_QUOTAS):
        yield gpu_hub


def users(hub: Hub, base: str, n: int, groups: list[str] = ()) -> list[str]:
    names = [f"{base}{i}" for i in range(n)]
    for name in names:
        hub.create_user(name, list(groups))
    return names


def stop_all(hub: Hub, names: list[str]) -> None:
    hub.stop_servers(names)


def environ(container) -> dict[str, str]:
    """PID 1's environment: where the nvidia driver's NVIDIA_VISIBLE_DEVICES lands."""
    code, out = exec_text(container, "tr '\\0' '\\n' < /proc/1/environ")
    assert code == 0, out
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def gpus_of(container) -> list[str]:
    container.reload()
    label = container.labels["quota-spawner.gpus"]
    requests_ = container.attrs["HostConfig"]["DeviceRequests"] or []
    ids = [i for r in requests_ for i in r["DeviceIDs"] or []]
    assert ids == (label.split(",") if label else []), (label, requests_)
    return ids


def held(docker_client, hub: Hub) -> list[str]:
    """Every GPU UUID on a running container of this hub (duplicates kept)."""
    running = docker_client.containers.list(filters={"name": f"{hub.prefix}-"})
    return [u for c in running for u in gpus_of(c) if c.name.startswith(f"{hub.prefix}-")]


def refused(r: requests.Response) -> str:
    assert r.status_code == 503, f"{r.status_code} {r.text}"
    return r.json()["message"]


# --- the container ------------------------------------------------------------


def test_exclusive_gpu_reaches_the_container(hub4, docker_client):
    [name] = users(hub4, "solo", 1)
    events: list[dict] = []
    spawn = threading.Thread(target=lambda: hub4.start_server(name, EXCL))
    spawn.start()
    # The progress stream while the spawn is pending shows the GPU step.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not hub4.user(name)["servers"]:
        time.sleep(0.05)
    with hub4.api("GET", f"/users/{name}/server/progress", stream=True) as r:
        for line in r.iter_lines(decode_unicode=True):
            if line.startswith("data:"):
                events.append(json.loads(line[5:]))
                if events[-1].get("ready") or events[-1].get("failed"):
                    break
    spawn.join()
    try:
        c = container_for(docker_client, name)
        [uuid] = gpus_of(c)
        assert uuid in hub4.gpus
        [req] = c.attrs["HostConfig"]["DeviceRequests"]
        assert req["Driver"] == "nvidia"
        assert req["DeviceIDs"] == [uuid]
        assert req["Capabilities"] == [["gpu"]]
        assert req["Count"] == 0  # never a count: that would mean GPUs 0..N-1
        assert c.labels["quota-spawner.gpu-mode"] == "exclusive"
        assert c.labels["quota-spawner.hub"].startswith(hub4.prefix + "-")  # this hub's own id
        env = environ(c)
        assert env["NVIDIA_VISIBLE_DEVICES"] == uuid
        assert not any(var in env for var in CAP_VARIABLES)  # exclusive: the whole GPU
        messages = [e.get("message", "") for e in events]
        assert f"GPU {uuid} assigned (exclusive)" in messages, messages
    finally:
        stop_all(hub4, [name])


def test_shared_mode_packs_and_caps(hub4, docker_client):
    names = users(hub4, "share", 4)
    try:
        for name in names:
            hub4.start_server(name, SHARED)
        placed = [gpus_of(container_for(docker_client, n)) for n in names]
        assert placed[0] == placed[1] == placed[2]  # three on one GPU (gpu_share 3)
        assert placed[3] != placed[0]  # the fourth on the next
        c = container_for(docker_client, names[0])
        assert c.labels["quota-spawner.gpu-mode"] == "shared:3"
        env = environ(c)
        assert env["NVIDIA_VISIBLE_DEVICES"] == placed[0][0]
        assert env["GPU_MEMORY_LIMIT"] == str(4 * GiB)
        assert env["FLAGS_gpu_memory_limit_mb"] == "4096"
        assert env["FLAGS_allocator_strategy"] == "auto_growth"
        assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.250"  # 4G of a 16G card
        assert env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
        assert env["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"
        # The image's .pth hook caps torch when it is imported. torch cannot use
        # CUDA here, so a FAKE torch records what the hook asks of torch.cuda.
        code, out = exec_text(c, FAKE_TORCH + "PYTHONPATH=/tmp/faketorch python -c "
                                 "'import torch; [f() for f in torch.cuda.queued]; "
                                 "print(torch.cuda.fractions)'")
        assert code == 0 and out.strip() == "{0: 0.25}", out  # 4G of a 16G card
        # An exclusive user never lands on a GPU that is being shared.
        [excl] = users(hub4, "excl-next-to-shared", 1)
        hub4.start_server(excl, EXCL)
        [mine] = gpus_of(container_for(docker_client, excl))
        assert mine not in {p[0] for p in placed}
        stop_all(hub4, [excl])
    finally:
        stop_all(hub4, names)


def test_role_change_leaves_no_gpu_settings_behind(hub4, docker_client):
    [name] = users(hub4, "changer", 1)
    try:
        hub4.start_server(name, SHARED)
        assert "GPU_MEMORY_LIMIT" in environ(container_for(docker_client, name))
        hub4.stop_server(name)

        hub4.start_server(name, CPU)
        c = container_for(docker_client, name)
        assert gpus_of(c) == []
        assert not c.attrs["HostConfig"]["DeviceRequests"]
        assert c.labels["quota-spawner.gpu-mode"] == ""
        env = environ(c)
        assert env["NVIDIA_VISIBLE_DEVICES"] == "void"
        assert not any(var in env for var in CAP_VARIABLES)
        hub4.stop_server(name)

        hub4.start_server(name, EXCL)
        env = environ(container_for(docker_client, name))
        assert env["NVIDIA_VISIBLE_DEVICES"].startswith("GPU-")
        assert not any(var in env for var in CAP_VARIABLES)
    finally:
        stop_all(hub4, [name])


def test_spawn_form_shows_gpus(hub4, docker_client):
    [name] = users(hub4, "former", 1)
    [holder] = users(hub4, "holder", 1)
    try:
        hub4.start_server(holder, EXCL)
        page = hub4.login(name).get(f"{hub4.url}/hub/spawn/{name}", timeout=30).content.decode()
        assert "1 GPU, exclusive" in page
        assert "3 of 4 GPUs free now" in page
        assert "1 GPU, shared by up to 3 · 4 GiB GPU memory cap" in page
        assert "room on 3 of 4 GPUs now" in page
    finally:
        stop_all(hub4, [holder])


# --- never twice ----------------------------------------------------------------


def test_exclusive_exhaustion_refuses_and_leaks_nothing(hub2, docker_client):
    a, b, c = users(hub2, "ex", 3)
    [gpu_only] = users(hub2, "gpuonly", 1, ["gpu-only"])
    try:
        hub2.start_servers({a: EXCL, b: EXCL})
        assert sorted(held(docker_client, hub2)) == sorted(hub2.gpus)

        message = refused(hub2.spawn(c, EXCL))
        assert "No GPU is free for the role 'excl'" in message
        assert "this hub has 2 GPUs and 2 are held (2 exclusively, 0 shared)" in message
        assert "CPU-only server now with the role 'cpu'" in message
        assert "no CPU-only role" in refused(hub2.spawn(gpu_only))
        # Nothing created, nothing held, no server left pending.
        assert containers(docker_client, c) == []
        assert containers(docker_client, gpu_only) == []
        assert hub2.user(c)["servers"] == {}
        # A CPU role still starts while every GPU is taken.
        hub2.start_server(c, CPU)
        assert gpus_of(container_for(docker_client, c)) == []
        hub2.stop_server(c)

        [freed] = gpus_of(container_for(docker_client, a))
        hub2.stop_server(a)
        hub2.start_server(c, EXCL)
        assert gpus_of(container_for(docker_client, c)) == [freed]
    finally:
        stop_all(hub2, [a, b, c, gpu_only])


def test_simultaneous_starts_never_double_book(hub2, docker_client):
    """Five exclusive starts at once for two GPUs: exactly two start, each on its own GPU,
    and three are refused. The storm itself (rounds of 12 starts on 4 GPUs), a
    measurement, is bench/storm_bench.py's."""
    names = users(hub2, "burst", 5)
    try:
        with ThreadPoolExecutor(len(names)) as pool:
            responses = list(pool.map(lambda n: hub2.spawn(n, EXCL), names))
        codes = sorted(r.status_code for r in responses)
        started = [n for n, r in zip(names, responses, strict=True) if r.status_code in (201, 202)]
        assert len(started) == 2, codes
        assert codes.count(503) == 3, codes
        for name in started:
            hub2.wait_ready(name)
        uuids = held(docker_client, hub2)
        assert sorted(uuids) == sorted(hub2.gpus), uuids
    finally:
        stop_all(hub2, names)


def test_failed_start_releases_its_gpu(hub2, docker_client):
    a, b, c = users(hub2, "fail", 3)
    try:
        r = hub2.spawn(a, {"profile": "broken"})
        assert r.status_code >= 500, r.text  # no jupyterhub-singleuser in that image
        hub2.wait_stopped(a, timeout=30)
        assert "the start failed" in hub2.log()
        # Both GPUs are free again.
        hub2.start_server(b, EXCL)
        hub2.start_server(c, EXCL)
        assert sorted(held(docker_client, hub2)) == sorted(hub2.gpus)
    finally:
        stop_all(hub2, [a, b, c])


def test_killed_container_frees_its_gpu(hub2, docker_client):
    a, b, c = users(hub2, "kill", 3)
    try:
        hub2.start_servers({a: EXCL, b: EXCL})
        [gpu_a] = gpus_of(container_for(docker_client, a))
        [gpu_b] = gpus_of(container_for(docker_client, b))
        container_for(docker_client, a).kill()  # behind the hub's back
        hub2.wait_stopped(a, timeout=30)  # the hub's poll (every 1 s here) noticed
        hub2.start_server(c, EXCL)
        assert gpus_of(container_for(docker_client, c)) == [gpu_a]

        container_for(docker_client, b).remove(force=True)  # `docker rm -f`
        hub2.wait_stopped(b, timeout=30)
        hub2.start_server(a, EXCL)  # c still holds gpu_a
        assert gpus_of(container_for(docker_client, a)) == [gpu_b]
        assert "released" in hub2.log()
    finally:
        stop_all(hub2, [a, b, c])


def test_hub_restart_rebuilds_holdings_and_stops_zombies(hub2, docker_client):
    a, b, c, d = users(hub2, "restart", 4)
    zombie = None
    try:
        hub2.start_server(a, EXCL)
        # No options: the role resolved at start is what the API (and the culler) see.
        assert hub2.start_server(d)["user_options"] == {"profile": "cpu", "image": "pytorch"}
        [gpu_a] = gpus_of(container_for(docker_client, a))
        hub_id = container_for(docker_client, a).labels["quota-spawner.hub"]
        hub2.stop()
        # While the hub is down, a container with this hub's labels appears that
        # the hub never started (e.g. left over from a hub whose database was lost).
        [gpu_z] = [g for g in hub2.gpus if g != gpu_a]
        zombie = docker_client.containers.run(
            "quota-spawner/pytorch:latest", ["sleep", "600"], detach=True,
            name=f"{hub2.prefix}-zombie", user="1000",
            labels={"quota-spawner.user": "ghost", "quota-spawner.hub": hub_id,
                    "quota-spawner.gpus": gpu_z, "quota-spawner.gpu-mode": "exclusive"},
        )
        hub2.start()
        assert hub2.user(a)["servers"][""]["ready"]  # a's server survived the restart
        # d's role survives the restart too (kept in the spawner's state).
        assert hub2.user(d)["servers"][""]["user_options"]["profile"] == "cpu"

        # Both GPUs are held: a's (rebuilt from its labels) and the zombie's.
        message = refused(hub2.spawn(b, EXCL))
        assert "2 are held" in message
        assert "no server of this hub claims it" in hub2.log()

        # After the grace period (10 s here) the zombie is stopped and its GPU
        # returns; a's GPU is still never handed out twice.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and containers(docker_client, "ghost"):
            time.sleep(0.5)
        assert containers(docker_client, "ghost") == [], hub2.log()[-2000:]
        zombie = None
        hub2.start_server(b, EXCL)
        assert gpus_of(container_for(docker_client, b)) == [gpu_z]
        refused(hub2.spawn(c, EXCL))
        assert sorted(held(docker_client, hub2)) == sorted(hub2.gpus)
        # a's own server is claimed, so it was never treated as a zombie.
        assert gpus_of(container_for(docker_client, a)) == [gpu_a]
    finally:
        if zombie is not None:
            zombie.remove(force=True)
        stop_all(hub2, [a, b, c, d])
