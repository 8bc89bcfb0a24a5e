"""QuotaKubeSpawner in the test's process, without a cluster, built as KubeSpawner's own
tests build theirs (``_mock=True``, a MockUser, jupyterhub's Hub): ``make`` (QuotaSpawner
too, for the same cases on both), ``offline`` with a fake of the cluster's API that stops
a start at the pod's creation (``FakeApi``; both fakes keep the home claims as the API
would, ``FakeClaims``, and ``claim_of`` is an older one), and ``FakeCluster`` with ``spawner_on`` for
whole starts, polls and stops against a fake API and pod reflector. The kubeconfig that
points nowhere is the ``no_cluster`` fixture's (tests/service/conftest.py).

Import only after ``pytest.importorskip("kubespawner")``.
"""

from __future__ import annotations

import copy
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest.mock import Mock

import pytest
from jupyterhub.objects import Hub, Server
from kubernetes_asyncio.client.rest import ApiException
from traitlets.config import Config

from spawner.common.registry import Registry
from spawner.kube.spawner import QuotaKubeSpawner
from spawner.policy import hub as hub_object
from spawner.usage.ledger import Ledger

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "hub_config" / "quotas.yaml"


class MockUser(Mock):
    """As in KubeSpawner's tests, with groups."""

    name = "alice"
    server = Server()

    def __init__(self, **kwargs: Any):
        super().__init__()
        self.groups = []
        self.settings = {}
        for key, value in kwargs.items():
            setattr(self, key, value)

    @property
    def escaped_name(self) -> str:
        return self.name

    @property
    def url(self) -> str:
        return self.server.url


def make(cls: type, quota_file: Path | str = SHIPPED, user: str = "alice",
         groups: tuple[str, ...] = (), **settings: Any) -> Any:
    c = Config()
    section = c[cls.__name__]
    section.quota_file = str(quota_file)
    section.usage_db = "none"
    section.hub_id = "test-hub"
    for name, value in settings.items():
        setattr(section, name, value)
    kwargs: dict[str, Any] = dict(
        hub=Hub(), config=c, orm_spawner=None,
        user=MockUser(name=user, groups=[SimpleNamespace(name=g) for g in groups]))
    if cls is QuotaKubeSpawner:
        kwargs["_mock"] = True
    return cls(**kwargs)


class Created(Exception):
    """Stops a start once the pod would have gone to the API."""


class FakeClaims:
    """The home claims' calls: created (``claims``, as sent), read back and patched
    (``patches``); ``existing`` holds each claim as the API would return it, name ->
    dict (a test puts an older claim there). The serialiser is the real client's."""

    def __init__(self, real: Any):
        self.api_client = real.api_client
        self.claims: list[Any] = []
        self.existing: dict[str, dict[str, Any]] = {}
        self.patches: list[tuple[str, dict[str, Any]]] = []

    async def create_namespaced_persistent_volume_claim(self, namespace: str, body: Any) -> None:
        self.claims.append(body)
        claim = self.api_client.sanitize_for_serialization(body)
        self.existing.setdefault(claim["metadata"]["name"], claim)  # else KubeSpawner's 409

    async def read_namespaced_persistent_volume_claim(self, name: str,
                                                      namespace: str) -> dict[str, Any]:
        if name not in self.existing:
            raise ApiException(status=404, reason="Not Found")
        return copy.deepcopy(self.existing[name])

    async def patch_namespaced_persistent_volume_claim(self, name: str, namespace: str,
                                                       body: dict[str, Any]) -> None:
        self.patches.append((name, body))
        requests = self.existing[name]["spec"]["resources"]["requests"]
        requests.update(body["spec"]["resources"]["requests"])


def claim_of(name: str, size: int, storage_class: str = "standard") -> dict[str, Any]:
    """A home claim as the API returns it, made by an earlier start (of another role)."""
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": storage_class,
                     "resources": {"requests": {"storage": str(size)}}},
            "status": {"phase": "Bound", "capacity": {"storage": str(size)}}}


class FakeApi(FakeClaims):
    """The API calls of a start, recorded; the serialiser is the real client's."""

    def __init__(self, real: Any):
        super().__init__(real)
        self.pods: list[dict[str, Any]] = []

    async def create_namespaced_pod(self, namespace: str, body: dict[str, Any]) -> None:
        self.pods.append(body)
        raise Created


async def no_watch(replace: bool = False) -> None:
    """In place of KubeSpawner's pod and event reflectors, which need a cluster."""
    return None


def offline(spawner: Any, api: type = FakeApi) -> Any:
    """The spawner with ``api``, a fake of the cluster's API around the real client's
    serialiser, and no reflector; returns the fake."""
    spawner._start_watching_pods = no_watch
    spawner.api = api(spawner.api)
    return spawner.api


def running(body: dict[str, Any]) -> dict[str, Any]:
    """The pod as the reflector holds it once its notebook answers."""
    pod = copy.deepcopy(body)
    pod["metadata"]["uid"] = f"uid-{pod['metadata']['name']}"
    pod["status"] = {"phase": "Running", "podIP": "10.0.0.7", "conditions": [],
                     "containerStatuses": [{"name": "notebook", "ready": True,
                                            "state": {"running": {}}}]}
    return pod


class FakeCluster(FakeClaims):
    """Fake of the Kubernetes API and the pod reflector, which cannot run here: a created
    pod runs at once (the uid in the API's answer), a deleted one is gone at once."""

    def __init__(self, real: Any):
        super().__init__(real)
        self.pods: dict[str, dict[str, Any]] = {}  # the reflector's: namespace/name -> pod
        self.created: list[dict[str, Any]] = []
        self.deleted: list[str] = []

    async def create_namespaced_pod(self, namespace: str, body: dict[str, Any]) -> Any:
        self.created.append(body)
        name = body["metadata"]["name"]
        self.pods[f"{namespace}/{name}"] = running(body)
        return SimpleNamespace(metadata=SimpleNamespace(uid=f"uid-{name}"))

    async def delete_namespaced_pod(self, name: str, namespace: str, **kwargs: Any) -> None:
        self.deleted.append(name)
        self.pods.pop(f"{namespace}/{name}", None)


def spawner_on(monkeypatch: pytest.MonkeyPatch, url: str, quota: Path | str = SHIPPED,
               user: str = "cy", groups: tuple[str, ...] = ("ml-platform",),
               **settings: Any) -> tuple[Any, FakeCluster]:
    spawner = make(QuotaKubeSpawner, quota, user=user, groups=groups, usage_db=url,
                   events_enabled=False, **settings)
    cluster = offline(spawner, FakeCluster)
    monkeypatch.setitem(QuotaKubeSpawner.reflectors, spawner._get_reflector_key("pods"),
                        SimpleNamespace(pods=cluster.pods))
    monkeypatch.setattr(hub_object, "HUBS", Registry())
    return spawner, cluster


def sessions(ledger: Ledger) -> list[dict[str, Any]]:
    from sqlalchemy import select

    from spawner.usage.schema import sessions as table

    with ledger.engine.connect() as connection:
        return [dict(r._mapping) for r in connection.execute(
            select(table).order_by(table.c.id))]
