"""The hub's polls of one moment share one engine listing (spawner/docker/engine.py
``RunningContainers``): a pre-warmed class asking at once gets its "already running"
answers from one call, not one inspect per container; a container the listing does not
show running is inspected as DockerSpawner does, which says why it stopped."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from spawner import QuotaSpawner
from spawner.docker.engine import RunningContainers

STOPPED = {"Running": False, "ExitCode": 1, "Error": "", "FinishedAt": "then"}


class Engine:
    """Containers c0, c1, ... by id; those in ``stopped`` have exited. Counts its calls."""

    def __init__(self, stopped: set[str] = frozenset()):
        self.stopped = set(stopped)
        self.calls: list[str] = []

    def containers(self, filters: dict[str, Any]) -> list[dict[str, Any]]:
        self.calls.append("containers")
        assert filters["status"] == "running"
        return [{"Id": i} for i in filters["id"] if i not in self.stopped]

    def inspect_container(self, name: str) -> dict[str, Any]:
        self.calls.append("inspect_container")
        cid = "c" + name.rpartition("-")[2]
        return {"Id": cid, "State": STOPPED if cid in self.stopped else {"Running": True}}


def runtime() -> SimpleNamespace:
    return SimpleNamespace(running=RunningContainers(), starting=set(), usage=None,
                           forget=lambda name, why: None)


def servers(count: int, hub: SimpleNamespace, monkeypatch) -> list[QuotaSpawner]:
    async def quota_hub(self: QuotaSpawner) -> SimpleNamespace:
        return hub

    monkeypatch.setattr(QuotaSpawner, "quota_hub", quota_hub)
    found = []
    for i in range(count):
        spawner = QuotaSpawner(user=SimpleNamespace(name=str(i)), prefix="quota", engine_threads=4)
        spawner.object_id = f"c{i}"
        found.append(spawner)
    return found


async def test_a_class_asking_at_once_is_answered_from_one_listing(monkeypatch):
    engine = Engine()
    monkeypatch.setattr(QuotaSpawner, "_client", engine)
    polls = await asyncio.gather(*(s.poll() for s in servers(24, runtime(), monkeypatch)))
    assert polls == [None] * 24
    assert engine.calls == ["containers"]


async def test_a_stopped_container_is_inspected_and_says_why(monkeypatch):
    engine = Engine(stopped={"c1"})
    monkeypatch.setattr(QuotaSpawner, "_client", engine)
    polls = await asyncio.gather(*(s.poll() for s in servers(3, runtime(), monkeypatch)))
    assert polls[0] is None and polls[2] is None
    assert polls[1] == "ExitCode=1, Error='', FinishedAt=then"
    assert sorted(engine.calls) == ["containers", "inspect_container"]


async def test_a_poll_never_gets_a_listing_older_than_itself():
    listed: list[list[str]] = []
    release = asyncio.Event()

    async def docker(method: str, **kwargs: Any) -> list[dict[str, Any]]:
        listed.append(kwargs["filters"]["id"])
        await release.wait()
        return [{"Id": i} for i in kwargs["filters"]["id"]]

    running = RunningContainers()
    first = asyncio.ensure_future(running.running("a", docker))
    await asyncio.sleep(0.01)  # the first listing is sent
    second = asyncio.ensure_future(running.running("b", docker))
    await asyncio.sleep(0.01)
    release.set()
    assert await first and await second
    assert listed == [["a"], ["b"]]  # b waited for a listing sent after it asked


async def test_a_failed_listing_falls_back_to_the_inspect(monkeypatch):
    engine = Engine()

    def broken(filters: dict[str, Any]) -> list[dict[str, Any]]:
        raise RuntimeError("the engine is busy")

    engine.containers = broken  # type: ignore[method-assign]
    monkeypatch.setattr(QuotaSpawner, "_client", engine)
    polls = await asyncio.gather(*(s.poll() for s in servers(2, runtime(), monkeypatch)))
    assert polls == [None, None] and engine.calls == ["inspect_container"] * 2
