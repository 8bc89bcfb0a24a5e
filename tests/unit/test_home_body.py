"""A home of its role's size in the create body (spawner/docker/home_body.py): the bind in
place of the volume, the read-only root, /tmp counted in memory, the contract's label and
variables; and no configuration can take the limit away (the last check refuses it)."""

from __future__ import annotations

import docker
import pytest

from spawner.contract import CONTRACT_ENV, DISK_LABEL, DISK_LIMIT, HOME_OVER_SIZE, HOME_USE_FILE
from spawner.docker.container import (
    ContainerSpec,
    admin_problems,
    create_body,
    environment,
    labels,
    violations,
)
from spawner.docker.home_body import HomeBind
from spawner.quota.model import Role

GiB = 2**30
ROLE = Role(name="thesis", cpus=1, memory=2 * GiB, images=("pytorch",), disk=20 * GiB)
HOME = HomeBind(path="/srv/homes/alice", size=20 * GiB, use_folder="/hub/home-use/alice")
API = docker.APIClient(base_url="unix:///nonexistent.sock", version="1.41")
# DockerSpawner's request: the volume at the home, as with every hub today
CREATE = {"image": "quota-spawner/pytorch:latest", "command": ["jupyterhub-singleuser"],
          "environment": {"JUPYTERHUB_API_TOKEN": "t"}, "volumes": ["/home/jovyan"]}
HOST = {"binds": {"quota-home-alice": {"bind": "/home/jovyan", "mode": "rw"}},
        "network_mode": "quota-spawner"}


def spec(home: HomeBind | None = HOME, **kwargs) -> ContainerSpec:
    return ContainerSpec(role=ROLE, image_key="pytorch", image="quota-spawner/pytorch:latest",
                         user_name="alice", hub_id="quota-abc", notebook_user="1000",
                         network_mode="quota-spawner", home=home, **kwargs)


def made(s: ContainerSpec, admin_create: dict | None = None, admin_host: dict | None = None,
         host: dict | None = None) -> dict:
    return create_body(API, s, CREATE, {**HOST, **(host or {})}, admin_create or {},
                       admin_host or {})


def test_the_home_is_bound_in_place_of_the_volume_with_its_use_read_only():
    host = made(spec())["HostConfig"]
    assert host["Binds"] == []  # the volume went
    assert host["Mounts"] == [
        {"Type": "bind", "Source": "/srv/homes/alice", "Target": "/home/jovyan",
         "ReadOnly": False},
        {"Type": "bind", "Source": "/hub/home-use/alice", "Target": "/run/quota-spawner",
         "ReadOnly": True}]
    assert "/home/jovyan" not in (made(spec()).get("Volumes") or {})


def test_the_root_is_read_only_and_tmp_counts_in_the_memory():
    host = made(spec())["HostConfig"]
    assert host["ReadonlyRootfs"] is True
    options = f"rw,nosuid,nodev,size={2 * GiB},mode=1777"
    assert host["Tmpfs"] == {"/tmp": options, "/var/tmp": options}


def test_label_and_variables_say_the_size_and_where_the_use_is():
    s = spec()
    assert labels(s)[DISK_LABEL] == str(20 * GiB)
    env = made(s)["Env"]
    assert f"{DISK_LIMIT}={20 * GiB}" in env
    assert f"{HOME_USE_FILE}=/run/quota-spawner/home.json" in env
    # what every Jupyter start writes is off the home, so a full one still starts
    assert "JUPYTER_RUNTIME_DIR=/tmp/jupyter-runtime" in env and "IPYTHONDIR=/tmp/ipython" in env
    assert HOME_OVER_SIZE not in environment(s)
    over = spec(HomeBind("/srv/homes/alice", 5 * GiB, "/u", over_size="It holds 15 GiB."))
    assert environment(over)[HOME_OVER_SIZE] == "It holds 15 GiB."
    assert violations(made(s), s) == [] and violations(made(over), over) == []


def test_without_a_home_of_a_size_nothing_changes_but_an_empty_label():
    s = spec(None)
    body = made(s)
    assert labels(s)[DISK_LABEL] == ""
    assert body["HostConfig"]["Binds"] == ["quota-home-alice:/home/jovyan:rw"]
    assert "ReadonlyRootfs" not in body["HostConfig"] and "Tmpfs" not in body["HostConfig"]
    assert not [e for e in body["Env"] if e.startswith((DISK_LIMIT, "IPYTHONDIR"))]
    assert violations(body, s) == []


def test_the_disk_variables_are_the_spawners_alone():
    assert {DISK_LIMIT, HOME_USE_FILE, HOME_OVER_SIZE} <= set(CONTRACT_ENV)
    problems = admin_problems(spec(), host={}, create={}, environment={DISK_LIMIT: "1"},
                              extra_labels={DISK_LABEL: ""}, network="quota-spawner")
    assert len(problems) == 2 and all("refused" in p for p in problems)


@pytest.mark.parametrize("admin_host, host", [
    ({"binds": {"/srv/big": {"bind": "/home/jovyan", "mode": "rw"}}}, {}),
    ({"binds": ["/srv/big:/home/jovyan/"]}, {}),
    ({"mounts": [{"Type": "bind", "Source": "/srv/big", "Target": "/home/jovyan"}]}, {}),
    ({"binds": ["/srv/fake-use:/run/quota-spawner:rw"]}, {}),
    ({"read_only": False, "tmpfs": {"/tmp": "size=1t", "/var/tmp": ""}}, {}),
    # an override's volumes and binds, as DockerSpawner passes them
    ({}, {"binds": {"other-volume": {"bind": "/home/jovyan", "mode": "rw"}}}),
], ids=["volume at the home", "bind at the home", "mount at the home", "bind at its use",
        "writable root, big /tmp", "override's volume"])
def test_what_an_admin_or_an_override_adds_cannot_lift_the_limit(admin_host, host):
    """The additions are allowed where they do no harm, but the body the engine gets has
    the home of its size, the read-only root and /tmp in memory all the same."""
    s = spec()
    body = made(s, admin_host=admin_host, host=host)
    assert violations(body, s) == []
    assert body["HostConfig"]["Mounts"][-2]["Source"] == "/srv/homes/alice"
    assert [m["Target"] for m in body["HostConfig"]["Mounts"]].count("/home/jovyan") == 1
    assert not [b for b in body["HostConfig"]["Binds"] if "/home/jovyan" in b
                or "/run/quota-spawner" in b]
    assert body["HostConfig"]["ReadonlyRootfs"] is True
    assert body["HostConfig"]["Tmpfs"]["/tmp"].startswith("rw,nosuid,nodev,size=")


def test_a_body_changed_after_the_quota_is_refused():
    s = spec()
    for change in (
        lambda h: h.update(ReadonlyRootfs=False),
        lambda h: h.pop("ReadonlyRootfs"),
        lambda h: h["Tmpfs"].pop("/tmp"),
        lambda h: h["Binds"].append("quota-home-alice:/home/jovyan"),
        lambda h: h["Mounts"].pop(0),
        lambda h: h["Mounts"][0].update(Source="/srv/homes/bob"),
        lambda h: h["Mounts"][1].update(ReadOnly=False),
        lambda h: h["Mounts"].append({"Type": "volume", "Source": "x", "Target": "/home/jovyan/"}),
    ):
        body = made(s)
        change(body["HostConfig"])
        assert violations(body, s), change
