"""One hub object for both backends (spawner/policy/hub.py): the Docker hub's runtime and
the Kubernetes hub are each a ``QuotaHub``, kept in one registry and built the same way
(the ledger and its writer, the event log, the shared documents, the duties), each
adding only its own; the hub's build at hub start serves either spawner, and JupyterHub's
private ``_start_future`` is read in one place. The lifecycle both spawners share is
typed against ``QuotaSpawnerProtocol`` (spawner/policy/spawner.py), which both satisfy,
and no method of the package takes ``self: Any``."""

from __future__ import annotations

import ast
import asyncio
import inspect
import logging
import textwrap
import typing
from dataclasses import fields
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from spawner.common.registry import Registry
from spawner.docker.choices import DockerQuotaSpawner
from spawner.docker.network import HostNetworkSpawner
from spawner.docker.runtime import HubRuntime, Settings
from spawner.kube.duties import KubeHub, KubeSettings
from spawner.kube.options import KubeOptions
from spawner.policy import hub as hub_object
from spawner.policy.hub import QuotaHub, build_at_hub_start
from spawner.policy.spawner import QuotaSpawnerProtocol
from spawner.quota.store import QuotaStore
from spawner.usage.documents import DatabaseDocuments, FolderDocuments
from spawner.usage.duties import BudgetDuties, UsageDuties
from spawner.usage.event_log import TABLE
from spawner.usage.ledger import Ledger

PACKAGE = Path(__file__).resolve().parents[2] / "spawner"
HUB = "hub-one"
LOG = logging.getLogger("test.hub-object")


@pytest.fixture(autouse=True)
def fresh_hubs(monkeypatch):
    monkeypatch.setattr(hub_object, "HUBS", Registry())
    yield
    for hub in hub_object.HUBS.values():
        hub.close()
        if hub.ledger is not None:
            hub.events.flush()
            hub.ledger.dispose()


class Engine:
    """A Docker engine with no containers, as the runtime's build and first sync ask it."""

    def info(self) -> dict[str, Any]:
        return {"SwapLimit": True, "NCPU": 4}

    def containers(self, **_: Any) -> list[dict[str, Any]]:
        return []


DEFAULTS = dict(  # the settings both spawners have, and QuotaSpawner's own
    hub_id=HUB, quota_source="file", quota_table_name="default", events_file="",
    usage_check_interval=3600.0, gpu_inventory=[], gpu_discovery=False,
    gpu_sync_interval=3600.0, zombie_grace_period=300.0, usage_retention_days=0.0,
    host_admission=False, queue_strategy="BestEffortFIFO", host_cpus=0.0, host_memory="",
    host_reserve_cpus=1.0, host_reserve_memory="", cpu_overcommit=4.0, memory_overcommit=1.0,
    notebooks_cgroup=False, home_root="", home_mechanism="auto", home_image_dir="",
    disk_ratio=1.0, disk_reserve="")


def spawner_of(hub_class: type[QuotaHub], tmp_path: Path, **settings: Any) -> Any:
    """A spawner as its hub object reads it: the settings of ``hub_class``, a log, on
    Docker the engine's client, and on Kubernetes its checked ``kube_options``."""
    values = {**DEFAULTS, "quota_file": str(tmp_path / "quotas.yaml"),
              "state_dir": str(tmp_path),
              "usage_db": f"sqlite:///{tmp_path / 'usage.sqlite'}", **settings}
    names = {f.name for f in fields(hub_class.settings_class)}
    return SimpleNamespace(log=LOG, client=Engine(), hub_class=hub_class,
                           options=KubeOptions(home_storage_class="fast-ssd"),
                           **{k: v for k, v in values.items() if k in names})


@pytest.mark.parametrize("hub_class, duties", [(HubRuntime, UsageDuties),
                                               (KubeHub, BudgetDuties)])
