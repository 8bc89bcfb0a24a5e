"""An engine that cannot give GPUs, and a hub that cannot read them: caught at hub
start (the NVIDIA runtime probe's warning) and refused at spawn in plain words.

Against real engines: a second private dockerd started here WITHOUT the fake
NVIDIA hook (its `nvidia` device driver is then off, as on a host without the
NVIDIA Container Toolkit), and the test engine, which has the fake hook. Both
get a tiny imported image, so nothing here waits for the notebook images.
Skipped where dockerd is not installed, or the test engine does not answer.
"""

from __future__ import annotations

import logging
import os
import secrets
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest.mock import Mock

import docker
import pytest
from docker.errors import APIError
from hookless_engine import TINY, tiny_image
from jupyterhub.objects import Hub, Server
from tornado import web
from traitlets.config import Config

from fake_pynvml import FakeGpu, FakeNvml, NVMLError_LibraryNotFound
from spawner import QuotaSpawner
from spawner.common.registry import Registry
from spawner.contract import USER_LABEL
from spawner.docker.engine import (
    NO_NVIDIA_DRIVER,
    PROBE_LABEL,
    NvidiaProbe,
    NvidiaRuntime,
    no_nvidia_runtime,
    probe_nvidia_runtime,
)
from spawner.docker.gpus import GpuStart
from spawner.gpu.allocator import GpuRequest, NoGpuFree, Usage
from spawner.gpu.inventory import Inventory, discover_nvml
from spawner.policy import hub as hub_object
from spawner.policy import refusals
from spawner.quota.model import Choice, ImageSpec, Role

TEST_DOCKER_HOST = os.environ.get("QUOTA_SPAWNER_TEST_DOCKER_HOST",
                                  "unix:///run/quota-spawner-test/docker.sock")
ENGINE_SAID = 'could not select device driver "nvidia" with capabilities: [[gpu]]'
GPU = "GPU-5f2c0000-0000-0000-0000-00000000beef"
G = 2**30

IMAGE = ImageSpec("pytorch", "quota-spawner/pytorch:latest", "PyTorch")
GPU_ROLE = Role("gpu-training", 4, 8 * G, ("pytorch",), gpus=1)
CPU_ROLE = Role("senior-engineer", 2, 4 * G, ("pytorch",))
NO_RUNTIME_WITH_CPU = (
    "This hub's GPUs cannot be given to containers: the container engine has no NVIDIA "
    "runtime. Ask an admin to install it. A role without GPUs can still be started: you "
    "can start a CPU-only server now with the role 'senior-engineer'."
)
NO_RUNTIME_ONLY_GPU = (
    "This hub's GPUs cannot be given to containers: the container engine has no NVIDIA "
    "runtime. Ask an admin to install it. You have no role without GPUs to start meanwhile."
)
NVML_MISSING = ("it cannot read them: the NVIDIA driver's library is not installed where "
                "the hub runs")


# --- the engine's answer, the sentences ----------------------------------------------


def test_only_the_engines_no_driver_answer_means_no_runtime():
    error = APIError("500 Server Error", explanation=ENGINE_SAID)
    assert no_nvidia_runtime(error) == ENGINE_SAID
    assert no_nvidia_runtime(APIError("500", explanation=ENGINE_SAID.encode())) == ENGINE_SAID
    for other in (APIError("500", explanation="nvidia-container-cli: device error: GPU-x: "
                                              "unknown device"),
                  APIError("404 Client Error", explanation="No such image"),
                  RuntimeError("connection refused")):
        assert no_nvidia_runtime(other) is None


def test_the_refusal_names_a_cpu_role_when_the_user_has_one():
    assert refusals.no_nvidia_runtime([Choice(GPU_ROLE, IMAGE), Choice(CPU_ROLE, IMAGE)]) \
        == NO_RUNTIME_WITH_CPU
    assert refusals.no_nvidia_runtime([Choice(GPU_ROLE, IMAGE)]) == NO_RUNTIME_ONLY_GPU


