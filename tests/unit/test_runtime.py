"""The hub's runtime (spawner/docker/runtime.py) without an engine: one per inventory and
hub id, claims taken before it is built, built once (again after a failure), its parts in
their order, the queue's strategy setting, and the hub-start build that never runs outside
a starting hub."""

from __future__ import annotations

import asyncio
import json
import logging
from types import SimpleNamespace
from typing import Any

import pytest
from runtime_source import HUB, LOG, FakeDocker, Source, source
from traitlets import TraitError

from spawner.common.registry import Registry
from spawner.docker import runtime as hub_runtime
from spawner.docker.config import QuotaSpawnerConfig
from spawner.docker.gpus import start_time_for
from spawner.docker.runtime import HubRuntime, Settings
from spawner.policy import hub as hub_object
from spawner.policy.hub import build_at_hub_start
from spawner.quota.model import Role

G = 2**30


@pytest.fixture(autouse=True)
def fresh_runtimes(monkeypatch):
    monkeypatch.setattr(hub_object, "HUBS", Registry())
    yield
    for runtime in hub_object.HUBS.values():
        runtime.close()


def test_one_runtime_per_inventory_and_hub_id(tmp_path):
    a = source(tmp_path)
    assert Settings.of(a).key == json.dumps([[], False, HUB])  # the pools' key before it
    assert HubRuntime.of(a) is HubRuntime.of(source(tmp_path, state_dir="/elsewhere"))
    assert HubRuntime.of(source(tmp_path, hub_id="other")) is not HubRuntime.of(a)
    declared = source(tmp_path, gpu_inventory=[{"uuid": "GPU-a"}])
    assert HubRuntime.of(declared) is not HubRuntime.of(a)
    assert Settings.of(a).path("x.json") == str(tmp_path / "x.json")


async def test_a_server_claimed_before_the_build_is_never_taken_for_a_zombie(tmp_path, caplog):
    client = FakeDocker(names=("quota-alice", "quota-ghost"))
    spawner = source(tmp_path, client)
    HubRuntime.of(spawner).claim("quota-alice", spawner)  # load_state, at hub start
    with caplog.at_level(logging.WARNING, logger=LOG.name):
        runtime = await HubRuntime.of(spawner).ready(spawner)
    assert runtime.spawners["quota-alice"] is spawner
    warned = [r.getMessage() for r in caplog.records if "has this hub's labels" in r.getMessage()]
    assert [w.split(" (")[0] for w in warned] == ["Container quota-ghost"]
    runtime.forget("quota-alice", "the server stopped")
    assert "quota-alice" not in runtime.claims.known


class FlakySource:
    """A spawner whose engine does not answer the first time it is asked."""

    def __init__(self, tmp_path) -> None:
        vars(self).update({k: v for k, v in vars(source(tmp_path)).items() if k != "client"})
        self.asked = 0

    @property
    def client(self) -> FakeDocker:
        self.asked += 1
        if self.asked == 1:
            raise RuntimeError("the engine does not answer")
        return FakeDocker(info={"SwapLimit": False, "MemoryLimit": True, "NCPU": 4})


async def test_built_once_in_order_and_again_after_a_failure(tmp_path, caplog):
    real = FlakySource(tmp_path)
    runtime = HubRuntime.of(real)
    with pytest.raises(RuntimeError, match="does not answer"):
        await runtime.built(real)
    with caplog.at_level(logging.INFO, logger=LOG.name):
        built = await asyncio.gather(runtime.built(real, "at hub start"), runtime.built(real))
    assert built == [runtime, runtime] and real.asked == 2  # once more, for both
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0].startswith("!")  # docker info: the swap warning, first
    assert messages[1].startswith("GPU inventory: no GPUs")
    # the homes, in one sentence: here the default, Docker volumes
    assert messages[2] == ("Disk is not enforced: no homes' root is set, so homes are Docker "
                           "volumes, which have no size; see docs/disk.md")
    assert messages[3].startswith(f"Hub runtime of hub {HUB} built at hub start: 0 GPUs "
                                  "(none), usage ledger none, event log ")
    assert messages[4] == ("Queue: BestEffortFIFO, fair between users "
                           "(docs/preemption.md#the-queues-strategies)")
    assert runtime.engine_info == {"SwapLimit": False, "MemoryLimit": True, "NCPU": 4}
    assert runtime.nvidia is None and runtime.duties is None and runtime.usage is None
    assert runtime.pool.evictions is runtime.evictor


