"""One pattern for what every spawner of a hub process shares: made once per key."""

from __future__ import annotations

import asyncio
import threading

from spawner.common.registry import Registry
from spawner.docker.config import QuotaSpawnerConfig
from spawner.quota.store import QuotaStore


def test_made_once_per_key_from_many_threads():
    registry: Registry[str, object] = Registry()
    made = []

    def make() -> object:
        made.append(1)
        return object()

    got: list[object] = []
    threads = [threading.Thread(target=lambda: got.append(registry.get("k", make)))
               for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(made) == 1 and len({id(g) for g in got}) == 1
    assert registry.get("other", make) is not got[0] and len(made) == 2


async def test_made_once_when_many_spawns_await_it():
    registry: Registry[str, object] = Registry()
    made = []

    async def make() -> object:
        made.append(1)
        await asyncio.sleep(0.01)  # a thread or the engine, in the real pool
        return object()

    got = await asyncio.gather(*(registry.aget("pool", make) for _ in range(20)))
    assert len(made) == 1 and len({id(g) for g in got}) == 1
    assert registry.values() == [got[0]]


def test_quota_stores_are_one_per_file(tmp_path):
    path = tmp_path / "q.yaml"
    assert QuotaStore.for_path(str(path)) is QuotaStore.for_path(str(tmp_path / "." / "q.yaml"))
    assert QuotaStore.for_path(str(path)) is not QuotaStore.for_path(str(tmp_path / "r.yaml"))


def test_start_cpus():
    config = QuotaSpawnerConfig()
    assert config.start_cpus(16) == 16  # all of the engine's CPUs
    assert config.start_cpus(0) is None  # the engine's CPUs unknown: no boost
    config.cpu_boost_cpus = 4
    assert config.start_cpus(16) == 4 and config.start_cpus(2) == 2 and config.start_cpus(0) == 4
    config.cpu_boost = False
    assert config.start_cpus(16) is None
