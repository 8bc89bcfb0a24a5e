"""Bridge and user-defined networks, checked on the container the spawner creates.

Host mode is what the other end-to-end tests run. Here the spawner creates
(without starting) real containers on the default bridge and on a
user-defined network, so no traffic leaves loopback. The user object is
JupyterHub's own, on an in-memory database.
"""

from __future__ import annotations

import pytest
from jupyterhub import orm
from jupyterhub.objects import Hub
from jupyterhub.user import User
from traitlets.config import Config

from harness import ROOT
from spawner import QuotaSpawner

pytestmark = pytest.mark.e2e


def make_spawner(**traits) -> QuotaSpawner:
    db = orm.new_session_factory("sqlite://")()
    orm_user = orm.User(name="net-user")
    db.add(orm_user)
    db.commit()
    config = Config()
    config.QuotaSpawner.quota_file = str(ROOT / "hub_config" / "quotas.yaml")
    config.QuotaSpawner.prefix = "qstest-net"
    for name, value in traits.items():
        setattr(config.QuotaSpawner, name, value)
    settings = {"spawner_class": QuotaSpawner, "config": config, "hub": Hub(), "db": db,
                "domain": "", "statsd": None}
    spawner = User(orm_user, settings, db=db).spawner
    spawner.api_token = "not-a-real-token"
    return spawner


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
    spawner = make_spawner(
        network_name=user_network,
        extra_host_config={"dns": ["127.0.0.53"], "memswap_limit": -1, "privileged": True},
    )
    assert spawner.use_internal_ip
    c = await create(spawner, docker_client)
    try:
        host = c.attrs["HostConfig"]
        assert host["NetworkMode"] == user_network
        assert not host["PortBindings"]
        assert host["Dns"] == ["127.0.0.53"]  # the admin's own settings stay...
        assert host["MemorySwap"] == 4 * 2**30  # ...but never weaken the quota
        assert host["Privileged"] is False
    finally:
        c.remove(force=True)


@pytest.mark.parametrize("volumes, extra", [
    ({"/var/run/docker.sock": "/var/run/docker.sock"}, {}),
    ({}, {"binds": ["/var/run:/host-run:ro"]}),
])
async def test_docker_socket_is_never_mounted(docker_client, volumes, extra):
    from tornado.web import HTTPError

    spawner = make_spawner(volumes=volumes, extra_host_config=extra)
    spawner._apply_choice(await spawner.resolve(await spawner.choices()))
    with pytest.raises(HTTPError, match="Docker socket"):
        if volumes:
            spawner._check_no_docker_socket()
        await spawner.create_object()
    assert docker_client.containers.list(all=True, filters={"name": "qstest-net-"}) == []
