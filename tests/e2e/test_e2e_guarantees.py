"""Guarantees that no configuration can undo, on a real hub and dockerd.

A hostile hub config (group overrides, a pre_spawn_hook, ``remove=False``,
traits set to absurd values) either gets a container with every limit and
all the hardening, or a refusal that names the setting in the log, a plain
sentence for the user, and no container.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from harness import Hub, cleanup, container_for, containers, exec_text
from spawner.policy.refusals import SETTING_REFUSED as USER_MESSAGE
from spawner.policy.refusals import TABLE_BROKEN

pytestmark = pytest.mark.e2e
MiB, GiB = 2**20, 2**30
# the same on every pytest-xdist worker (it is in test ids, which the workers must agree
# on), and one run's own, so that two runs on one engine never share it
PREFIX = f"qsguard{os.environ.get('PYTEST_XDIST_TESTRUNUID', str(os.getpid()))[:8]}"
TEST_SOCKET_DIR = "/run/quota-spawner-test"  # the test engine's own socket folder

QUOTAS = """\
images:
  pytorch: {image: "quota-spawner/pytorch:latest"}
roles:
  small: {cpus: 0.5, memory: 512M, pids: 300, images: [pytorch]}
  big: {cpus: 1, memory: 1G, shm: 256M, images: [pytorch]}
  giant: {cpus: 1000, memory: 16T, images: [pytorch]}
assignments:
  default: [small, big]
"""


def hostile_config(links: Path) -> str:
    """Every kind of override a config can make, chosen per user by group or name."""
    overrides = {
        "ov-privileged": {"extra_host_config": {"privileged": True, "cap_add": ["SYS_ADMIN"]}},
        "ov-weaken": {"extra_host_config": {"pid_mode": "host", "mem_limit": "8g",
                                            "cpu_quota": 1600000},
                      "extra_create_kwargs": {"user": "0"}},
        "ov-raw-host-config": {"extra_create_kwargs": {"host_config": {"Privileged": True}}},
        "ov-gpu-env": {"extra_create_kwargs": {"environment": {"NVIDIA_VISIBLE_DEVICES": "all"}}},
        "ov-env-trait": {"environment": {"NVIDIA_VISIBLE_DEVICES": "all"}},
        "ov-devices": {"extra_host_config": {"devices": ["/dev/fuse:/dev/fuse:rwm"],
                                             "device_cgroup_rules": ["c 10:229 rwm"]}},
        "ov-runtime": {"extra_host_config": {"runtime": "sysbox-runc"}},
        "ov-ns": {"extra_host_config": {"ipc_mode": "host", "userns_mode": "host"}},
        "ov-root": {"notebook_user": "0"},
        "ov-no-pids": {"pids_limit": -1},
        "ov-label": {"extra_labels": {"quota-spawner.gpus": ""}},
        "ov-traits": {"mem_limit": "64G", "cpu_limit": 16.0, "image": "busybox:latest"},
        "ov-network": {"network_name": "host"},
        "ov-publish": {"use_internal_ip": False, "host_ip": "0.0.0.0"},
        # the Docker socket, every way round
        "sock-dot": {"volumes": {"/var/run/docker.sock/.": "/x"}},
        "sock-ro": {"read_only_volumes": {"/var/run": "/host-run"}},
        "sock-root": {"volumes": {"/": "/host"}},
        "sock-containerd": {"volumes": {"/run/containerd/containerd.sock": "/c.sock"}},
        "sock-podman": {"volumes": {"/run/podman/podman.sock": "/p.sock"}},
        "sock-mounts": {"mounts": [{"type": "bind", "source": "/var/run", "target": "/r"}]},
        "sock-binds": {"extra_host_config": {"binds": ["/var/run/../run/docker.sock:/d.sock"]}},
        "sock-volumes-from": {"extra_host_config": {"volumes_from": ["some-hub"]}},
        "sock-symlink": {"volumes": {str(links / "engine.sock"): "/x.sock"}},
        "sock-folder-symlink": {"volumes": {str(links / "engine-dir"): "/x"}},
        "sock-bind-volume": {"volumes": {f"{PREFIX}-evil": "/evil"}},
        "sock-bind-volume-run": {"volumes": {f"{PREFIX}-evil-run": "/evil"}},
    }
    group_overrides = {
        f"{i:02d}-{group}": {"groups": [group], "spawner_override": override}
        for i, (group, override) in enumerate(overrides.items())
    }
    return f"""
