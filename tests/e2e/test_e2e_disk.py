"""Homes of their role's size on a real hub and engine (docs/disk.md): on a real btrfs
filesystem made on a loop device, and on the image mechanism, which needs no quota
support in the kernel. One hub per mechanism; its tests run in order, one user's story
each:

- alice's notebook (a real container, uid 1000) writes past her role's 64 MiB and gets
  "Disk quota exceeded" or "No space left on device" at the size, while bob's writes, the
  hub's API and the usage ledger keep working, and nothing lands on the engine's disk;
- a grant of a bigger role (a table edit) grows her home at the next start, a smaller one
  deletes nothing: she is told, starts her server and a kernel, deletes a file through
  Jupyter and saves again;
- a home that does not fit on the homes' filesystem is refused with what is full, and
  nothing is created;
- an override cannot put another volume at the home, nor make the root writable.

Needs root (loop devices, mounts): skipped without it, like tests/service/test_homes_*.py.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from home_hubs import env_of, home_of, homes_hub, homes_table, write_in
from loopfs import need_root
from sqlalchemy import create_engine, select

from harness import container_for, run_in_kernel
from spawner.contract import DISK_LABEL, DISK_LIMIT, HOME_OVER_SIZE, HOME_USE_FILE
from spawner.usage.schema import sessions

pytestmark = pytest.mark.e2e
MiB = 2**20
SMALL, BIG, HUGE = 64 * MiB, 128 * MiB, 256 * MiB
PREFIX = f"qsdisk{os.getpid()}"
USERS = ("alice", "bob", "carol")
ALICE_BIG = "    alice: [big]\n"


def table(alice: str = "") -> str:
    return homes_table("    carol: [huge]\n" + alice)


# bob's servers get an override that tries to put another volume at the home and make the
# root writable
HOSTILE = ("c.QuotaSpawner.group_overrides = {'hostile': {'groups': ['hostile'], "
           "'spawner_override': {'volumes': {'" + PREFIX + "-evil': '/home/jovyan'}, "
           "'extra_host_config': {'read_only': False, 'tmpfs': {'/tmp': 'size=100g'}}}}}\n")


@pytest.fixture(scope="module", params=["btrfs", "image"])
def disk(request, docker_client, tmp_path_factory) -> Iterator[tuple[object, Path, str]]:
    """(the hub, the homes' root, the mechanism)."""
    need_root()
    mechanism = request.param
    with homes_hub(tmp_path_factory.mktemp(f"disk-{mechanism}"), docker_client, mechanism,
                   name=f"disk-{mechanism}", quota_text=table(), prefix=PREFIX, users=USERS,
                   extra_config=HOSTILE) as (hub, root):
        hub.create_user("bob", ["hostile"])
        yield hub, root, mechanism


def sh(container, command: str, user: str = "1000") -> tuple[int, str]:
    code, out = container.exec_run(["sh", "-c", command], user=user)
    return code, out.decode(errors="replace")


def ledger_sessions(hub, user: str) -> list[int | None]:
    """The home size of each of the user's sessions in the hub's usage ledger."""
    engine = create_engine(hub.usage_db)
    try:
        with engine.connect() as db:
            return list(db.execute(select(sessions.c.home_size).where(
                sessions.c.user_name == user).order_by(sessions.c.id)).scalars())
    finally:
        engine.dispose()


def test_writes_stop_at_the_size_and_nobody_else_notices(disk, docker_client):
    hub, root, mechanism = disk
    assert f"Homes are {'btrfs subvolumes' if mechanism == 'btrfs' else 'ext4 images'}" \
        in hub.log()  # the one sentence at start
    hub.start_servers({"alice": None, "bob": None})
    alice = container_for(docker_client, "alice")
    assert alice.labels[DISK_LABEL] == str(SMALL)
    env = env_of(alice)
    assert env[DISK_LIMIT] == str(SMALL) and HOME_OVER_SIZE not in env
    code, use = sh(alice, f"cat ${HOME_USE_FILE}")  # the hub's first, at the start
    assert code == 0 and abs(json.loads(use)["limit"] - SMALL) < MiB, use  # images: a few KiB
    before = os.statvfs(home_of(root, mechanism, "alice"))

    written, failure = write_in(alice, "/home/jovyan/big", 80 * MiB)
    assert failure == ("EDQUOT" if mechanism == "btrfs" else "ENOSPC")
    assert SMALL - 4 * MiB <= written <= SMALL, written

    # the bytes went to the homes' filesystem, none to the engine's (a read-only root)
    after = os.statvfs(home_of(root, mechanism, "alice"))
    assert (before.f_bfree - after.f_bfree) * after.f_frsize >= SMALL - 4 * MiB
    (listed,) = docker_client.api.containers(filters={"id": alice.id}, size=True)
    assert alice.attrs["HostConfig"]["ReadonlyRootfs"] and listed.get("SizeRw", 0) < MiB, listed
    code, out = sh(alice, "touch /var/lib/x", user="0")
    assert code != 0 and "Read-only file system" in out
    code, out = sh(alice, "df -B1 --output=fstype,size /tmp | tail -1")
    assert out.split() == ["tmpfs", str(512 * MiB)], out  # counted in the role's memory

    # bob, the hub and the ledger keep working
    bob = container_for(docker_client, "bob")
    assert write_in(bob, "/home/jovyan/data", 8 * MiB) == (8 * MiB, "")
    assert hub.api("GET", "/users/alice").status_code == 200
    assert ledger_sessions(hub, "alice") == ledger_sessions(hub, "bob") == [SMALL]


def test_an_override_cannot_put_another_volume_at_the_home(disk, docker_client):
    hub, root, mechanism = disk
    bob = container_for(docker_client, "bob")
    mounts = {m["Destination"]: m for m in bob.attrs["Mounts"]}
    assert mounts["/home/jovyan"]["Source"] == str(home_of(root, mechanism, "bob"))
    assert mounts["/home/jovyan"]["Type"] == "bind"
    assert bob.attrs["HostConfig"]["ReadonlyRootfs"] is True
    assert bob.attrs["HostConfig"]["Tmpfs"]["/tmp"].endswith(f"size={512 * MiB},mode=1777")
    assert not docker_client.volumes.list(filters={"name": f"{PREFIX}-evil"})


def test_pip_install_user_works_in_a_home_with_a_size(disk, docker_client):
    """A package of the user's own, built and installed with no network: the build in
    /tmp (tmpfs), the install in the home."""
    bob = container_for(docker_client, "bob")
    code, out = bob.exec_run(["python3", "-c", PACKAGE, "/tmp/src"], user="1000")
    assert code == 0, out
    code, out = sh(bob, "cd /tmp && pip install --user --no-index /tmp/src && "
                        "python3 -c 'import tinypkg; print(tinypkg.__file__, tinypkg.X)'")
    assert code == 0, out
    assert "/home/jovyan/.local/lib/python3" in out and out.strip().endswith(" 42"), out


def test_an_environment_of_ones_own_lives_in_the_home(disk, docker_client):
    """What a conda environment in the home needs: a whole Python environment made in
    the home, with the same package installed into it, works on a read-only root."""
    bob = container_for(docker_client, "bob")
    code, out = bob.exec_run(["python3", "-c", PACKAGE, "/tmp/src2"], user="1000")
    assert code == 0, out
    code, out = sh(bob, "cd /tmp && python3 -m venv --system-site-packages ~/envs/own && "
                        "~/envs/own/bin/pip install --no-index /tmp/src2 && "
                        "~/envs/own/bin/python -c 'import sys, tinypkg; "
                        "print(sys.prefix, tinypkg.__file__, tinypkg.X)'")
    assert code == 0, out
    assert out.strip().splitlines()[-1].startswith("/home/jovyan/envs/own /home/jovyan/envs/own/lib/"), out
    assert out.strip().endswith(" 42"), out


def test_a_bigger_role_grows_the_home_at_the_next_start(disk, docker_client):
    hub, root, mechanism = disk
    hub.quota_file.write_text(table(ALICE_BIG))
    hub.stop_server("alice")
    hub.start_server("alice", {"profile": "big", "image": "pytorch"})
    assert "Home of alice (alice): Home grown from 64 MiB to 128 MiB" in hub.log()
    alice = container_for(docker_client, "alice")
    assert alice.labels[DISK_LABEL] == str(BIG)
    assert ledger_sessions(hub, "alice") == [SMALL, BIG]  # each session's home size
    assert write_in(alice, "/home/jovyan/more", 40 * MiB) == (40 * MiB, "")


def test_a_smaller_role_deletes_nothing_and_the_user_can_free_room(disk, docker_client):
    hub, root, mechanism = disk
    home = home_of(root, mechanism, "alice")
    sizes = {name: (home / name).stat().st_size for name in ("big", "more")}
    hub.quota_file.write_text(table())
    hub.stop_server("alice")
    hub.start_server("alice", {"profile": "small", "image": "pytorch"})
    alice = container_for(docker_client, "alice")
    told = env_of(alice).get(HOME_OVER_SIZE, "")
    assert "nothing was deleted, and writes are refused until files are deleted" in told
    assert told in hub.log()
    assert {name: (home / name).stat().st_size for name in sizes} == sizes
    assert write_in(alice, "/home/jovyan/one-more", MiB)[1] in ("EDQUOT", "ENOSPC")

    # over its size, the server started; a kernel starts and runs
    assert run_in_kernel(hub, "alice", "print(6 * 7)").strip() == "42"
    contents = f"{hub.url}/user/alice/api/contents"
    auth = {"Authorization": f"token {hub.user_token('alice')}"}
    saved = {"type": "file", "format": "text", "content": "notes\n" * 200_000}  # 1.1 MiB
    assert requests.put(f"{contents}/notes.txt", json=saved, headers=auth,
                        timeout=60).status_code == 500  # full: the save is refused
    for name in sizes:  # deleting through Jupyter works, and frees the room at once
        r = requests.delete(f"{contents}/{name}", headers=auth, timeout=60)
        assert r.status_code == 204, r.text
    r = requests.put(f"{contents}/notes.txt", json=saved, headers=auth, timeout=60)
    assert r.status_code in (200, 201), r.text  # 200: the failed save left part of it
    assert (home / "notes.txt").read_text() == saved["content"]


def test_a_home_that_does_not_fit_is_refused_and_nothing_is_made(disk, docker_client):
    hub, root, mechanism = disk
    r = hub.spawn("carol")
    assert r.status_code == 503, r.text
    message = r.json()["message"]
    assert message.startswith("The homes' disk is fully reserved: ") and \
        "promised to 2 homes; this role's home needs 256 MiB." in message, message
    assert not (root / "carol").exists() and not list(root.glob("*/carol*"))
    assert not [c for c in docker_client.containers.list(all=True)
                if c.name == f"{PREFIX}-carol"]
    assert not hub.user("carol")["servers"]


# A package with a build backend of its own and no build requirements: pip builds and
# installs it with no network. Written by the container's Python into the folder it names.
PACKAGE = r'''
import os, sys
root = sys.argv[1]
os.makedirs(os.path.join(root, "tinypkg"), exist_ok=True)
files = {
    "pyproject.toml": '[build-system]\nrequires = []\nbuild-backend = "backend"\n'
                      'backend-path = ["."]\n',
    "tinypkg/__init__.py": "X = 42\n",
    "backend.py": """
import base64, hashlib, os, zipfile
DIST = "tinypkg-1.0.dist-info"
def _line(path, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"
def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    here = os.path.dirname(os.path.abspath(__file__))
    files = {"tinypkg/__init__.py": open(os.path.join(here, "tinypkg", "__init__.py"), "rb").read(),
             DIST + "/METADATA": b"Metadata-Version: 2.1\\nName: tinypkg\\nVersion: 1.0\\n",
             DIST + "/WHEEL": b"Wheel-Version: 1.0\\nGenerator: t\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n"}
    name = "tinypkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as z:
        for path, data in files.items():
            z.writestr(path, data)
        z.writestr(DIST + "/RECORD", "\\n".join([_line(p, d) for p, d in files.items()]
                                               + [DIST + "/RECORD,,"]) + "\\n")
    return name
""",
}
for name, text in files.items():
    with open(os.path.join(root, name), "w") as f:
        f.write(text)
'''