async def test_each_backends_hub_is_the_one_hub_object_built_the_same_way(
        hub_class, duties, tmp_path):
    spawner = spawner_of(hub_class, tmp_path)
    hub = hub_class.of(spawner)
    assert isinstance(hub, QuotaHub) and hub_class.of(spawner) is hub
    assert hub_object.HUBS.values() == [hub]  # one registry for both backends
    assert await hub.built(spawner) is hub
    # the parts every hub object has, made the same way
    assert isinstance(hub.ledger, Ledger) and hub.usage is not None
    assert hub.usage.ledger is hub.ledger
    assert hub.events.where == TABLE and hub.events.path == ""
    assert isinstance(hub.documents, DatabaseDocuments)
    assert hub.documents.hub == HUB and isinstance(hub.documents.fallback, FolderDocuments)
    assert type(hub.duties) is duties
    assert hub.table_store() is QuotaStore.for_path(spawner.quota_file)  # the spawners'
    # a server claimed is stopped through its spawner
    server = Server()
    hub.claim("jupyter-ada", server)
    assert hub.spawners["jupyter-ada"] is server


class Server:
    """A spawner as the hub's stop of its server reads it (``HubServer``)."""

    user = SimpleNamespace(settings={})
    name = ""
    pending: str | None = "spawn"
    server = None


@pytest.mark.parametrize("hub_class", [HubRuntime, KubeHub])
async def test_without_a_ledger_the_hub_object_keeps_its_events_in_the_state_folder(
        hub_class, tmp_path):
    spawner = spawner_of(hub_class, tmp_path, usage_db="none")
    hub = await hub_class.of(spawner).built(spawner)
    assert hub.ledger is None and hub.usage is None and hub.duties is None
    assert hub.events.where == str(tmp_path / "quota-spawner-events.jsonl")
    assert isinstance(hub.documents, FolderDocuments)


def test_each_backend_adds_only_its_own_settings():
    shared = {f.name for f in fields(hub_object.HubSettings)}
    assert {f.name for f in fields(KubeSettings)} == shared
    docker = {f.name for f in fields(Settings)} - shared
    assert docker and all(not name.startswith(("usage_db", "events", "quota_", "state"))
                          for name in docker)


def started_hub(monkeypatch: pytest.MonkeyPatch, spawner_class: type) -> SimpleNamespace:
    """A starting JupyterHub as build_at_hub_start finds it: its configured spawner
    class, its cookie secret, and the future of its start."""
    app = SimpleNamespace(subapp=None, show_config=False, show_config_json=False,
                          cookie_secret=HUB.encode(), spawner_class=spawner_class,
                          config=None, hub=None, log=LOG,
                          _start_future=asyncio.get_running_loop().create_future())
    from jupyterhub.app import JupyterHub

    monkeypatch.setattr(JupyterHub, "initialized", classmethod(lambda cls: True))
    monkeypatch.setattr(JupyterHub, "instance", classmethod(lambda cls: app))
    return app


async def test_the_hub_start_builds_the_kubernetes_hub_too_and_its_duties_wait_for_it(
        monkeypatch, tmp_path, caplog):
    started: list[BudgetDuties] = []
    monkeypatch.setattr(BudgetDuties, "start", lambda duties: started.append(duties))

    class Spawner:  # the configured spawner class, made with the hub's config
        hub_class = KubeHub

        def __init__(self, **kwargs: Any) -> None:
            vars(self).update(vars(spawner_of(KubeHub, tmp_path)))
            self.hub_id = kwargs["user"].settings["cookie_secret"].decode()

    app = started_hub(monkeypatch, Spawner)
    with caplog.at_level(logging.INFO, logger=LOG.name):
        build_at_hub_start(LOG)
        await asyncio.sleep(0.3)
        (hub,) = hub_object.HUBS.values()
        assert isinstance(hub, KubeHub) and hub.hub_id == HUB and started == []
        app._start_future.set_result(None)  # "JupyterHub is now running"
        await asyncio.sleep(0.05)
    assert started == [hub.budgets]
    assert f"Hub {HUB}: event log the ledger's events table; GPU-hour budgets checked " \
           "every 3600s" in caplog.text
    # what a home is there, in one sentence, as the Docker hub says its mechanism
    assert "Homes are PersistentVolumeClaims of storage class 'fast-ssd', each sized by " \
           "its role's disk (10 GiB for a role without one); whether a full claim refuses " \
           "writes depends on the storage class's driver" in caplog.text


