"""A home's name on disk: the user's name escaped as the containers' names are, and
checked so that no name can leave the homes' root.

The Docker backend names a user's container and volume with DockerSpawner's ``escape``
(``QuotaSpawner.escape``; by default ``DockerSpawner._escape``: lowercase letters and
digits kept, every other character as ``-`` and its hex code, so ``O'Brien`` is
``-4f-27-42rien``). A home is named the same way, so ``quota-alice`` and the home
``alice`` go together. This layer cannot import DockerSpawner (the contract in
pyproject.toml keeps Docker out of the lower layers), so ``container_escape`` is that
default written with the same library (escapism, which DockerSpawner requires: it comes
with the pinned ``dockerspawner``), and tests/unit/test_homes_names.py checks that the
two agree; a backend with an admin's own ``escape`` passes it to the store.
"""

from __future__ import annotations

import hashlib
import re
import string
from collections.abc import Callable

from escapism import escape

from spawner.homes.errors import HomeError

SAFE = frozenset(string.ascii_lowercase + string.digits)
# What a home's name may be, whoever escaped it: one path component that is not "." or
# "..", not hidden (the root's own files start with "."), and short enough for any
# filesystem's names.
HOME_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,254}")
# A name is at most 255 bytes on btrfs, XFS and ext4; an image adds ".img". Escaping
# makes a user's name up to 12 times longer, so a long one is shortened (home_name).
MAX_NAME = 240
DIGEST = 32


def container_escape(user: str) -> str:
    """``user`` as DockerSpawner's default ``escape`` writes it in container names."""
    return escape(user, SAFE, escape_char="-").lower()


def home_name(user: str, escape: Callable[[str], str] = container_escape) -> str:
    """The folder name of ``user``'s home: ``escape(user)``, or, where that is longer than
    a filesystem takes, its start, ``--`` and a digest of the exact name (``--`` never
    appears in a name DockerSpawner's escape writes, so the two forms never meet)."""
    name = escape(user)
    if isinstance(name, str) and len(name) > MAX_NAME:
        digest = hashlib.sha256(user.encode("utf-8", "surrogatepass")).hexdigest()[:DIGEST]
        name = f"{name[:MAX_NAME - DIGEST - 2]}--{digest}"
    return checked_name(name, user)


def checked_name(name: str, user: str) -> str:
    """``name`` if it can be a home's folder under the root, else HomeError."""
    if not isinstance(name, str) or not HOME_NAME.fullmatch(name):
        raise HomeError(f"the home of user {user!r} cannot be named {name!r}: a home's name "
                        "is one folder name of letters, digits, '.', '_' and '-', not "
                        "starting with '.'")
    return name
