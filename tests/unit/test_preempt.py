"""The Evictor's steps without an engine: what it records, runs, stops and recovers, and
how a server is stopped the hub's way.

The Docker client is a small fake that records exec and remove calls; the
e2e tests (tests/e2e/test_e2e_preemption.py) run the same steps on a real engine.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from spawner.contract import PREEMPT_NOTICE
from spawner.docker.evictor import STOP_TIMEOUT, Evictor, preemption_time
from spawner.gpu.allocator import GpuAllocator, GpuRequest
from spawner.gpu.inventory import GpuDevice
from spawner.gpu.pool import Server
from spawner.gpu.preemption import Plan
from spawner.gpu.queue import Ticket
from spawner.quota.model import Role
from spawner.usage.documents import PREEMPTIONS, FolderDocuments
from spawner.usage.event_log import EventLog, read_events

LOG = logging.getLogger("test-preempt")


class FakeDocker:
    """Records exec and remove calls (the engine is what cannot run here)."""

    def __init__(self) -> None:
        self.execs: list[tuple[str, list[str]]] = []
        self.removed: list[str] = []

    def exec_create(self, container: str, cmd: list[str]) -> dict[str, str]:
        self.execs.append((container, cmd))
        return {"Id": str(len(self.execs))}

    def exec_start(self, exec_id: str) -> bytes:
        return b"signalled: 41 42"

    def exec_inspect(self, exec_id: str) -> dict[str, int]:
        return {"ExitCode": 0}

    def remove_container(self, name: str, force: bool = False) -> None:
        self.removed.append(name)


class FakePool:
    """The parts of GpuPool the Evictor uses (and, as ``docker_client``, its engine)."""

    def __init__(self, tmp: Path):
        self.allocator = GpuAllocator([GpuDevice("0", "GPU-0", "Fake", 16 * 2**30)])
        self.allocator.acquire("victim", GpuRequest(1))
        self.servers = {"victim": Server("alice", "train", 0.0)}
        self.roles = {"train": Role("train", 1, 2**30, ("x",), gpus=1, priority=10,
                                    grace_period=0.2)}
        self.hub_id = "hub-1"
        self.events = EventLog(str(tmp / "events.jsonl"))
        self.docker_client = FakeDocker()
        self.released: list[str] = []

    def release(self, owner: str, why: str) -> tuple[str, ...]:
        self.released.append(owner)
        return self.allocator.release(owner)


def evictor_of(pool: FakePool, state: Path, spawners: dict[str, Any] | None = None) -> Evictor:
    """``state``: the preemptions' file (spawner/usage/documents.py) in the folder the evictor keeps."""
    return Evictor(pool, pool.docker_client, FolderDocuments(str(state.parent)),  # type: ignore[arg-type]
                   LOG, spawners=spawners)


def ticket(loop: asyncio.AbstractEventLoop) -> Ticket:
    t = Ticket("jupyter-bob", "bob", "urgent", 100, True, GpuRequest(1), 0, 0.0,
               loop.create_future())
    t.plan = Plan(("victim",), ("GPU-0",), (10, 10, 1, 5))
    return t


def kinds(tmp: Path) -> list[str]:
    return [e["event"] for e in read_events(str(tmp / "events.jsonl"))[0]]


def test_a_victim_is_told_then_stopped_after_its_grace(tmp_path):
    async def run() -> None:
        pool = FakePool(tmp_path)
        evictor = evictor_of(pool, tmp_path / PREEMPTIONS.file)
        evictor.start(ticket(asyncio.get_running_loop()))
        pool.events.flush()
        pending = json.loads((tmp_path / PREEMPTIONS.file).read_text())
        assert [p["container"] for p in pending] == ["victim"]
        assert evictor.waiting_on("jupyter-bob")[0]["user"] == "alice"
        await asyncio.sleep(0.5)
        container, cmd = pool.docker_client.execs[0]
        assert container == "victim" and cmd[:2] == ["/bin/sh", "-c"]
        notice = json.loads(cmd[4])
        assert notice["by"] == "bob" and notice["role"] == "train"
        assert notice["deadline"] - notice["signalled_at"] == pytest.approx(0.2, abs=0.01)
        assert pool.docker_client.removed == ["victim"]  # no spawner: removed directly
        assert pool.released == ["victim"]
        pool.events.flush()
        assert json.loads((tmp_path / PREEMPTIONS.file).read_text()) == []
    asyncio.run(run())
    assert kinds(tmp_path) == ["preemption", "preempted"]