c.QuotaSpawner.remove = False
c.QuotaSpawner.group_overrides = {group_overrides!r}
# What an admin may add keeps working.
c.QuotaSpawner.extra_host_config = {{"dns_search": ["lab.example"]}}
c.QuotaSpawner.extra_create_kwargs = {{"labels": {{"lab.example/cost-centre": "42"}}}}
c.QuotaSpawner.extra_labels = {{"lab.example/team": "ml"}}
c.QuotaSpawner.environment = {{"TZ": "UTC"}}

def hook(spawner):
    name = spawner.user.name
    if name.startswith("hook-empty"):
        spawner.extra_create_kwargs = {{}}
        spawner.extra_host_config = {{}}
        spawner.extra_labels = {{}}
    elif name.startswith("hook-priv"):
        spawner.extra_host_config = {{"privileged": True}}
    elif name.startswith("hook-remove"):
        spawner.remove = False

c.Spawner.pre_spawn_hook = hook
"""


@pytest.fixture(scope="module")
def links(tmp_path_factory):
    folder = tmp_path_factory.mktemp("links")
    (folder / "engine.sock").symlink_to(f"{TEST_SOCKET_DIR}/docker.sock")
    (folder / "engine-dir").symlink_to(TEST_SOCKET_DIR)
    return folder


@pytest.fixture(scope="module")
def hostile(docker_client, tmp_path_factory, links):
    for name, device in ((f"{PREFIX}-evil", TEST_SOCKET_DIR), (f"{PREFIX}-evil-run", "/var/run")):
        docker_client.volumes.create(name, driver="local", driver_opts={
            "type": "none", "o": "bind", "device": device})
    hub = Hub(tmp_path_factory.mktemp("hostile"), QUOTAS, prefix=PREFIX,
              extra_config=hostile_config(links))
    try:  # the volumes go even when the hub does not start
        yield hub.start()
    finally:
        hub.stop()
        cleanup(docker_client, PREFIX)
        for name in (f"{PREFIX}-evil", f"{PREFIX}-evil-run"):
            docker_client.volumes.get(name).remove(force=True)


def refused(hub: Hub, docker_client, name: str, groups: list[str] = ()) -> str:
    """Start, expect the plain refusal and no container; return the hub log's reason."""
    hub.create_user(name, list(groups))
    before = len(hub.log())
    r = hub.spawn(name, {"profile": "big"})  # big sets no pids: the default applies
    assert r.status_code == 500, r.text
    assert r.json()["message"] == USER_MESSAGE
    assert hub.user(name)["servers"] == {}
    assert containers(docker_client, name) == []
    log = hub.log()[before:]
    assert "Refused to create a container for" in log
    return log


@pytest.mark.parametrize("group, setting", [
    ("ov-privileged", "extra_host_config['privileged']"),
    ("ov-privileged", "extra_host_config['cap_add']"),
    ("ov-weaken", "extra_host_config['pid_mode']"),
    ("ov-weaken", "extra_host_config['mem_limit']"),
    ("ov-weaken", "extra_host_config['cpu_quota']"),
    ("ov-weaken", "extra_create_kwargs['user']"),
    ("ov-raw-host-config", "extra_create_kwargs['host_config']"),
    ("ov-gpu-env", "extra_create_kwargs['environment']['NVIDIA_VISIBLE_DEVICES']"),
    ("ov-env-trait", "environment['NVIDIA_VISIBLE_DEVICES']"),
    ("ov-devices", "extra_host_config['devices']"),
    ("ov-runtime", "extra_host_config['runtime']"),
    ("ov-ns", "extra_host_config['ipc_mode']"),
    ("ov-root", "the container user is '0'"),
    ("ov-no-pids", "the pids limit is -1"),
    ("ov-label", "extra_labels['quota-spawner.gpus']"),
    ("ov-network", "network_name = 'host' is refused"),
    ("ov-publish", "publishes 8888/tcp on 0.0.0.0"),
])
def test_weakening_overrides_are_refused_by_name(hostile, docker_client, group, setting):
    log = refused(hostile, docker_client, f"{group}-{len(setting)}", [group])
    assert setting in log, log[-2000:]


