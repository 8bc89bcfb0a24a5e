"""Networks: the shipped bridge, the default bridge, another user-defined one, host mode.

The other end-to-end tests run on the shipped network, a user-defined bridge
with inter-container traffic off. Here the spawner also creates (without
starting) real containers on Docker's default bridge and on another
user-defined network, and a whole hub runs in host mode. The user object is
JupyterHub's own, on an in-memory database.
"""

from __future__ import annotations

import os
import tempfile

import pytest
import requests
from jupyterhub import orm
from jupyterhub.objects import Hub
from jupyterhub.user import User
from tornado.web import HTTPError
from traitlets.config import Config

import harness
from harness import ROOT, cleanup, container_for
from spawner import QuotaSpawner
from spawner.docker.network import HOST_NETWORK_WARNING, ICC_OPTION
from spawner.policy.refusals import SETTING_REFUSED as USER_MESSAGE

pytestmark = pytest.mark.e2e


def make_spawner(**traits) -> QuotaSpawner:
    db = orm.new_session_factory("sqlite://")()
    orm_user = orm.User(name="net-user")
    db.add(orm_user)
    db.commit()
    config = Config()
    config.QuotaSpawner.quota_file = str(ROOT / "hub_config" / "quotas.yaml")
    config.QuotaSpawner.prefix = "qstest-net"
    # its files (the event log, the usage ledger) in a folder of its own, not the checkout
    config.QuotaSpawner.state_dir = tempfile.mkdtemp(prefix="qstest-net-")
    for name, value in traits.items():
        setattr(config.QuotaSpawner, name, value)
    settings = {"spawner_class": QuotaSpawner, "config": config, "hub": Hub(), "db": db,
                "domain": "", "statsd": None}
    spawner = User(orm_user, settings, db=db).spawner
    spawner.api_token = "not-a-real-token"
    return spawner


@pytest.fixture(autouse=True)
def no_leftovers(docker_client):
    cleanup(docker_client, "qstest-net")
    yield
    cleanup(docker_client, "qstest-net")


async def create(spawner: QuotaSpawner, docker_client):
    spawner._apply_choice(await spawner.resolve(await spawner.choices()))
    created = await spawner.create_object()
    container = docker_client.containers.get(created["Id"])
    return container


@pytest.fixture
def user_network(docker_client):
    network = docker_client.networks.create("qstest-user-net", driver="bridge")
    yield network.name
    network.remove()


async def test_default_bridge_binds_loopback_port(docker_client):
    spawner = make_spawner(network_name="bridge", host_ip="127.0.0.1")
    c = await create(spawner, docker_client)
    try:
        host = c.attrs["HostConfig"]
        assert host["NetworkMode"] == "bridge"
        assert host["PortBindings"] == {"8888/tcp": [{"HostIp": "127.0.0.1", "HostPort": ""}]}
        assert host["Memory"] == 4 * 2**30 and host["MemorySwap"] == 4 * 2**30
        assert "no-new-privileges" in host["SecurityOpt"]
        assert c.attrs["Config"]["User"] == "1000"
    finally:
        c.remove(force=True)


async def test_user_defined_network_uses_internal_ip(docker_client, user_network):
    spawner = make_spawner(network_name=user_network, extra_host_config={"dns": ["127.0.0.53"]})
    assert spawner.use_internal_ip
    c = await create(spawner, docker_client)
    try:
        host = c.attrs["HostConfig"]
        assert host["NetworkMode"] == user_network
        assert not host["PortBindings"]
        assert host["Dns"] == ["127.0.0.53"]  # the admin's own settings stay
        assert host["MemorySwap"] == 4 * 2**30 and host["Privileged"] is False
    finally:
        c.remove(force=True)


@pytest.mark.parametrize("traits", [
    {"volumes": {"/var/run/docker.sock": "/var/run/docker.sock"}},
    {"extra_host_config": {"binds": ["/var/run:/host-run:ro"]}},
    {"extra_host_config": {"privileged": True}},
    {"extra_host_config": {"memswap_limit": -1}},
    {"network_name": "bridge", "host_ip": "0.0.0.0"},  # the notebook port on every address
])
async def test_refused_settings_create_nothing(docker_client, traits):
    """Decided from the settings alone: the same whether or not a socket exists here."""
    spawner = make_spawner(**traits)
    spawner._apply_choice(await spawner.resolve(await spawner.choices()))
    with pytest.raises(HTTPError) as info:
        await spawner.create_object()
    assert info.value.status_code == 500 and info.value.log_message == USER_MESSAGE
    assert docker_client.containers.list(all=True, filters={"name": "qstest-net-"}) == []


def test_shipped_network_keeps_containers_apart(hub, docker_client, fresh_user):
    """The demo's and the test hubs' network: a bridge with inter-container traffic off."""
    name = fresh_user("bridged")
    hub.start_server(name)
    c = container_for(docker_client, name)
    assert c.attrs["HostConfig"]["NetworkMode"] == "quota-spawner"
    assert not c.attrs["HostConfig"]["PortBindings"]
    network = docker_client.networks.get("quota-spawner")
    assert network.attrs["Driver"] == "bridge"
    assert network.attrs["Options"][ICC_OPTION] == "false"
    gateway = network.attrs["IPAM"]["Config"][0]["Gateway"]
    env = dict(e.split("=", 1) for e in c.attrs["Config"]["Env"])
    assert env["JUPYTERHUB_API_URL"].startswith(f"http://{gateway}:")  # the hub, on the bridge
    # reached through the proxy, and the server checks the token with the hub over the bridge
    token = hub.user_token(name)
    r = requests.get(f"{hub.url}/user/{name}/api/status", timeout=10,
                     headers={"Authorization": f"token {token}"})
    assert r.status_code == 200, r.text


def test_host_mode_works_and_warns(docker_client, tmp_path):
    prefix = f"qshost{os.getpid()}"
    hub = harness.Hub(tmp_path, prefix=prefix, network="host")
    try:
        hub.start()
        assert HOST_NETWORK_WARNING in hub.log()
        hub.create_user("hosted")
        hub.start_server("hosted")
        c = container_for(docker_client, "hosted")
        assert c.attrs["HostConfig"]["NetworkMode"] == "host"
        env = dict(e.split("=", 1) for e in c.attrs["Config"]["Env"])
        assert env["JUPYTERHUB_SERVICE_URL"].startswith("http://127.0.0.1:")
        r = requests.get(f"{hub.url}/user/hosted/api", timeout=10)
        assert r.status_code == 200 and "version" in r.json()
        hub.stop_server("hosted")
    finally:
        hub.stop()
        cleanup(docker_client, prefix)