@pytest.mark.parametrize("absent", ["the library", "the binding"])
def test_nvml_absence_reads_as_a_sentence(absent, monkeypatch):
    if absent == "the library":
        inventory = discover_nvml(FakeNvml([FakeGpu("GPU-a")],
                                           init_error=NVMLError_LibraryNotFound))
        assert inventory.reason == "NVML: NVML Shared Library Not Found"  # for the log
        plain = NVML_MISSING
    else:
        monkeypatch.setitem(sys.modules, "pynvml", None)
        inventory = discover_nvml()
        plain = "it cannot read them: the hub lacks the NVIDIA library that reads them"
    assert inventory.plain_reason == plain
    error = NoGpuFree(GpuRequest(1), Usage(0, 0, 0, 0), 0)
    text = refusals.no_gpu(GPU_ROLE, error, inventory.plain_reason, [Choice(GPU_ROLE, IMAGE)])
    assert text.startswith(f"The role 'gpu-training' needs 1 GPU, but this hub has no GPUs "
                           f"({plain}).")
    assert "NVML" not in text and "nvidia-ml-py" not in text


@pytest.mark.parametrize("reason, plain", [
    ("NVML: Driver Not Loaded", "it cannot read them: the NVIDIA driver is not loaded on the "
                                "hub's host"),
    ("NVML: Insufficient Permissions", "it is not allowed to read them"),
    ("QuotaSpawner.gpu_inventory is invalid: GPU GPU-a is declared twice",
     "an admin must fix the hub's list of GPUs"),
    ("no gpu_inventory is declared and discovery is off", "none are configured"),
    ("NVML found no GPUs", "none were found"),
    ("", "none were found"),
    ("GPU 0 skipped: NVML: GPU is lost", "it cannot read them; the hub's log says why"),
])
def test_every_empty_inventory_reason_has_plain_words(reason, plain):
    assert Inventory((), "none", reason).plain_reason == plain
    assert Inventory((), "none", reason).reason == reason


async def test_a_hub_without_nvml_refuses_in_plain_words_and_logs_the_reason(tmp_path,
                                                                            caplog):
    log = logging.getLogger("test.nvidia.nvml")
    spawner = make_spawner(tmp_path, log, "unix:///nonexistent.sock", gpus=False,
                           gpu_discovery=True)
    inventory = discover_nvml(FakeNvml([], init_error=NVMLError_LibraryNotFound))
    pool = SimpleNamespace(inventory=inventory, allocator=Mock(
        usage=Mock(return_value=Usage(0, 0, 0, 0)), available=Mock(return_value=0)))
    spawner.choice = Choice(GPU_ROLE, IMAGE)
    gpus = GpuStart(SimpleNamespace(pool=pool, nvidia=None), spawner.user.name,  # type: ignore[arg-type]
                    spawner.log_name, spawner.log, spawner._progress)
    with caplog.at_level(logging.WARNING, logger=log.name), \
            pytest.raises(web.HTTPError) as refused:
        await gpus.assign("quota-alice", spawner.choice.role, [Choice(GPU_ROLE, IMAGE),
                                                               Choice(CPU_ROLE, IMAGE)])
    assert refused.value.status_code == 503
    assert refused.value.log_message == (
        f"The role 'gpu-training' needs 1 GPU, but this hub has no GPUs ({NVML_MISSING}). "
        "You can start a CPU-only server now with the role 'senior-engineer'.")
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Refused")]
    assert "(GPU inventory: no GPUs (NVML: NVML Shared Library Not Found))" in line


