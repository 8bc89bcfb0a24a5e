"""Fixtures for the end-to-end tests: a real dockerd, hub and proxy."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness import Hub, ensure_engine, teardown

# Test roles: small enough for a 2-core CI machine, distinct enough to tell apart.
TEST_QUOTAS = """\
images:
  pytorch:
    display_name: PyTorch
    image: quota-spawner/pytorch:latest
  paddle:
    display_name: PaddlePaddle
    image: quota-spawner/paddle:latest
roles:
  junior-researcher:
    description: Data exploration and small models
    cpus: 2
    memory: 4G
    shm: 1G
    images: [pytorch, paddle]
  senior-engineer:
    cpus: 8
    memory: 32G
    shm: 8G
    pids: 4096
    images: [pytorch, paddle]
  pipeline:
    cpus: 1
    memory: 2G
    images: [pytorch]
  tiny:
    description: For the OOM test
    cpus: 0.5
    memory: 256M
    pids: 256
    images: [pytorch]
assignments:
  default: [junior-researcher]
  groups:
    ml-platform: [senior-engineer, pipeline]
    oom: [tiny]
    lab1: [pipeline]
    solo: [pipeline]
  users:
    research-lead: [senior-engineer]
    nobody-here: []
"""


@pytest.fixture(scope="session")
def docker_client():
    try:
        return ensure_engine()
    except Exception as e:
        pytest.fail(f"no Docker engine or images for the end-to-end tests: {e}")


@pytest.fixture(scope="session")
def hub(docker_client, tmp_path_factory):
    prefix = f"qstest{os.getpid()}"
    hub = Hub(
        tmp_path_factory.mktemp("hub"),
        quota_text=TEST_QUOTAS,
        prefix=prefix,
        extra_config=(
            "from spawner.hubconfig.rbac import instructor_roles\n"
            "c.JupyterHub.load_roles += instructor_roles({'lab1': ['prof-x']})\n"
        ),
    )
    hub.start()
    yield hub
    teardown(hub, docker_client, "e2e")


@pytest.fixture
def quotas(hub):
    """Edit the hub's quota table in a test; restored afterwards."""
    yield hub.quota_file
    hub.quota_file.write_text(TEST_QUOTAS)


@pytest.fixture
def fresh_user(hub, request):
    """A user name unique to this test; their server is stopped afterwards."""
    names = []

    def make(base: str, groups: list[str] = ()) -> str:
        name = f"{base}-{len(names)}-{request.node.name[:20]}".lower()
        name = "".join(ch if ch.isalnum() or ch in "-._@" else "-" for ch in name)
        hub.create_user(name, list(groups))
        names.append(name)
        return name

    yield make
    for name in names:
        if hub.user(name)["servers"]:
            hub.api("DELETE", f"/users/{name}/server")


def pytest_collection_modifyitems(items):
    """The layer is the folder: tests/e2e and tests/browser need the engine, the images
    and the proxy (marked e2e), tests/browser Chromium too (marked browser)."""
    for item in items:
        layer = Path(item.fspath).parent.name
        if layer in ("e2e", "browser") and "e2e" not in item.keywords:
            item.add_marker(pytest.mark.e2e)
        if layer == "browser" and "browser" not in item.keywords:
            item.add_marker(pytest.mark.browser)
