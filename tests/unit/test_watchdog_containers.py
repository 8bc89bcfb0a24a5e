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


def test_a_container_without_the_labels_or_limits():
    assert server_from_inspect({"Config": {"Labels": {"other": "x"}}}) is None
    bare = server_from_inspect({"Id": "x", "Config": {"Labels": {USER_LABEL: "bo"}},
                                "State": {"StartedAt": "0001-01-01T00:00:00Z"}})
    assert (bare.gpus, bare.memory_limit, bare.cpus, bare.gpu_memory_limit, bare.started) == (
        (), None, None, None, None)


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