async def test_a_hub_that_failed_to_start_starts_no_duties(monkeypatch, tmp_path):
    app = started_hub(monkeypatch, type("Spawner", (), {
        "hub_class": HubRuntime,
        "__init__": lambda self, **kw: vars(self).update(vars(spawner_of(HubRuntime,
                                                                         tmp_path)))}))
    build_at_hub_start(LOG)
    await asyncio.sleep(0.3)
    (runtime,) = hub_object.HUBS.values()
    app._start_future.set_exception(RuntimeError("the proxy did not start"))
    await asyncio.sleep(0.05)
    assert runtime.is_built and runtime.reconciler._ready is False
    assert runtime.duties is not None and runtime.duties._task is None


def test_jupyterhubs_start_future_is_read_in_one_place():
    readers = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                     if "_start_future" in p.read_text(encoding="utf-8"))
    assert readers == ["policy/hub.py"]


# --- the shared lifecycle, typed --------------------------------------------------------


def test_no_method_of_the_package_takes_self_typed_any():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.args.args:
                first = node.args.args[0]
                if first.arg == "self" and first.annotation is not None and \
                        ast.unparse(first.annotation) in ("Any", "typing.Any"):
                    found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name}")
    assert found == []


def protocol_members(protocol: type) -> dict[str, Any]:
    """Every member a Protocol names, its own and its bases': name -> its declaration
    (None for an attribute)."""
    members: dict[str, Any] = {}
    for klass in reversed(protocol.__mro__):
        if typing.Protocol not in klass.__mro__ or klass in (typing.Protocol, typing.Generic):
            continue
        members.update(dict.fromkeys(vars(klass).get("__annotations__", {})))
        members.update({name: value for name, value in vars(klass).items()
                        if not name.startswith("__") and
                        (callable(value) or isinstance(value, property))})
    return members


def set_in_init(cls: type) -> set[str]:
    """The attributes an ``__init__`` of ``cls`` or its bases sets on ``self``."""
    names: set[str] = set()
    for klass in cls.__mro__:
        init = vars(klass).get("__init__")
        try:
            source = textwrap.dedent(inspect.getsource(init)) if init else ""
        except (OSError, TypeError):
            continue
        names |= {n.attr for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Attribute)
                  and isinstance(n.value, ast.Name) and n.value.id == "self"
                  and isinstance(n.ctx, ast.Store)}
    return names


def spawner_classes() -> list[type]:
    from spawner import QuotaSpawner

    kube = pytest.importorskip("spawner.kube.spawner")
    return [QuotaSpawner, kube.QuotaKubeSpawner]


def missing(cls: type, protocol: type) -> list[str]:
    """What ``protocol`` names that ``cls`` lacks, or has with other parameters."""
    traits = cls.class_traits() if hasattr(cls, "class_traits") else {}
    instance = set_in_init(cls)
    found = []
    for name, declared in protocol_members(protocol).items():
        if not (hasattr(cls, name) or name in traits or name in instance):
            found.append(name)
        elif callable(declared):
            want = list(inspect.signature(declared).parameters)[1:]
            have = list(inspect.signature(getattr(cls, name)).parameters)[1:]
            if have != want:
                found.append(f"{name}{tuple(have)}, not {tuple(want)}")
    return found


def test_both_spawners_are_what_their_shared_lifecycle_is_typed_against():
    for cls in spawner_classes():
        assert missing(cls, QuotaSpawnerProtocol) == [], cls.__name__
        assert issubclass(cls.hub_class, QuotaHub)
    docker, kube = spawner_classes()
    assert missing(docker, DockerQuotaSpawner) == []
    assert missing(docker, HostNetworkSpawner) == []
    assert (docker.hub_class, kube.hub_class) == (HubRuntime, KubeHub)


def test_the_check_of_the_protocol_finds_what_a_spawner_lacks():
    class Lacking(typing.Protocol):
        quota_file: str
        not_a_setting: int

        def startable(self, choice: Any, more: int) -> bool: ...

    docker, _ = spawner_classes()
    assert missing(docker, Lacking) == ["not_a_setting", "startable('choice',), not "
                                        "('choice', 'more')"]
