"""A home is named as the user's container is (DockerSpawner's escape), and no name can
lead out of the homes' root (spawner/homes/names.py)."""

from __future__ import annotations

import pytest
from dockerspawner import DockerSpawner
from hypothesis import given
from hypothesis import strategies as st

from spawner.homes.errors import HomeError
from spawner.homes.names import MAX_NAME, checked_name, container_escape, home_name


@given(st.text(max_size=60))
def test_a_home_is_named_exactly_as_dockerspawner_names_the_container(user):
    assert container_escape(user) == DockerSpawner._escape(user)


@given(st.text(min_size=1, max_size=80))
def test_every_user_name_makes_a_safe_home_name_the_containers_own_while_it_fits(user):
    name = home_name(user)
    assert checked_name(name, user) == name and len(name) <= MAX_NAME
    if len(container_escape(user)) <= MAX_NAME:
        assert name == container_escape(user)
    else:
        assert "--" in name and "--" not in container_escape(user)


def test_a_name_too_long_for_a_filesystem_is_shortened_and_stays_apart():
    first, second = "ü" * 60 + "a", "ü" * 60 + "b"  # escaped: 360 characters each
    assert len(container_escape(first)) == 361
    assert home_name(first) != home_name(second)
    assert home_name(first) == home_name(first) and len(home_name(first)) == MAX_NAME
    assert home_name(first).startswith(container_escape(first)[:200])


@pytest.mark.parametrize("user, name", [("alice", "alice"), ("O'Brien", "-4f-27-42rien"),
                                        ("../../etc", "-2e-2e-2f-2e-2e-2fetc"),
                                        ("ünal", "-c3-bcnal")])
def test_names_people_see(user, name):
    assert container_escape(user) == name


@pytest.mark.parametrize("name", ["", ".", "..", "../x", "a/b", "/abs", ".hidden", "a\x00b",
                                  "a b", "x" * 256, "tab\there"])
def test_a_name_that_is_not_one_plain_folder_is_refused(name):
    with pytest.raises(HomeError, match="cannot be named"):
        checked_name(name, "someone")
