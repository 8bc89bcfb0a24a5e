"""GPU-hour budgets of running servers on Kubernetes: the hub's event log and budget duties
(spawner/kube/duties.py), as the Docker hub's (spawner/usage/duties.py).

QuotaKubeSpawner runs KubeSpawner's own ``_start``, ``poll`` and ``stop`` against
kube_spawners' ``FakeCluster``; the hub's stop of a server is ``HubUser``, what
JupyterHub's ``User.stop`` does with a spawner. The ledger is real: a SQLite file
here, a fresh PostgreSQL database in test_kube_budgets_postgres.py. The events are
read back from the ledger's events table, where the watchdog reads them.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("kubespawner")

from jupyterhub.objects import Server  # noqa: E402
from kube_spawners import FakeCluster, MockUser, sessions, spawner_on  # noqa: E402
from kubernetes_asyncio.client.rest import ApiException  # noqa: E402
from quota_tables import budget_table  # noqa: E402
from sqlalchemy.exc import OperationalError  # noqa: E402

from spawner.kube.spawner import QuotaKubeSpawner  # noqa: E402
from spawner.policy import hub as hub_object  # noqa: E402
from spawner.usage import duties as usage_duties  # noqa: E402
from spawner.usage import event_store  # noqa: E402
from spawner.usage.budgets import SPENT, WARNING  # noqa: E402
from spawner.usage.duties import BudgetDuties  # noqa: E402
from spawner.usage.event_log import TABLE  # noqa: E402
from spawner.usage.ledger import BUDGET, STOPPED, Ledger  # noqa: E402

pytestmark = pytest.mark.usefixtures("no_cluster")  # tests/service/conftest.py

HUB = "test-hub"  # kube_spawners.make's hub id
LOG = logging.getLogger("test.kube-budgets")


@pytest.fixture
def ledger(ledger_url: str):
    ledger = Ledger(ledger_url, LOG)
    yield ledger
    ledger.dispose()


@pytest.fixture(autouse=True)
def closed(monkeypatch: pytest.MonkeyPatch):
    """Each hub process this test made ends with it: its duties, its ledger's connections.
    (Torn down before monkeypatch puts the class's registry back.)"""
    yield
    end_hub_process()


def end_hub_process() -> None:
    """The hub process's end: its duties stop, its ledger's connections close."""
    for hub in hub_object.HUBS.values():
        hub.close()
        hub.events.flush()
        if hub.ledger is not None:
            hub.ledger.dispose()


@pytest.fixture
def no_timer(monkeypatch: pytest.MonkeyPatch) -> list[BudgetDuties]:
    """The budget duties do not check on their own timer: each test checks when it says.
    The duties that were started, in order."""
    started: list[BudgetDuties] = []
    monkeypatch.setattr(BudgetDuties, "start", lambda duties: started.append(duties))
    return started


def spend(ledger: Ledger, user: str, hours: float) -> None:
    """A finished session of ``user`` that reserved exactly ``hours`` GPU-hours today
    (UTC), ending now: on as many GPUs as it takes to fit them since midnight."""
    now = time.time()
    today = max(1.0, now % 86400 - 1)  # seconds since midnight
    gpus = math.ceil(hours * 3600 / today)
    span = hours * 3600 / gpus
    name = f"old-{user}-{hours}"
    ledger.open(hub=HUB, user=user, container=name, role="gpu", image="pytorch",
                cpu_limit=1, mem_limit=2**30, requested=now - span)
    ledger.set_gpus(HUB, name, [], "exclusive", None, count=gpus)
    ledger.started(HUB, name, "uid", when=now - span)
    ledger.ready(HUB, name, when=now - span)
    ledger.close(HUB, name, STOPPED, when=now)


def quota(tmp_path: Path, budget: str) -> Path:
    """A table with a CPU and a GPU role, and alice's own budget of 2 GPU-hours a day."""
    path = tmp_path / "q.yaml"
    path.write_text(budget_table(f"  users:\n    alice: {{gpu_hours: 2, per: day{budget}}}\n"))
    return path


class FakeProxy:
    def __init__(self) -> None:
        self.deleted: list[str] = []

    async def delete_user(self, user: Any, server_name: str) -> None:
        self.deleted.append(server_name)


class HubUser:
    """What JupyterHub's ``User.stop`` does with the server's spawner: polls it, stops
    it while it runs, and forgets its server; each stop recorded."""

    def __init__(self, spawner: Any, fail: BaseException | None = None):
        self.spawner = spawner
        self.stopped: list[str] = []
        self.fail = fail  # raised by the first stop: the cluster or the hub failing

    async def stop(self, server_name: str) -> None:
        self.stopped.append(server_name)
        if self.fail is not None:
            fail, self.fail = self.fail, None
            raise fail
        if await self.spawner.poll() is None:
            await self.spawner.stop()
        self.spawner.server = None


async def hub_start(spawner: Any, fail: BaseException | None = None) -> HubUser:
    """Start the spawner's server as the hub does (its ``_start``, then the server it
    answers at); the hub's stop of it is the returned HubUser's."""
    url = await spawner.start()
    spawner.server = Server.from_url(url)
    hub = HubUser(spawner, fail)
    spawner.user.stop = hub.stop
    spawner.user.settings = {"proxy": FakeProxy()}
    return hub


def restarted(monkeypatch: pytest.MonkeyPatch, url: str, path: Path, cluster: FakeCluster,
              state: dict[str, Any]) -> Any:
    """A new hub process: its own registry, the same cluster, a spawner for the running
    server made from its saved state."""
    end_hub_process()
    spawner, _ = spawner_on(monkeypatch, url, path, user="alice", groups=())
    spawner.api = cluster
    monkeypatch.setitem(QuotaKubeSpawner.reflectors, spawner._get_reflector_key("pods"),
                        SimpleNamespace(pods=cluster.pods))
    spawner.load_state(state)
    spawner.server = Server(ip="10.0.0.7", port=8888)
    return spawner


def session_of(ledger: Ledger, spawner: Any) -> dict[str, Any]:
    (row,) = [r for r in sessions(ledger) if r["container"] == spawner.pod_name]
    return row


def events(ledger: Ledger, hub: Any) -> list[dict[str, Any]]:
    """The budget events in the ledger's events table, once the hub's log wrote them."""
    hub.events.flush()
    found, _ = event_store.read_after(ledger.engine, 0)
    return [e for e in found if e["event"] in (WARNING, SPENT)]


# --- warned at 90% -------------------------------------------------------------------------


async def test_a_gpu_server_past_90_percent_is_warned_once_across_a_restart(
        monkeypatch, ledger_url, ledger, tmp_path, no_timer):
    path = quota(tmp_path, "")
    spend(ledger, "alice", 1.85)  # 92.5% with the server about to start
    spawner, cluster = spawner_on(monkeypatch, ledger_url, path, user="alice", groups=())
    spawner.user_options = {"profile": "gpu"}
    await hub_start(spawner)
    hub = await spawner.kube_hub()
    assert hub is not None and hub.events.where == TABLE and hub.events.path == ""
    await asyncio.sleep(0)
    assert no_timer == [hub.budgets]  # started with the ledger, once

    await hub.budgets.check(time.time())
    (warning,) = events(ledger, hub)
    assert (warning["event"], warning["hub"], warning["user"], warning["stopping"]) == (
        WARNING, HUB, "alice", False)
    assert warning["container"] == spawner.pod_name and warning["role"] == "gpu"
    assert warning["text"].startswith("Your GPU-hour budget is 92% used")
    await hub.budgets.check(time.time())
    assert len(events(ledger, hub)) == 1  # once

    # the hub restarts: new duties, the same memory in the ledger
    again = restarted(monkeypatch, ledger_url, path, cluster, spawner.get_state())
    assert await again.poll() is None  # JupyterHub polls its servers as it starts
    new_hub = await again.kube_hub()
    assert new_hub is not hub and new_hub.spawners[again.pod_name] is again
    await new_hub.budgets.check(time.time())
    assert len(events(ledger, new_hub)) == 1  # told once, across the restart
    assert cluster.deleted == [] and session_of(ledger, spawner)["stopped"] is None  # runs on


# --- spent ---------------------------------------------------------------------------------


async def test_a_spent_budget_with_stop_stops_the_server_the_hubs_way(
        monkeypatch, ledger_url, ledger, tmp_path, no_timer):
    path = quota(tmp_path, ", stop: true")
    spawner, cluster = spawner_on(monkeypatch, ledger_url, path, user="alice", groups=())
    spawner.user_options = {"profile": "gpu"}
    user = await hub_start(spawner)  # before the budget was spent: the start goes through
    spend(ledger, "alice", 2.5)
    hub = await spawner.kube_hub()

    await hub.budgets.check(time.time())
    await asyncio.gather(*hub.budgets._stops)  # the stop, under way
    (spent,) = events(ledger, hub)
    assert (spent["event"], spent["user"], spent["stopping"]) == (SPENT, "alice", True)
    assert spent["container"] == spawner.pod_name
    assert user.stopped == [""] and spawner.user.settings["proxy"].deleted == [""]
    assert cluster.deleted == [spawner.pod_name]
    row = session_of(ledger, spawner)
    assert row["reason"] == BUDGET and row["stopped"] is not None

    await hub.budgets.check(time.time())  # nothing more to stop or tell
    assert hub.budgets._stops == set() and user.stopped == [""]
    assert len(events(ledger, hub)) == 1


async def test_a_spent_budget_without_stop_keeps_the_server_running(
        monkeypatch, ledger_url, ledger, tmp_path, no_timer):
    path = quota(tmp_path, "")
    spawner, cluster = spawner_on(monkeypatch, ledger_url, path, user="alice", groups=())
    spawner.user_options = {"profile": "gpu"}
    user = await hub_start(spawner)
    spend(ledger, "alice", 2.5)
    hub = await spawner.kube_hub()

    await hub.budgets.check(time.time())
    (spent,) = events(ledger, hub)
    assert (spent["event"], spent["stopping"]) == (SPENT, False)
    assert "Your running servers keep running" in spent["text"]
    assert hub.budgets._stops == set() and user.stopped == [] and cluster.deleted == []
    assert session_of(ledger, spawner)["stopped"] is None
    assert await spawner.poll() is None


async def test_only_gpu_servers_are_stopped(monkeypatch, ledger_url, ledger, tmp_path,
                                            no_timer):
    path = quota(tmp_path, ", stop: true")
    spawner, cluster = spawner_on(monkeypatch, ledger_url, path, user="alice", groups=())
    spawner.user_options = {"profile": "cpu"}
    user = await hub_start(spawner)
    spend(ledger, "alice", 2.5)
    hub = await spawner.kube_hub()
    await hub.budgets.check(time.time())
    assert events(ledger, hub) == [] and user.stopped == [] and cluster.deleted == []


# --- failures ----------------------------------------------------------------------------


async def test_a_stop_that_fails_is_logged_and_tried_again(monkeypatch, ledger_url, ledger,
                                                           tmp_path, no_timer, caplog):
    path = quota(tmp_path, ", stop: true")
    spawner, cluster = spawner_on(monkeypatch, ledger_url, path, user="alice", groups=())
    spawner.user_options = {"profile": "gpu"}
    user = await hub_start(spawner, fail=ApiException(status=500, reason="Internal Error"))
    spend(ledger, "alice", 2.5)
    hub = await spawner.kube_hub()

    with caplog.at_level(logging.ERROR):
        await hub.budgets.check(time.time())
        await asyncio.gather(*hub.budgets._stops)
    assert f"Could not stop {spawner.pod_name} (its GPU-hour budget is spent) through the " \
           "hub: (500)" in caplog.text
    assert cluster.deleted == [] and session_of(ledger, spawner)["stopped"] is None

    await hub.budgets.check(time.time())  # the next check stops it
    await asyncio.gather(*hub.budgets._stops)
    assert user.stopped == ["", ""] and cluster.deleted == [spawner.pod_name]
    assert session_of(ledger, spawner)["reason"] == BUDGET
    assert len(events(ledger, hub)) == 1  # told once


async def test_a_pod_no_server_of_the_hub_runs_is_said_once(monkeypatch, ledger_url, ledger,
                                                            tmp_path, no_timer, caplog):
    path = quota(tmp_path, ", stop: true")
    spawner, _ = spawner_on(monkeypatch, ledger_url, path, user="alice", groups=())
    hub = await spawner.kube_hub()
    ledger.open(hub=HUB, user="alice", container="jupyter-gone", role="gpu",
                image="pytorch", cpu_limit=1, mem_limit=2**30)
    ledger.set_gpus(HUB, "jupyter-gone", [], "exclusive", None, count=1)
    spend(ledger, "alice", 2.5)
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            await hub.budgets.check(time.time())
            await asyncio.gather(*hub.budgets._stops)
    assert caplog.text.count("Could not stop pod jupyter-gone") == 1
    assert hub.budgets._stopping == set()


# --- on the hub's own timer ----------------------------------------------------------------


async def test_the_duties_start_once_and_keep_going_when_the_ledger_fails(
        monkeypatch, ledger_url, ledger, tmp_path, caplog):
    path = quota(tmp_path, "")
    spend(ledger, "alice", 1.85)
    spawner, _ = spawner_on(monkeypatch, ledger_url, path, user="alice", groups=(),
                            usage_check_interval=0.05)
    down = {"checks": 2}
    real = usage_duties.running_gpu_sessions

    def flaky(*args: Any, **kwargs: Any) -> Any:
        if down["checks"] > 0:
            down["checks"] -= 1
            raise OperationalError("SELECT", {}, Exception("the database is down"))
        return real(*args, **kwargs)

    monkeypatch.setattr(usage_duties, "running_gpu_sessions", flaky)
    spawner.user_options = {"profile": "gpu"}
    with caplog.at_level(logging.INFO):
        await hub_start(spawner)
        hub = await spawner.kube_hub()
        try:
            for _ in range(200):  # the timer's checks: two fail, then one warns
                if events(ledger, hub):
                    break
                await asyncio.sleep(0.05)
        finally:
            hub.close()
    (warning,) = events(ledger, hub)
    assert warning["event"] == WARNING and down["checks"] == 0
    assert hub.budgets.interval == 0.05 and hub.budgets._task is not None
    failed = [r.getMessage() for r in caplog.records if "the check failed" in r.getMessage()]
    assert len(failed) == 1  # twice, logged once
    assert failed[0].startswith("GPU-hour budgets: the check failed (OperationalError: ")
    assert "the database is down" in failed[0] and failed[0].endswith("again every 0.05s")
    assert "GPU-hour budgets: the check works again" in caplog.text
    assert "Hub test-hub: event log the ledger's events table; GPU-hour budgets checked " \
           "every 0.05s" in caplog.text


async def test_one_hub_per_process_for_all_its_spawners(monkeypatch, ledger_url, tmp_path,
                                                        no_timer):
    path = quota(tmp_path, "")
    alice, _ = spawner_on(monkeypatch, ledger_url, path, user="alice", groups=())
    hub = await alice.kube_hub()
    bo = QuotaKubeSpawner(hub=alice.hub, config=alice.config, orm_spawner=None, _mock=True,
                          user=MockUser(name="bo", groups=[]))
    assert await bo.kube_hub() is hub and await bo.usage_ledger() is await alice.usage_ledger()
    await asyncio.sleep(0)  # the duties start in a task of their own
    assert no_timer == [hub.budgets]


async def test_the_hub_start_builds_the_hub_object_its_spawners_use(
        monkeypatch, ledger_url, tmp_path, no_timer, caplog):
    """build_at_hub_start (spawner/policy/hub.py), as the Docker hub's config calls it,
    builds the Kubernetes hub object from the configured QuotaKubeSpawner; its duties
    start once JupyterHub says it has started, and the spawners find it built."""
    from jupyterhub.app import JupyterHub

    spawner, _ = spawner_on(monkeypatch, ledger_url, quota(tmp_path, ""), user="alice",
                            groups=())
    app = SimpleNamespace(subapp=None, show_config=False, show_config_json=False,
                          cookie_secret=b"secret", spawner_class=QuotaKubeSpawner,
                          config=spawner.config, hub=spawner.hub, log=LOG,
                          _start_future=asyncio.get_running_loop().create_future())
    monkeypatch.setattr(JupyterHub, "initialized", classmethod(lambda cls: True))
    monkeypatch.setattr(JupyterHub, "instance", classmethod(lambda cls: app))
    with caplog.at_level(logging.INFO, logger=LOG.name):
        hub_object.build_at_hub_start(LOG)
        for _ in range(200):  # the build: the ledger, in threads
            if [h for h in hub_object.HUBS.values() if h.is_built]:
                break
            await asyncio.sleep(0.05)
    (hub,) = hub_object.HUBS.values()
    assert hub.is_built and hub.hub_id == HUB and no_timer == []  # the hub is not up yet
    assert f"Hub {HUB}: event log the ledger's events table" in caplog.text
    app._start_future.set_result(None)  # "JupyterHub is now running"
    await asyncio.sleep(0.05)
    assert no_timer == [hub.budgets]
    assert await spawner.kube_hub() is hub and no_timer == [hub.budgets]  # once


# --- where the events go, and no ledger ------------------------------------------------------


async def test_a_named_events_file_gets_them_too(monkeypatch, ledger_url, ledger, tmp_path,
                                                 no_timer):
    path = quota(tmp_path, "")
    spend(ledger, "alice", 1.85)
    spawner, _ = spawner_on(monkeypatch, ledger_url, path, user="alice", groups=(),
                            state_dir=str(tmp_path), events_file="hub-events.jsonl")
    spawner.user_options = {"profile": "gpu"}
    await hub_start(spawner)
    hub = await spawner.kube_hub()
    assert hub.events.path == str(tmp_path / "hub-events.jsonl")
    await hub.budgets.check(time.time())
    assert len(events(ledger, hub)) == 1
    assert '"event": "budget-warning"' in (tmp_path / "hub-events.jsonl").read_text()


async def test_without_a_ledger_there_are_no_duties(monkeypatch, tmp_path, no_timer):
    spawner, _ = spawner_on(monkeypatch, "none", quota(tmp_path, ""), user="alice", groups=())
    assert await spawner.kube_hub() is None and no_timer == []


def test_the_check_interval_is_the_same_setting_on_both_backends():
    from spawner import QuotaSpawner

    assert QuotaKubeSpawner.class_traits()["usage_check_interval"].default_value == 60.0
    assert QuotaSpawner.class_traits()["usage_check_interval"] is \
        QuotaKubeSpawner.class_traits()["usage_check_interval"]
