"""The watchdog's cycle and the users' homes, for real: homes as btrfs subvolumes with
qgroup limits on a btrfs filesystem made on a loop device (tests/loopfs.py), a notebook
container on the test engine made as the hub makes one (the contract's labels, the home
bind-mounted, its home-use folder mounted read-only), written to by a real process as
the notebook's uid, and the watchdog's own cycle (no hub, no NVML: neither is needed for
homes). Each cycle reads every home's use with one quota query; the container reads its
home.json; a home past 90% of its size is told once to its user's channel and the
admins' (a real HTTP receiver, tests/receivers.py) and resolved once; the homes'
filesystem past its threshold too, and this node's homes document says it all."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
import uuid

import pytest
from loopfs import MiB, btrfs_filesystem, write_as
from receivers import HttpReceiver
from traitlets.config import Config

from spawner.contract import (
    DISK_LABEL,
    GPUS_LABEL,
    HUB_LABEL,
    IMAGE_LABEL,
    ROLE_LABEL,
    USER_LABEL,
)
from spawner.homes.detect import open_homes
from spawner.usage.documents import DiskUsage, FolderDocuments
from spawner.watchdog.app import QuotaWatchdog, usage_samples

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

SIZE = 64 * MiB  # alice's home, as her label says; bob's label says none


@pytest.fixture(scope="module")
def btrfs():
    with btrfs_filesystem() as mount:
        yield mount


def commit(path) -> None:
    """btrfs counts extents at a transaction's commit: commit now."""
    subprocess.run(["btrfs", "filesystem", "sync", str(path)], check=True, capture_output=True)


def notebook(docker_client, hub: str, user: str, home, use, disk: int | None):
    """A running container as the hub makes one for ``user``: its labels, its home, and
    the folder of its home's use read-only at /run/quota-spawner."""
    return docker_client.containers.run(
        "quota-spawner/base:local", ["sleep", "600"], detach=True, user="1000:100",
        name=f"quota-{user}", labels={
            USER_LABEL: user, ROLE_LABEL: "student", IMAGE_LABEL: "base", HUB_LABEL: hub,
            GPUS_LABEL: "", DISK_LABEL: str(disk or "")},
        volumes={str(home): {"bind": "/home/jovyan", "mode": "rw"},
                 str(use): {"bind": "/run/quota-spawner", "mode": "ro"}})


def messages(http: HttpReceiver, path: str) -> list[tuple[str, str]]:
    """(title, incident) of what the JSON webhook at ``path`` got, in order."""
    found = []
    for request in list(http.requests):
        if request.path == path and isinstance(request.body, dict):
            incident = request.body["message"].rsplit("Incident: ", 1)[-1]
            found.append((request.body["title"], incident))
    return found


async def cycle(app: QuotaWatchdog) -> None:
    """One cycle of the watchdog, with its messages on their way delivered."""
    await app.cycle()
    await asyncio.gather(*list(app._sending))