async def test_the_runtime_warns_once_and_probes_an_old_finding_again(caplog):
    found = [NvidiaProbe("img", ENGINE_SAID), NvidiaProbe("img", ENGINE_SAID),
             NvidiaProbe("img", None)]
    probes: list[str] = []

    def probe(client: Any, images: list[str], uuid: str, hub_id: str) -> NvidiaProbe:
        probes.append(uuid)
        return found[len(probes) - 1]

    async def images() -> list[str]:
        return ["img"]

    log = logging.getLogger("test.nvidia.runtime")
    runtime = NvidiaRuntime(None, log, GPU, images, recheck=60)
    import spawner.docker.engine as engine

    with pytest.MonkeyPatch.context() as mp, caplog.at_level(logging.INFO, logger=log.name):
        mp.setattr(engine, "probe_nvidia_runtime", probe)
        runtime.start()
        assert await runtime.missing_now() == ENGINE_SAID  # waits for the probe under way
        assert await runtime.missing_now() == ENGINE_SAID and len(probes) == 1  # not yet old
        runtime.saw(ENGINE_SAID, "a start")  # a start saw it too: no second warning
        runtime._found_at -= 61  # a minute on: probed again, still missing
        assert await runtime.missing_now() == ENGINE_SAID and len(probes) == 2
        runtime._found_at -= 61  # the admin fixed the engine meanwhile
        assert await runtime.missing_now() is None and len(probes) == 3
        assert await runtime.missing_now() is None and len(probes) == 3  # no more probes
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "no NVIDIA runtime" in warnings[0] and ENGINE_SAID in warnings[0]
    assert "NVIDIA Container Toolkit" in warnings[0] and "restarts dockerd" in warnings[0]
    assert any("has an NVIDIA runtime now" in r.getMessage() for r in caplog.records)


# --- real engines ---------------------------------------------------------------------


@pytest.fixture
def test_engine() -> Iterator[tuple[docker.APIClient, str]]:
    """The test engine (fake hook), and an image on it: the notebook image when built,
    else a tiny one under a unique tag, removed afterwards."""
    try:
        client = docker.APIClient(base_url=TEST_DOCKER_HOST, version="auto", timeout=60)
        client.ping()
    except Exception as e:
        pytest.skip(f"the test engine does not answer at {TEST_DOCKER_HOST}: {e}")
    if client.images(name=IMAGE.image):
        yield client, IMAGE.image
    else:
        tiny_image(client, TINY)
        try:
            yield client, TINY
        finally:
            client.remove_image(TINY, force=True)
    client.close()


def probe_containers(client: docker.APIClient) -> list[dict[str, Any]]:
    return client.containers(all=True, filters={"label": PROBE_LABEL})


def test_the_probe_finds_no_runtime_on_an_engine_without_the_hook(hookless):
    client = hookless.client
    found = probe_nvidia_runtime(client, ["quota-spawner-test/absent:1", TINY], GPU, "h1")
    assert found is not None and found.image == TINY
    assert found.missing is not None and NO_NVIDIA_DRIVER in found.missing
    assert probe_containers(client) == []
    print(f"\nprobe on the hook-less engine: {found.seconds:.3f} s")


def test_the_probe_finds_the_runtime_on_the_test_engine(test_engine):
    client, image = test_engine
    found = probe_nvidia_runtime(client, ["quota-spawner-test/absent:1", image], GPU, "h1")
    assert found is not None and found.image == image and found.missing is None
    assert probe_containers(client) == []
    print(f"\nprobe on the test engine with {image}: {found.seconds:.3f} s"
          + (f" (its start said: {found.start_error})" if found.start_error else ""))


def test_the_probe_never_pulls(hookless):
    assert probe_nvidia_runtime(hookless.client, ["quota-spawner-test/absent:1"], GPU) is None
    assert not hookless.client.images(name="quota-spawner-test/absent")


# --- a GPU start on the hook-less engine ----------------------------------------------


TABLE = f"""\
images:
  pytorch:
    display_name: PyTorch
    image: {TINY}
roles:
  gpu-training:
    cpus: 1
    memory: 1G
    gpus: 1
    images: [pytorch]
  senior-engineer:
    cpus: 1
    memory: 1G
    images: [pytorch]
assignments:
  default: [gpu-training, senior-engineer]
"""


class MockUser(Mock):
    """As in tests/service/kube_spawners.py (KubeSpawner's own tests' MockUser)."""

    name = "alice"
    server = Server()

    def __init__(self, **kwargs: Any):
        super().__init__()
        self.groups: list[Any] = []
        self.settings: dict[str, Any] = {}
        for key, value in kwargs.items():
            setattr(self, key, value)

    @property
    def escaped_name(self) -> str:
        return self.name

    @property
    def url(self) -> str:
        return self.server.url


