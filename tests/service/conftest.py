"""Fixtures and collection for the service layer: the modules that run the ledger's tests
again on PostgreSQL (tests/postgres.py), and QuotaKubeSpawner without a cluster."""

from __future__ import annotations

from pathlib import Path

import pytest
from postgres import AgainOnPostgreSQL
from shipped_config import KUBECONFIG


def pytest_pycollect_makemodule(module_path: Path, parent: pytest.Collector):
    """Each test_*_postgres.py runs the tests its ``AGAIN_ON_POSTGRESQL`` names on a fresh
    PostgreSQL database, besides its own."""
    if module_path.name.endswith("_postgres.py"):
        return AgainOnPostgreSQL.from_parent(parent, path=module_path)
    return None


@pytest.fixture
def no_cluster(tmp_path, monkeypatch):
    """A kubeconfig that points nowhere: KubeSpawner loads it, nothing is ever called. The
    modules that build QuotaKubeSpawner (tests/service/kube_spawners.py) ask for it in
    their ``pytestmark``."""
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG)
    # read from $KUBECONFIG when the client is imported, so set where it is kept
    from kubernetes_asyncio.config import kube_config

    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