def test_a_call_off_removes_the_notice_and_stops_nothing(tmp_path):
    async def run() -> None:
        pool = FakePool(tmp_path)
        pool.roles["train"] = Role("train", 1, 2**30, ("x",), gpus=1, priority=10,
                                   grace_period=30)
        evictor = evictor_of(pool, tmp_path / PREEMPTIONS.file)
        t = ticket(asyncio.get_running_loop())
        evictor.start(t)
        await asyncio.sleep(0.1)
        evictor.call_off(t, ("victim",), "bob got a GPU another way")
        await asyncio.sleep(0.2)
        assert pool.docker_client.execs[-1][1][2] == 'rm -f "$1"'
        assert pool.docker_client.execs[-1][1][4] == PREEMPT_NOTICE
        assert pool.docker_client.removed == [] and pool.released == []
        pool.events.flush()
    asyncio.run(run())
    assert kinds(tmp_path) == ["preemption", "preemption-withdrawn"]
    withdrawn = read_events(str(tmp_path / "events.jsonl"))[0][-1]
    assert withdrawn["why"] == "bob got a GPU another way"


def test_after_a_crash_the_restarted_hub_calls_off_what_was_in_its_grace(tmp_path):
    state = tmp_path / PREEMPTIONS.file
    state.write_text(json.dumps([{"container": "victim", "user": "alice", "role": "train",
                                  "by": "bob"}]))

    async def run() -> None:
        pool = FakePool(tmp_path)
        await evictor_of(pool, state).recover()
        assert [c for c, _ in pool.docker_client.execs] == ["victim"]
        assert pool.docker_client.removed == []
        pool.events.flush()
    asyncio.run(run())
    withdrawn = read_events(str(tmp_path / "events.jsonl"))[0]
    assert [e["event"] for e in withdrawn] == ["preemption-withdrawn"]
    assert "the hub restarted during the grace period" in withdrawn[0]["why"]
    assert json.loads(state.read_text()) == []


class FakeUser:
    """A hub user whose server the Evictor stops the hub's way: proxy route, then stop."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.routes_deleted: list[str] = []
        self.stopped: list[str] = []
        self.settings = {"proxy": self}

    async def delete_user(self, user: Any, name: str) -> None:
        self.routes_deleted.append(name)

    async def stop(self, name: str) -> None:
        if self.fail:
            raise RuntimeError("the hub could not stop it")
        self.stopped.append(name)


def test_a_server_is_stopped_through_its_spawner_else_its_container_is_removed(tmp_path):
    async def run() -> None:
        pool = FakePool(tmp_path)
        user = FakeUser()
        spawner = SimpleNamespace(pending=None, server=object(), name="", user=user)
        evictor = evictor_of(pool, tmp_path / PREEMPTIONS.file, {"victim": spawner})
        assert await evictor.stop_server("victim", "preempted")
        assert (user.routes_deleted, user.stopped) == ([""], [""])
        assert pool.docker_client.removed == []  # the hub's way: its spawner removes it
        user.fail = True
        assert await evictor.stop_server("victim", "its GPU-hour budget is spent")
        assert pool.docker_client.removed == ["victim"]
        assert await evictor.stop_server("unknown", "preempted")  # no spawner: removed
        assert pool.docker_client.removed == ["victim", "unknown"]
    asyncio.run(run())


def test_how_long_a_start_waits_for_the_preemption_made_for_it(tmp_path):
    roles = {"a": Role("a", 1, 2**30, ("x",), grace_period=30),
             "b": Role("b", 1, 2**30, ("x",), grace_period=120)}
    assert preemption_time(roles) == 120 + STOP_TIMEOUT
    assert preemption_time({}) == STOP_TIMEOUT

    async def run() -> None:
        pool = FakePool(tmp_path)
        pool.roles["train"] = Role("train", 1, 2**30, ("x",), gpus=1, priority=10,
                                   grace_period=30)
        evictor = evictor_of(pool, tmp_path / PREEMPTIONS.file)
        assert evictor.stops_by("jupyter-bob") is None
        t = ticket(asyncio.get_running_loop())
        evictor.start(t)
        assert evictor.stops_by("jupyter-bob") == pytest.approx(
            time.time() + 30 + STOP_TIMEOUT, abs=1)
        assert evictor.stops_by("someone-else") is None
        # called off before its task ever ran (in the dispatch that planned it, say):
        # withdrawn all the same, and nothing left pending
        evictor.call_off(t, ("victim",), "bob got a GPU in the same dispatch")
        await asyncio.sleep(0.1)
        assert evictor.stops_by("jupyter-bob") is None and evictor.waiting_on("jupyter-bob") == []
        assert pool.docker_client.execs[-1][1][2] == 'rm -f "$1"'  # the notice, if any
        assert pool.docker_client.removed == [] and pool.released == []
        pool.events.flush()
        assert json.loads((tmp_path / PREEMPTIONS.file).read_text()) == []
    asyncio.run(run())
    assert kinds(tmp_path) == ["preemption", "preemption-withdrawn"]
    assert read_events(str(tmp_path / "events.jsonl"))[0][-1]["why"] == (
        "bob got a GPU in the same dispatch")
