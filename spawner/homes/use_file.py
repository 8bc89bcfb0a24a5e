"""The file a container reads its home's use from (spawner/contract.py, HOME_USE_*).

btrfs's statfs does not show a qgroup's limit, so a notebook cannot read its own home's
use; the hub and the watchdog, which can, write it into ``<state dir>/home-use/<home
name>/home.json``, which the container sees read-only at /run/quota-spawner. The hub
writes it as the server starts; the watchdog keeps it current. Written atomically (a
temporary file in the folder, then a rename), so a reader never sees half of it.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from spawner.contract import HOME_USE_NAME, HOME_USE_STATE, HOME_USE_VERSION

FOLDER_MODE = 0o755  # root's; the container's user reads through the read-only bind
FILE_MODE = 0o644


def use_folder(state_dir: str | Path, name: str) -> Path:
    """The host folder bind-mounted into the containers of home ``name`` (not made)."""
    return Path(state_dir) / HOME_USE_STATE / name


def make_use_folder(state_dir: str | Path, name: str) -> Path:
    """``use_folder``, made if missing (with its parent), readable by the containers."""
    folder = use_folder(state_dir, name)
    for path in (folder.parent, folder):
        try:
            os.mkdir(path, FOLDER_MODE)
        except FileExistsError:
            pass
        os.chmod(path, FOLDER_MODE)  # whatever the umask made of it
    return folder


def home_use_document(used: int, limit: int | None, mechanism: str, at: float) -> dict:
    """What home.json holds: its version, the bytes used and the limit, when, by what."""
    return {"version": HOME_USE_VERSION, "used": used, "limit": limit, "at": at,
            "mechanism": mechanism, "full": limit is not None and used >= limit}


def write_home_use(folder: str | Path, document: dict) -> Path:
    """Write ``document`` (``home_use_document``) as home.json in ``folder``, atomically."""
    folder = Path(folder)
    fd, temporary = tempfile.mkstemp(dir=folder, prefix=f".{HOME_USE_NAME}.")
    try:
        with os.fdopen(fd, "w") as file:
            json.dump(document, file)
        os.chmod(temporary, FILE_MODE)
        os.replace(temporary, folder / HOME_USE_NAME)
    except BaseException:
        try:
            os.unlink(temporary)
        except FileNotFoundError:
            pass
        raise
    return folder / HOME_USE_NAME
