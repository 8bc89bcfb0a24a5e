"""Small pure parts: instructor RBAC roles, engine checks, the entry point."""

import logging
import re
from importlib.metadata import entry_points

import pytest

from spawner.docker.engine import check_engine_info
from spawner.hubconfig.rbac import instructor_roles


def test_instructor_role_scopes_are_filtered_to_the_group():
    (role,) = instructor_roles({"cs101": ["prof-ada"]})
    assert role["name"] == "instructor-cs101"
    assert role["users"] == ["prof-ada"]
    for scope in role["scopes"]:
        # opening the usage page is the one unfiltered scope; what it shows is filtered
        assert scope in ("admin-ui", "access:services!service=usage") or scope.endswith(
            "!group=cs101")
    assert "custom:quota-spawner:usage!group=cs101" in role["scopes"]
    assert "servers!group=cs101" in role["scopes"]
    assert "access:servers!group=cs101" in role["scopes"]


def test_instructor_role_name_is_valid_for_odd_groups():
    (role,) = instructor_roles({"Lab Class #1": ["x"]})
    assert re.fullmatch(r"instructor-lab-class-1---[0-9a-f]{8}", role["name"])
    assert re.fullmatch(r"^[a-z][a-z0-9\-_~\.]{1,253}[a-z0-9]$", role["name"])


@pytest.mark.parametrize("groups", [
    ["Lab Class #1", "lab-class--1", "lab-class-1"],
    ["a b", "a-b", "a_b", "A-B", "a--b"],
    ["x" * 300, "x" * 301],
    ["", "-", "#"],
])
def test_instructor_role_names_never_collide(groups):
    names = [role["name"] for role in instructor_roles({g: ["x"] for g in groups})]
    assert len(set(names)) == len(groups), names
    for name in names:  # JupyterHub's own rule for role names
        assert re.fullmatch(r"^[a-z][a-z0-9\-_~\.]{1,253}[a-z0-9]$", name), name


def test_swap_warning(caplog):
    log = logging.getLogger("t")
    with caplog.at_level(logging.WARNING):
        assert check_engine_info({"SwapLimit": True, "MemoryLimit": True}, log)
        assert caplog.text == ""
        assert not check_engine_info({"SwapLimit": False, "MemoryLimit": True}, log)
    assert "SwapLimit false" in caplog.text


def test_spawner_entry_point():
    (ep,) = [e for e in entry_points(group="jupyterhub.spawners") if e.name == "quota"]
    from spawner import QuotaSpawner

    assert ep.load() is QuotaSpawner
