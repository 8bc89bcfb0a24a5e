"""QuotaSpawner's engine calls run in a pool of ``engine_threads`` threads shared by every
server of the hub process (spawner/docker/engine.py ``engine_pool``), where DockerSpawner
runs them one at a time in a single thread: a class's stops go side by side, never more
than the bound at once."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from traitlets import TraitError

from spawner import QuotaSpawner
from spawner.docker.engine import engine_pool

HOLD = 10.0  # seconds a stop waits for the others: far beyond any side-by-side start


class Engine:
    """An engine whose ``stop`` returns only once ``together`` stops are under way at
    once (a barrier), and counts the most that ever were."""

    def __init__(self, together: int):
        self.barrier = threading.Barrier(together, timeout=HOLD)
        self.lock = threading.Lock()
        self.now = self.most = 0

    def stop(self, container: str) -> None:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
        try:
            self.barrier.wait()
        finally:
            with self.lock:
                self.now -= 1


def spawners(count: int, **settings: Any) -> list[QuotaSpawner]:
    found = []
    for i in range(count):
        spawner = QuotaSpawner(**settings)
        spawner.object_id = f"c{i}"
        found.append(spawner)
    return found


async def test_a_class_of_stops_runs_side_by_side(monkeypatch):
    engine = Engine(together=6)
    monkeypatch.setattr(QuotaSpawner, "_client", engine)
    servers = spawners(6, engine_threads=6)
    await asyncio.gather(*(s.stop_object() for s in servers))  # DockerSpawner's stop call
    assert engine.most == 6


async def test_never_more_than_the_bound_at_once(monkeypatch):
    engine = Engine(together=2)
    monkeypatch.setattr(QuotaSpawner, "_client", engine)
    servers = spawners(8, engine_threads=2)
    await asyncio.gather(*(s.stop_object() for s in servers))
    assert engine.most == 2


def test_one_pool_per_size_for_every_server():
    a, b = spawners(2, engine_threads=3)
    assert a.executor is b.executor is engine_pool(3)
    assert a.executor._max_workers == 3
    assert QuotaSpawner().engine_threads == 8


@pytest.mark.parametrize("value", [0, -1, 65])
def test_a_bound_out_of_range_is_refused(value):
    with pytest.raises(TraitError, match="engine_threads"):
        QuotaSpawner(engine_threads=value)