def test_the_queue_strategy_setting_takes_kueues_names_only():
    assert QuotaSpawnerConfig().queue_strategy == "BestEffortFIFO"
    assert QuotaSpawnerConfig(queue_strategy="strictfifo").queue_strategy == "StrictFIFO"
    with pytest.raises(TraitError, match="BestEffortFIFO"):
        QuotaSpawnerConfig(queue_strategy="LIFO")


async def test_the_queue_strategy_setting_reaches_the_pools_queue(tmp_path):
    spawner = source(tmp_path, queue_strategy="StrictFIFO")
    runtime = await HubRuntime.of(spawner).built(spawner)
    assert runtime.pool.queue.strategy == "StrictFIFO"
    assert runtime.pool.queue.policy == "StrictFIFO, fair between users"


async def test_with_a_ledger_the_duties_start_when_it_is_ready(tmp_path):
    spawner = source(tmp_path, usage_db=f"sqlite:///{tmp_path / 'usage.sqlite'}")
    runtime = await HubRuntime.of(spawner).built(spawner)
    assert runtime.usage is not None and runtime.duties is not None
    assert runtime.reconciler.usage is runtime.usage is runtime.evictor.usage
    assert runtime.duties._task is None  # built, not running before the first sync
    await runtime.ready(spawner)
    assert runtime.duties._task is not None
    # what the duties ask of the hub: its engine, its starting servers, stop_server
    assert runtime.docker_client is spawner.client and runtime.starting is runtime.pool.starting
    assert await runtime.stop_server("quota-gone", "its GPU-hour budget is spent")
    assert spawner.client.removed == ["quota-gone"]  # no spawner holds it: removed


def test_outside_a_starting_hub_nothing_is_built():
    build_at_hub_start(LOG)  # no event loop: a test reading the config
    assert hub_object.HUBS.values() == []

    async def in_a_loop() -> None:  # a loop, but no JupyterHub app: nothing either
        build_at_hub_start(LOG)
        await asyncio.sleep(0.05)
    asyncio.run(in_a_loop())
    assert hub_object.HUBS.values() == []


def test_a_start_that_may_wait_for_gpus_gets_the_time_to_wait():
    roles = {"low": Role("low", 1, G, ("x",), gpus=1, grace_period=120),
             "high": Role("high", 1, G, ("x",), gpus=1, priority=10, queue_timeout=600)}
    runtime = SimpleNamespace(pool=SimpleNamespace(roles=roles, host=None))
    assert start_time_for(Role("cpu", 1, G, ("x",)), runtime) == 0  # type: ignore[arg-type]
    assert start_time_for(roles["low"], runtime) == roles["low"].queue_timeout  # type: ignore[arg-type]
    assert start_time_for(roles["high"], runtime) == 600 + 120 + 60  # type: ignore[arg-type]


def fake_hub(monkeypatch, tmp_path, client: Any) -> SimpleNamespace:
    """A starting JupyterHub as build_at_hub_start finds it: its config's spawner class
    (made with the hub's config and cookie secret), and the future of its start."""

    class Spawner(Source):
        def __init__(self, **kwargs: Any) -> None:
            values = vars(source(tmp_path, client))
            values["hub_id"] = kwargs["user"].settings["cookie_secret"].decode()
            super().__init__(**values)

        hub_class = HubRuntime

    app = SimpleNamespace(subapp=None, show_config=False, show_config_json=False,
                          cookie_secret=HUB.encode(), spawner_class=Spawner, config=None,
                          hub=None, log=LOG, _start_future=None)
    from jupyterhub.app import JupyterHub

    monkeypatch.setattr(JupyterHub, "initialized", classmethod(lambda cls: True))
    monkeypatch.setattr(JupyterHub, "instance", classmethod(lambda cls: app))
    return app