@pytest.mark.parametrize("group, words", [
    ("sock-dot", "'/var/run/docker.sock/.'"),
    ("sock-ro", "'/var/run' at '/host-run'"),
    ("sock-root", "mounts '/' at '/host'"),
    ("sock-containerd", "'/run/containerd/containerd.sock'"),
    ("sock-podman", "'/run/podman/podman.sock'"),
    ("sock-mounts", "Mounts mounts '/var/run'"),
    ("sock-binds", "'/var/run/../run/docker.sock'"),
    ("sock-volumes-from", "extra_host_config['volumes_from']"),
    # only the engine can see these: the check is on the created container
    ("sock-symlink", "the engine finds a socket at '/x.sock'"),
    ("sock-folder-symlink", "the engine finds a socket at '/x/docker.sock'"),
    ("sock-bind-volume", "the engine finds a socket at '/evil/docker.sock'"),
    ("sock-bind-volume-run", f"volume {PREFIX}-evil-run mounts '/var/run'"),
])
def test_engine_socket_never_reaches_a_notebook(hostile, docker_client, group, words):
    log = refused(hostile, docker_client, f"{group}-user", [group])
    assert words in log, log[-2000:]


def assert_hardened(c, memory: int, cpus: float, pids: int) -> None:
    host = c.attrs["HostConfig"]
    assert (host["Memory"], host["MemorySwap"]) == (memory, memory)
    assert host["CpuQuota"] == int(cpus * 100_000) and host["PidsLimit"] == pids
    assert host["Privileged"] is False and host["CapDrop"] == ["ALL"] and not host["CapAdd"]
    assert "no-new-privileges" in host["SecurityOpt"]
    assert host["AutoRemove"] is True and not host["Devices"]
    assert c.attrs["Config"]["User"] == "1000"
    code, out = exec_text(c, "id -u; grep NoNewPrivs /proc/1/status")
    assert out.split()[0] == "1000" and out.split()[-1] == "1", out


@pytest.mark.parametrize("name", ["hook-empty-a", "hook-remove-a"])
def test_a_hook_cannot_remove_labels_or_hardening(hostile, docker_client, name):
    hostile.create_user(name)
    hostile.start_server(name, {"profile": "small"})
    c = container_for(docker_client, name)
    assert_hardened(c, 512 * MiB, 0.5, 300)
    labels = c.labels
    assert labels["quota-spawner.user"] == name and labels["quota-spawner.role"] == "small"
    assert labels["quota-spawner.gpus"] == "" and labels["quota-spawner.hub"]
    hostile.stop_server(name)
    assert containers(docker_client, name) == []  # removed, though a hook said remove=False


def test_hook_that_sets_privileged_is_refused(hostile, docker_client):
    log = refused(hostile, docker_client, "hook-priv-a")
    assert "extra_host_config['privileged'] = True is refused" in log


def test_traits_set_by_an_override_do_not_size_the_container(hostile, docker_client):
    name = "traits-user"
    hostile.create_user(name, ["ov-traits"])
    hostile.start_server(name, {"profile": "big"})
    c = container_for(docker_client, name)
    assert_hardened(c, GiB, 1, 2048)
    assert c.attrs["HostConfig"]["ShmSize"] == 256 * MiB
    assert c.attrs["Config"]["Image"] == "quota-spawner/pytorch:latest"
    # what an admin may add is there too
    assert c.attrs["HostConfig"]["DnsSearch"] == ["lab.example"]
    assert c.labels["lab.example/cost-centre"] == "42"
    assert c.labels["lab.example/team"] == "ml"
    env = dict(e.split("=", 1) for e in c.attrs["Config"]["Env"])
    assert env["TZ"] == "UTC" and env["MEM_LIMIT"] == str(GiB)
    hostile.stop_server(name)


def test_remove_false_never_reuses_the_last_container(hostile, docker_client):
    name = "mover-keep"
    hostile.create_user(name)
    hostile.start_server(name, {"profile": "big"})
    first = container_for(docker_client, name)
    assert first.attrs["HostConfig"]["Memory"] == GiB
    hostile.stop_server(name)
    assert containers(docker_client, name) == []
    hostile.start_server(name, {"profile": "small"})
    second = container_for(docker_client, name)
    assert second.id != first.id
    assert second.attrs["HostConfig"]["Memory"] == 512 * MiB
    assert second.labels["quota-spawner.role"] == "small"
    hostile.stop_server(name)
    assert "QuotaSpawner.remove=False is ignored" in hostile.log()


