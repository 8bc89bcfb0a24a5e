"""Fixtures for the end-to-end tests: a real dockerd, and the session's shared hubs with
their proxies (tests/hubs.py says which and why)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hubs import TEST_QUOTAS, running_hub, start_gpu_hub, start_hub, start_one_gpu_hub

from harness import ensure_engine


@pytest.fixture(scope="session")
def docker_client():
    try:
        return ensure_engine()
    except Exception as e:
        pytest.fail(f"no Docker engine or images for the end-to-end tests: {e}")


@pytest.fixture(scope="session")
def hub(docker_client, tmp_path_factory):
    """No GPUs, TEST_QUOTAS, the usage service and the culler (tests/hubs.py)."""
    yield from running_hub(start_hub, tmp_path_factory.mktemp("hub"), docker_client, "e2e")


@pytest.fixture(scope="session")
def gpu_hub(docker_client, tmp_path_factory):
    """2 fake GPUs and the FAKE NVML in the containers (tests/hubs.py); a module brings its
    table with ``hubs.on_hub``."""
    yield from running_hub(start_gpu_hub, tmp_path_factory.mktemp("gpu-hub"), docker_client,
                           "gpu")


@pytest.fixture(scope="session")
def one_gpu_hub(docker_client, tmp_path_factory):
    """1 fake GPU, the culler and the watchdog's token (tests/hubs.py)."""
    yield from running_hub(start_one_gpu_hub, tmp_path_factory.mktemp("one-gpu-hub"),
                           docker_client, "one-gpu")


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


def pytest_make_parametrize_id(config, val, argname):
    """A parameter computed from the clock (a Unix time, now or some days from now) gets a
    stable id: pytest-xdist's workers must collect the same test ids (make test-fast)."""
    if isinstance(val, float) and 1e9 < val < 1e11:
        return f"{argname}=a-unix-time"
    return None
