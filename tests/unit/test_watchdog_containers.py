"""The watchdog's view of a notebook container, from the engine's inspect."""

from __future__ import annotations

import logging

import pytest

from spawner.contract import (
    GPU_MODE_LABEL,
    GPUS_LABEL,
    HUB_LABEL,
    IMAGE_LABEL,
    ROLE_LABEL,
    USER_LABEL,
)
from spawner.watchdog import containers
from spawner.watchdog.containers import OomEvents, server_from_inspect

INSPECT = {
    "Id": "c" * 64,
    "Name": "/quota-ada",
    "Config": {"Labels": {USER_LABEL: "ada", ROLE_LABEL: "gpu-lab", IMAGE_LABEL: "pytorch",
                          HUB_LABEL: "quota-abc", GPUS_LABEL: "GPU-a,GPU-b",
                          GPU_MODE_LABEL: "shared:3"},
               "Env": ["PATH=/usr/bin", "GPU_MEMORY_LIMIT=17179869184", "X=a=b"]},
    "HostConfig": {"Memory": 4 * 2**30, "CpuQuota": 150_000, "CpuPeriod": 100_000},
    "State": {"Pid": 4242, "StartedAt": "2026-11-30T18:10:01.123456789Z"},
}


def test_server_from_inspect():
    s = server_from_inspect(INSPECT)
    assert (s.container_id, s.name, s.user, s.role, s.image, s.hub_id) == (
        "c" * 64, "quota-ada", "ada", "gpu-lab", "pytorch", "quota-abc")
    assert s.gpus == ("GPU-a", "GPU-b") and s.gpu_mode == "shared:3" and s.shared_gpu
    assert (s.memory_limit, s.cpus, s.gpu_memory_limit, s.pid) == (4 * 2**30, 1.5, 16 * 2**30, 4242)
    assert abs(s.started - 1796062201.123456) < 1e-3


def test_a_server_reserves_its_roles_cpus_also_in_its_start_boost():
    """CPU_LIMIT is the role's from the start; the quota is the boost's until the server
    answers, and the watchdog inspects a container again only a minute later."""
    boosted = {**INSPECT, "Config": {**INSPECT["Config"], "Env": ["CPU_LIMIT=0.5"]},
               "HostConfig": {"Memory": 2**30, "CpuQuota": 1_600_000, "CpuPeriod": 100_000}}
    s = server_from_inspect(boosted)
    assert (s.cpus, s.cpus_reserved, s.memory_limit) == (16.0, 0.5, 2**30)
    assert server_from_inspect(INSPECT).cpus_reserved == 1.5  # no CPU_LIMIT: the quota
    nano = {**INSPECT, "HostConfig": {"NanoCpus": 2_500_000_000},
            "Config": {**INSPECT["Config"], "Env": ["CPU_LIMIT=lots"]}}
    assert server_from_inspect(nano).cpus_reserved == 2.5


class InfoClient:
    def __init__(self, *answers):
        self.answers = list(answers)
        self.asked = 0

    def info(self):
        self.asked += 1
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def test_the_engine_size_is_asked_rarely_and_kept_when_the_engine_is_away():
    client = InfoClient({"NCPU": 16, "MemTotal": 64 * 2**30}, OSError("down"), {"NCPU": 0})
    found = containers.Containers(client, engine_refresh=300)
    assert found.engine_size(now=0) == (16.0, 64 * 2**30)
    assert found.engine_size(now=299) == (16.0, 64 * 2**30) and client.asked == 1
    assert found.engine_size(now=300) == (16.0, 64 * 2**30)  # down: the last answer
    assert found.engine_size(now=600) is None and client.asked == 3  # no size: unknown
    assert containers.Containers(InfoClient(OSError("down"))).engine_size(now=0) is None


def test_a_container_without_the_labels_or_limits():
    assert server_from_inspect({"Config": {"Labels": {"other": "x"}}}) is None
    bare = server_from_inspect({"Id": "x", "Config": {"Labels": {USER_LABEL: "bo"}},
                                "State": {"StartedAt": "0001-01-01T00:00:00Z"}})
    assert (bare.gpus, bare.memory_limit, bare.cpus, bare.gpu_memory_limit, bare.started) == (
        (), None, None, None, None)
    assert bare.cpus_reserved is None


def test_oom_events_become_servers():
    events = OomEvents(client=None, hub_id="quota-abc", log=logging.getLogger("t"))
    events._record({"Actor": {"ID": "e" * 64, "Attributes": {
        "name": "quota-bo", USER_LABEL: "bo", HUB_LABEL: "quota-abc", ROLE_LABEL: "small"}}})
    events._record({"Actor": {"ID": "f" * 64, "Attributes": {USER_LABEL: "x",
                                                             HUB_LABEL: "another"}}})
    (server,) = events.take()
    assert (server.name, server.user, server.role) == ("quota-bo", "bo", "small")
    assert events.take() == []


class _Stop(BaseException):
    """Ends OomEvents' endless loop in a test."""


def test_an_engine_that_is_not_there_is_told_once(tmp_path, monkeypatch, caplog):
    """An engine that is down at start (or a wrong docker_host) fails a cycle with
    EngineUnreachable, which the watchdog logs once; the event stream says it once too."""
    client = containers.EngineClient(f"unix://{tmp_path}/no-engine.sock")  # nothing asked yet
    with pytest.raises(containers.EngineUnreachable, match="No such file"):
        containers.Containers(client).servers()
    with pytest.raises(containers.EngineUnreachable):
        client.events  # noqa: B018 (connecting is the point)

    naps = []

    def nap(seconds: float) -> None:
        naps.append(seconds)
        if len(naps) == 3:
            raise _Stop

    monkeypatch.setattr(containers.time, "sleep", nap)
    events = OomEvents(client, hub_id="", log=logging.getLogger("t"))
    with caplog.at_level(logging.INFO, logger="t"), pytest.raises(_Stop):
        events._follow()
    assert naps == [5, 5, 5]
    assert caplog.text.count("Lost the engine's event stream") == 1