async def test_the_hub_builds_its_runtime_as_it_starts_then_syncs_once_it_is_up(
        monkeypatch, tmp_path, caplog):
    app = fake_hub(monkeypatch, tmp_path, FakeDocker(names=("quota-ghost",)))
    app._start_future = asyncio.get_running_loop().create_future()
    with caplog.at_level(logging.INFO, logger=LOG.name):
        build_at_hub_start(LOG)  # as the config does: scheduled, not awaited
        await asyncio.sleep(0.2)
        (runtime,) = hub_object.HUBS.values()
        assert runtime.hub_id == HUB and runtime.reconciler._ready is False  # not up yet
        app._start_future.set_result(None)  # "JupyterHub is now running"
        await asyncio.sleep(0.2)
    assert runtime.reconciler._ready is True
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith(f"Hub runtime of hub {HUB} built at hub start") for m in messages)
    assert any(m.startswith("Container quota-ghost") for m in messages)  # after the start


async def test_a_failure_at_hub_start_is_logged_and_never_stops_the_hub(
        monkeypatch, tmp_path, caplog):
    class Unreachable:
        def info(self) -> dict[str, Any]:
            raise ConnectionError("the engine does not answer")

        def containers(self, **_: Any) -> list[dict[str, Any]]:
            raise ConnectionError("the engine does not answer")

    app = fake_hub(monkeypatch, tmp_path, Unreachable())
    with caplog.at_level(logging.WARNING, logger=LOG.name):
        build_at_hub_start(LOG)  # built without docker info; its first sync fails
        await asyncio.sleep(0.2)
        monkeypatch.setattr(hub_object, "HUBS", Registry())

        def no_engine(self: Any) -> Any:
            raise RuntimeError("no engine")

        app.spawner_class = type("NoClient", (app.spawner_class,), {"client": property(no_engine)})
        build_at_hub_start(LOG)  # not built at all
        await asyncio.sleep(0.2)
    assert [r.getMessage() for r in caplog.records] == [
        "Could not read docker info: the engine does not answer",
        "GPU inventory: no GPUs (no gpu_inventory is declared and discovery is off)",
        "GPU sync with Docker failed: the engine does not answer",
        "Could not build the hub runtime at hub start (RuntimeError: no engine); the first "
        "spawn tries again"]


async def test_a_hub_of_another_spawner_builds_nothing(monkeypatch, tmp_path):
    fake_hub(monkeypatch, tmp_path, FakeDocker()).spawner_class = object
    build_at_hub_start(LOG)
    await asyncio.sleep(0.05)
    assert hub_object.HUBS.values() == []


class RemoteDocker(FakeDocker):
    base_url = "http://engine.example:2375"


async def test_a_hub_that_cannot_fence_its_notebooks_says_so_at_start(tmp_path, caplog):
    client = RemoteDocker(info={"NCPU": 8, "MemTotal": 16 * G, "CgroupDriver": "cgroupfs",
                                "CgroupVersion": "2"})
    spawner = source(tmp_path, client, notebooks_cgroup=True)
    with caplog.at_level(logging.WARNING, logger=LOG.name):
        runtime = await HubRuntime.of(spawner).built(spawner)
    assert runtime.parent_cgroup is None
    assert "The notebooks' memory is not fenced: the Docker engine is on another machine, " \
           "whose cgroups this hub cannot reach." in caplog.text


async def test_without_the_setting_no_fence_is_tried(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(hub_runtime, "set_up", lambda *a, **k: pytest.fail("tried"))
    spawner = source(tmp_path, FakeDocker(info={"NCPU": 8, "MemTotal": 16 * G}))
    runtime = await HubRuntime.of(spawner).built(spawner)
    assert runtime.parent_cgroup is None and "fenced" not in caplog.text