def test_a_role_larger_than_the_engine_is_reported_at_load(hostile):
    log = hostile.log()
    assert "Role 'giant'" in log and "asks for 1000 CPUs, but the Docker engine has" in log
    assert "asks for 16 TiB of memory" in log


# --- two hubs on one engine -----------------------------------------------------------

ZOMBIE_GRACE = 1  # seconds; each hub checks the engine's containers every second
TWO_HUBS = f"""
c.QuotaSpawner.gpu_sync_interval = 1
c.QuotaSpawner.zombie_grace_period = {ZOMBIE_GRACE}
"""


def test_two_hubs_with_defaults_never_reap_each_other(docker_client, tmp_path_factory):
    prefix = f"qsdup{os.getpid()}"  # the same prefix for both: a copied config
    quotas = "images: {pytorch: {image: 'quota-spawner/pytorch:latest'}}\n" \
             "roles: {small: {cpus: 0.5, memory: 256M, images: [pytorch]}}\n" \
             "assignments: {default: [small]}\n"
    one = Hub(tmp_path_factory.mktemp("one"), quotas, prefix=prefix, extra_config=TWO_HUBS)
    two = Hub(tmp_path_factory.mktemp("two"), quotas, prefix=prefix, extra_config=TWO_HUBS)
    try:
        with ThreadPoolExecutor(2) as pool:  # side by side, as two copies of one config
            list(pool.map(Hub.start, (one, two)))
        for hub, name in ((one, "alice"), (two, "bob")):
            hub.create_user(name)
            hub.start_server(name)  # also starts each hub's GPU pool and its zombie check
        alice = container_for(docker_client, "alice")
        ids = {c.labels["quota-spawner.hub"] for c in (alice, container_for(docker_client, "bob"))}
        assert len(ids) == 2 and all(i.startswith(prefix + "-") for i in ids)
        time.sleep(ZOMBIE_GRACE + 2)  # two syncs past the zombie grace period
        alice.reload()
        assert alice.status == "running"
        assert "Stopping unclaimed container" not in two.log()
        # the same user name on the second hub: refused, the first hub's server untouched
        two.create_user("alice")
        r = two.spawn("alice")
        assert r.status_code == 500 and "belongs to another hub" in r.json()["message"]
        assert "it is left alone" in two.log()
        time.sleep(1)  # the failed start's clean-up must not touch it either
        alice.reload()
        assert alice.status == "running" and one.user("alice")["servers"][""]["ready"]
        assert two.user("alice")["servers"] == {}
    finally:
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(Hub.stop, (one, two)))
        cleanup(docker_client, prefix)


# --- the quota table ---------------------------------------------------------------------


def test_a_broken_table_is_a_plain_sentence_for_users(docker_client, tmp_path):
    prefix = f"qsbroken{os.getpid()}"
    hub = Hub(tmp_path, QUOTAS.replace("cpus: 0.5", "cpus: .inf"), prefix=prefix)
    try:
        hub.start()
        hub.create_user("carol")
        r = hub.spawn("carol")
        assert r.status_code == 500
        message = r.json()["message"]
        assert message == TABLE_BROKEN
        assert "quotas.yaml" not in message and "cpus" not in message
        assert f"{hub.quota_file}:4: role 'small': cpus" in hub.log()
        assert containers(docker_client, "carol") == []
    finally:
        hub.stop()
        cleanup(docker_client, prefix)


def test_an_inf_edit_keeps_the_last_good_table(hub, docker_client, fresh_user, quotas):
    good = quotas.read_text()
    bad = good.replace("  pipeline:\n    cpus: 1\n    memory: 2G\n",
                       "  pipeline:\n    cpus: 1\n    memory: .inf\n")
    assert bad != good
    line = next(i for i, t in enumerate(bad.splitlines(), 1) if "memory: .inf" in t)
    # the good table is loaded (the spawn form of a user with a choice to make)
    r = hub.login(fresh_user("viewer")).get(f"{hub.url}/hub/spawn", timeout=30)
    assert r.status_code == 200 and "quota-choice" in r.text
    quotas.write_text(bad)
    name = fresh_user("infedit", groups=["solo"])
    hub.start_server(name)
    assert container_for(docker_client, name).attrs["HostConfig"]["Memory"] == 2 * GiB
    assert f"{quotas}:{line}: role 'pipeline': memory" in hub.log()
