"""The engine calls of one start on the test engine, counted with a wrapper around the
docker client (``Counting``): a QuotaSpawner in the test's process, the tiny imported
image (tests/e2e/hookless_engine.py), which has no program, so the start runs up to the
engine's start of the container and no further. The container is looked up by its name
once, not twice, and the socket probes run on the engine's threads (``engine_threads``)."""

from __future__ import annotations

import logging
import os
import secrets
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest.mock import Mock

import docker
import pytest
from docker.errors import APIError, NotFound
from hookless_engine import tiny_image
from jupyterhub.objects import Hub, Server
from traitlets.config import Config

from spawner import QuotaSpawner
from spawner.common.registry import Registry
from spawner.policy import hub as hub_object

TEST_DOCKER_HOST = os.environ.get("QUOTA_SPAWNER_TEST_DOCKER_HOST",
                                  "unix:///run/quota-spawner-test/docker.sock")
OFFLINE = {"create_container_config", "create_host_config"}  # docker-py's builders


class Counting:
    """A docker APIClient whose public calls are counted by name, with the threads that
    made the socket probes (``head``)."""

    def __init__(self, real: docker.APIClient):
        self._real = real
        self.calls: Counter[str] = Counter()
        self.probe_threads: set[str] = set()

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._real, name)
        if name.startswith("_") or name in OFFLINE or not callable(found):
            return found

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            if name == "head":
                self.probe_threads.add(threading.current_thread().name)
            return found(*args, **kwargs)

        return counted


class User(Mock):
    name = "calls"
    server = Server()
    escaped_name = "calls"
    url = "/user/calls/"


@pytest.fixture
def engine(monkeypatch) -> Iterator[tuple[Counting, str]]:
    try:
        real = docker.APIClient(base_url=TEST_DOCKER_HOST, version="auto", timeout=60)
        real.ping()
    except Exception as e:
        pytest.skip(f"the test engine does not answer at {TEST_DOCKER_HOST}: {e}")
    image = f"quota-spawner-test/tiny:{secrets.token_hex(4)}"
    tiny_image(real, image)
    client = Counting(real)
    monkeypatch.setattr(QuotaSpawner, "_client", client)
    monkeypatch.setattr(hub_object, "HUBS", Registry())
    try:
        yield client, image
    finally:
        for runtime in hub_object.HUBS.values():
            runtime.close()
        real.remove_image(image, force=True)
        real.close()


def make_spawner(tmp_path: Path, image: str) -> QuotaSpawner:
    quota = tmp_path / "quotas.yaml"
    quota.write_text(f"images:\n  tiny:\n    image: {image}\nroles:\n  small:\n    cpus: 0.5\n"
                     "    memory: 1G\n    images: [tiny]\nassignments:\n  default: [small]\n")
    c = Config()
    section = c.QuotaSpawner
    section.quota_file = str(quota)
    section.usage_db = "none"
    section.state_dir = str(tmp_path)
    tag = secrets.token_hex(4)
    section.hub_id = f"qscalls-{tag}"  # "qs": a test hub (tests/conftest.py)
    section.prefix = f"qscalls{tag}"
    section.network_name = "host"
    section.cmd = ["jupyterhub-singleuser"]  # the tiny image has no CMD
    section.engine_threads = 4
    data = tmp_path / "data"  # a host folder bound in, which the socket probes look into
    data.mkdir()
    section.volumes = {"{prefix}-home-{username}": "/home/jovyan",
                       str(data): {"bind": "/data", "mode": "ro"}}
    user = User()
    user.groups, user.settings = [], {}
    return QuotaSpawner(hub=Hub(), config=c, orm_spawner=None, user=user,
                        log=logging.getLogger("test.engine-calls"))


async def test_a_start_looks_its_container_up_once(engine, tmp_path):
    client, image = engine
    spawner = make_spawner(tmp_path, image)
    spawner.user_options = {"profile": "small", "image": "tiny"}
    await spawner.quota_hub()  # the runtime's build and first sync are not the start's
    client.calls.clear()
    try:
        with pytest.raises(APIError):  # the tiny image has no program to run
            await spawner.start()
        calls = dict(client.calls)
        print(f"\nengine calls of one start: {sum(calls.values())} {calls}")
        assert calls["create_container_from_config"] == 1 and calls["start"] == 1
        assert calls["inspect_container"] == 1  # the lookup by name, before anything
        assert calls["head"] == 9  # the socket probes of the folder's bind (mounts.py)
        assert client.probe_threads and all(
            name.startswith("quota-engine") for name in client.probe_threads)
    finally:
        await spawner.stop()
        try:
            client.remove_volume(f"{spawner.prefix}-home-calls", force=True)
        except NotFound:
            pass
