"""A home is named as the user's container is (DockerSpawner's escape), and no name can
lead out of the homes' root (spawner/homes/names.py)."""

from __future__ import annotations

import pytest
from dockerspawner import DockerSpawner
from hypothesis import given
from hypothesis import strategies as st

from spawner.homes.errors import HomeError
from spawner.homes.names import checked_name, container_escape


@given(st.text(max_size=60))
def test_a_home_is_named_exactly_as_dockerspawner_names_the_container(user):
    assert container_escape(user) == DockerSpawner._escape(user)


@given(st.text(min_size=1, max_size=60))
def test_every_escaped_user_name_is_a_safe_home_name(user):
    assert checked_name(container_escape(user), user) == container_escape(user)


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