def make_spawner(tmp_path: Path, log: logging.Logger, host: str, gpus: bool = True,
                 **settings: Any) -> QuotaSpawner:
    quota = tmp_path / "quotas.yaml"
    quota.write_text(TABLE)
    c = Config()
    section = c.QuotaSpawner
    section.quota_file = str(quota)
    section.usage_db = "none"
    section.state_dir = str(tmp_path)
    section.hub_id = f"qsnvtest-{secrets.token_hex(4)}"  # "qs": a test hub (conftest.py)
    section.prefix = "qsnvtest"
    section.network_name = "host"  # the hook-less engine has no bridge
    section.cmd = ["jupyterhub-singleuser"]  # the tiny image has no CMD
    section.client_kwargs = {"base_url": host}
    if gpus:
        section.gpu_inventory = [{"uuid": GPU, "name": "Test GPU", "memory": "16G"}]
    for name, value in settings.items():
        setattr(section, name, value)
    return QuotaSpawner(hub=Hub(), config=c, orm_spawner=None, user=MockUser(), log=log)


@pytest.fixture
def fresh_hub_state(monkeypatch):
    """The state a hub process keeps (the engine client, the hub's runtimes), fresh for
    one test and put back after it."""
    monkeypatch.setattr(QuotaSpawner, "_client", None)
    monkeypatch.setattr(hub_object, "HUBS", Registry())
    yield
    for runtime in hub_object.HUBS.values():
        runtime.close()


@pytest.mark.parametrize("found_by", ["the probe", "the start"])
async def test_a_gpu_start_on_an_engine_without_the_hook_is_refused_plainly(
        found_by, hookless, tmp_path, caplog, fresh_hub_state, monkeypatch):
    log = logging.getLogger("test.nvidia.spawn")
    if found_by == "the start":  # the probe has not said yet: the engine's answer counts
        monkeypatch.setattr(NvidiaRuntime, "start", lambda self: None)
    client = hookless.client
    spawner = make_spawner(tmp_path, log, hookless.host)
    spawner.user_options = {"profile": "gpu-training", "image": "pytorch"}
    with caplog.at_level(logging.INFO, logger=log.name), \
            pytest.raises(web.HTTPError) as refused:
        await spawner.start()
    assert refused.value.status_code == 503
    assert refused.value.log_message == NO_RUNTIME_WITH_CPU
    runtime = await spawner.quota_hub()
    pool = runtime.pool
    assert pool.allocator.holdings() == {}  # no GPU handed out and left held
    assert runtime.nvidia is not None and NO_NVIDIA_DRIVER in (runtime.nvidia.missing or "")
    assert client.containers(all=True, filters={"label": USER_LABEL}) == []
    assert probe_containers(client) == []
    records = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert all(r.exc_info is None for r in caplog.records)  # no traceback
    refusal = [r.getMessage() for r in records if r.getMessage().startswith("Refused")]
    assert refusal == [f"Refused alice: the Docker engine has no NVIDIA runtime "
                       f"({ENGINE_SAID})"]
    warned = [r.getMessage() for r in records if "NVIDIA Container Toolkit" in r.getMessage()]
    assert len(warned) == 1
    released = [r.getMessage() for r in caplog.records if "released by" in r.getMessage()]
    assert released == ([f"GPU {GPU} released by qsnvtest-alice: the start failed"]
                        if found_by == "the start" else [])
    await spawner.stop()  # as the hub does after a failed start: nothing left to do
    assert pool.allocator.holdings() == {}

    # a role without GPUs still starts on that engine (up to the program it runs)
    spawner.user_options = {"profile": "senior-engineer", "image": "pytorch"}
    with pytest.raises(APIError) as failed:
        await spawner.start()
    assert no_nvidia_runtime(failed.value) is None  # the tiny image has no program
    await spawner.stop()
    assert client.containers(all=True, filters={"label": USER_LABEL}) == []
