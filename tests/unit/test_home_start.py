"""One start's home (spawner/docker/homes.py) against a store of homes in memory: the
admission's decision, two starts at once, the refusals' sentences, and the use file."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
from tornado import web

from spawner.docker.homes import HomeStart
from spawner.docker.runtime import HubRuntime
from spawner.homes.base import Home, HomeStore, HomeUse, Space
from spawner.homes.errors import HomeError
from spawner.quota.model import Role

MiB = 2**20
LOG = logging.getLogger("test.homes")


class Homes(HomeStore):
    """Homes kept in a dict, on a filesystem of ``size`` bytes; ``gate`` holds a prepare
    until it is set (a slow mkfs)."""

    mechanism = "btrfs"

    def __init__(self, root: Path, size: int, limits: dict[str, int] | None = None):
        super().__init__(root)
        self.size, self.limits = size, dict(limits or {})
        self.gate, self.entered = threading.Event(), threading.Event()
        self.gate.set()
        self.fail = ""

    def describe(self) -> str:
        return "homes in memory"

    def _prepare(self, user: str, name: str, size: int) -> Home:
        self.entered.set()
        self.gate.wait(10)
        if self.fail:
            raise HomeError(self.fail)
        before = self.limits.get(name)
        self.limits[name] = size
        used = 15 * MiB if size < 15 * MiB else 0
        return Home(user, name, self.root / name, size, size, used,
                    "created" if before is None else "grown" if size > before else "",
                    before)

    def usage(self) -> dict[str, HomeUse]:
        return {name: HomeUse(name, 0, limit) for name, limit in self.limits.items()}

    def space(self) -> Space:
        return Space(self.root, self.size, 0, self.size)


def runtime(tmp_path: Path, homes: HomeStore | None, problem: str = "") -> HubRuntime:
    found = HubRuntime.__new__(HubRuntime)
    found.homes, found.homes_problem = homes, problem
    found.disk_lock, found.disk_pending = threading.Lock(), {}
    found.settings = SimpleNamespace(disk_reserve="0", disk_ratio=1.0, folder=str(tmp_path))
    return found


def role(disk: int | None) -> Role:
    return Role(name="r", cpus=1, memory=256 * MiB, images=("pytorch",), disk=disk)


def start(rt: HubRuntime, user: str, told: list[str] | None = None) -> HomeStart:
    return HomeStart(rt, user, user, LOG, lambda m, _p: (told if told is not None else
                                                          []).append(m))


async def test_a_home_is_made_told_and_given_its_use_file(tmp_path):
    homes = Homes(tmp_path, 100 * MiB, {"bob": 40 * MiB})
    told: list[str] = []
    bind = await start(runtime(tmp_path, homes), "alice", told).prepare(role(20 * MiB))
    assert (bind.path, bind.size, bind.over_size) == (str(tmp_path / "alice"), 20 * MiB, "")
    assert told == ["Home made: 20 MiB"]
    document = json.loads((Path(bind.use_folder) / "home.json").read_text())
    assert Path(bind.use_folder) == tmp_path / "home-use" / "alice"
    assert {k: document[k] for k in ("version", "used", "limit", "mechanism", "full")} == {
        "version": 1, "used": 0, "limit": 20 * MiB, "mechanism": "btrfs", "full": False}
    assert await start(runtime(tmp_path, homes), "alice").prepare(role(None)) is None


async def test_a_home_over_its_size_is_told_and_started(tmp_path):
    homes = Homes(tmp_path, 100 * MiB, {"alice": 64 * MiB})
    told: list[str] = []
    bind = await start(runtime(tmp_path, homes), "alice", told).prepare(role(10 * MiB))
    assert "nothing was deleted" in bind.over_size and told[-1] == bind.over_size


async def test_a_home_that_does_not_fit_is_refused_before_it_is_made(tmp_path):
    homes = Homes(tmp_path, 100 * MiB, {"bob": 70 * MiB})
    with pytest.raises(web.HTTPError) as e:
        await start(runtime(tmp_path, homes), "alice").prepare(role(40 * MiB))
    assert e.value.status_code == 503
    assert e.value.log_message.startswith(
        "The homes' disk is fully reserved: 70 MiB of 100 MiB is promised to 1 home; this "
        "role's home needs 40 MiB. Your server cannot start")
    assert "alice" not in homes.limits and not (tmp_path / "home-use" / "alice").exists()


async def test_two_starts_at_once_never_take_the_same_room(tmp_path):
    """The first home is still being made (its prepare waits) when the second start
    decides: the first one's size counts as promised, so only one fits."""
    homes = Homes(tmp_path, 100 * MiB)
    homes.gate.clear()
    rt = runtime(tmp_path, homes)
    first = asyncio.ensure_future(start(rt, "alice").prepare(role(60 * MiB)))
    assert await asyncio.to_thread(homes.entered.wait, 10)
    with pytest.raises(web.HTTPError) as e:
        await start(rt, "bob").prepare(role(60 * MiB))
    assert e.value.status_code == 503 and "60 MiB of 100 MiB" in e.value.log_message
    homes.gate.set()
    assert (await first).size == 60 * MiB and rt.disk_pending == {}


async def test_homes_that_cannot_be_kept_or_made_refuse_the_start(tmp_path, caplog):
    with pytest.raises(web.HTTPError) as e:
        await start(runtime(tmp_path, None, "no btrfs here"), "alice").prepare(role(MiB * 64))
    assert e.value.status_code == 503 and "cannot keep homes at a size" in e.value.log_message
    homes = Homes(tmp_path, 100 * MiB)
    homes.fail = "mkfs.ext4 failed (exit 1): no room"
    rt = runtime(tmp_path, homes)
    with pytest.raises(web.HTTPError) as e:
        await start(rt, "alice").prepare(role(MiB * 64))
    assert e.value.status_code == 500 and "could not be made ready" in e.value.log_message
    assert "mkfs.ext4 failed" in caplog.text  # the details are the admin's
    assert rt.disk_pending == {}  # a failed home promises nothing