async def test_a_cycle_reads_the_homes_writes_home_json_and_tells_a_full_home_once(
        btrfs, docker_client, tmp_path, monkeypatch):
    tag = uuid.uuid4().hex[:8]
    alice, bob, hub = f"wdhome-a{tag}", f"wdhome-b{tag}", f"hub-{tag}"
    root = btrfs / tag
    root.mkdir(mode=0o711)
    homes = open_homes(root, "btrfs")
    alices, bobs = homes.prepare(alice, SIZE), homes.prepare(bob, 10 * SIZE)
    state = tmp_path / "state"
    (state / "home-use" / alices.name).mkdir(parents=True)  # the hub makes each one
    (state / "home-use" / bobs.name).mkdir()
    monkeypatch.setenv("QUOTA_SPAWNER_STATE_DIR", str(state))  # the homes document's folder
    containers = []
    with HttpReceiver() as http:
        webhook = http.base[len("http://"):]
        c = Config()
        c.QuotaWatchdog.update(
            docker_host=os.environ["DOCKER_HOST"], hub_id=hub, usage_db="none",
            home_root=str(root), home_mechanism="btrfs", metrics_port=0, host_name="node-a",
            state_file=str(tmp_path / "incidents.json"))
        # this small filesystem holds a few MiB of btrfs's own: past 15% with the write
        c.WatchdogRules.update(home_disk_hold=0, homes_filesystem_hold=0,
                               homes_filesystem_high=0.15, homes_filesystem_clear=0.10)
        c.Notifier.retry_delay = 0.1
        c.Notifier.channels = [
            {"name": "admins", "url": f"json://{webhook}/admins"},
            {"name": "alice", "url": f"json://{webhook}/alice", "users": [alice]},
            {"name": "class", "url": f"json://{webhook}/class", "groups": ["c"]}]
        app = QuotaWatchdog(config=c)
        app.initialize([])
        try:
            containers = [notebook(docker_client, hub, alice, alices.path,
                                   state / "home-use" / alices.name, SIZE),
                          notebook(docker_client, hub, bob, bobs.path,
                                   state / "home-use" / bobs.name, None)]
            # 1. nearly empty homes: alice's home.json, in her container too
            await cycle(app)
            seen = json.loads((state / "home-use" / alices.name / "home.json").read_text())
            assert (seen["version"], seen["limit"], seen["mechanism"], seen["full"]) == (
                1, SIZE, "btrfs", False)
            assert seen["used"] < MiB and time.time() - seen["at"] < 30
            inside = containers[0].exec_run(["cat", "/run/quota-spawner/home.json"])
            assert inside.exit_code == 0 and json.loads(inside.output) == seen
            # bob's label gives no size: his home's is its quota's limit
            seen = json.loads((state / "home-use" / bobs.name / "home.json").read_text())
            assert (seen["limit"], seen["full"]) == (10 * SIZE, False)
            assert messages(http, "/admins") == []

            # 2. alice writes 60 of her 64 MiB (94%), as her notebook would
            assert write_as(alices.path / "checkpoint.pt", 60 * MiB) == (60 * MiB, "")
            commit(root)
            await cycle(app)
            seen = json.loads((state / "home-use" / alices.name / "home.json").read_text())
            assert 60 * MiB <= seen["used"] < 61 * MiB and seen["full"] is False
            inside = containers[0].exec_run(["cat", "/run/quota-spawner/home.json"])
            assert json.loads(inside.output) == seen  # the rename is seen through the mount
            # the same query gives each server's sample its home's use, for the ledger's peak
            samples = {s.container: s.home_used for s in usage_samples(
                await asyncio.to_thread(app.collect))}
            assert samples[containers[0].name] == seen["used"]
            assert samples[containers[1].name] < MiB
            # sent at once, each on its way: in either order
            home, filesystem = sorted(messages(http, "/admins"), key=lambda m: m[1])
            assert home == (f"[warning] {alice}'s home at 94% of its size",
                            f"home_disk:{alices.name}")
            # about 20%: what btrfs keeps for itself varies a little
            assert filesystem[0].startswith("[warning] the homes' filesystem on node-a at ")
            assert filesystem[1] == "homes_filesystem"
            assert messages(http, "/alice") == [home]  # her home, not the filesystem
            assert messages(http, "/class") == []

            # 3. still full: nothing more
            await cycle(app)
            assert len(messages(http, "/admins")) == 2 and len(messages(http, "/alice")) == 1

            # 4. she deletes it: resolved, once
            (alices.path / "checkpoint.pt").unlink()
            commit(root)
            await cycle(app)
            await cycle(app)
            resolved = sorted(messages(http, "/admins")[2:], key=lambda m: m[1])
            assert [(t.split(":")[0], key) for t, key in resolved] == [
                (f"[resolved] {alice}'s home nearly full", f"home_disk:{alices.name}"),
                ("[resolved] the homes' filesystem on node-a nearly full", "homes_filesystem")]
            assert messages(http, "/alice")[1:] == resolved[:1]
            seen = json.loads((state / "home-use" / alices.name / "home.json").read_text())
            assert seen["used"] < MiB
            assert sorted(os.listdir(state / "home-use" / alices.name)) == ["home.json"]

            # this node's homes document: both homes, who runs on them, the filesystem
            document = DiskUsage.read(FolderDocuments(str(state)), "node-a")
            assert (document.node, document.mechanism, document.enforced) == (
                "node-a", "btrfs", True)
            assert document.sentence == f"Homes are btrfs subvolumes under {root}, each " \
                "limited by a qgroup"
            assert [(h.user, h.name, h.limit) for h in document.homes] == sorted(
                [(alice, alices.name, SIZE), (bob, bobs.name, 10 * SIZE)], key=lambda h: h[1])
            fs = document.filesystem
            assert fs.path == str(root) and fs.size == 400 * MiB and fs.reserved == 11 * SIZE
            assert 0 < fs.used < 20 * MiB and fs.free > 300 * MiB
        finally:
            for container in containers:
                container.remove(force=True)
