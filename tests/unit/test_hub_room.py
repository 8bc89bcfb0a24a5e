"""What the table editor learns of the hub from its pool snapshot (spawner/gpu/snapshot.py
``hub_room``): the GPU inventory the hub's store checks tables against, and its host's
share, as ``validate --gpus N --gpu-memory SIZE --engine`` takes them; published as soon
as the hub's pool has its host, before any server starts."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from spawner.gpu.inventory import declared_inventory
from spawner.gpu.pool import GpuPool
from spawner.gpu.snapshot import hub_room, pool_snapshot
from spawner.host.admission import HostBook, HostCapacity
from spawner.host.fit import never_fit
from spawner.quota.loader import parse_quota_table
from spawner.quota.model import GpuCapacity

G = 2**30
LOG = logging.getLogger("test-hub-room")
HOST = HostCapacity(cpus=16, memory=64 * G, reserve_cpus=1, reserve_memory=4 * G)


def pool(memories: list[str | None], host: HostCapacity | None = HOST,
         published: list[str] | None = None) -> GpuPool:
    inventory = declared_inventory(
        [{"uuid": f"GPU-{i}", **({"memory": m} if m else {})} for i, m in enumerate(memories)])
    found = GpuPool(inventory, "hub-1", LOG,
                    publish=published.append if published is not None else None)
    found.set_host(HostBook(host) if host is not None else None)
    return found


def read_back(p: GpuPool) -> dict:
    return json.loads(json.dumps(pool_snapshot(p, 1_700_000_000.0)))


def test_the_snapshot_tells_the_hubs_gpus_and_host_as_the_hub_checks_them():
    p = pool(["80G", "40G", "80G"])
    room = hub_room(read_back(p))
    assert room is not None and room.gpus == p.capacity == GpuCapacity(3, 40 * G)
    assert room.host is not None and room.host.share == HOST.share
    assert room.time == 1_700_000_000.0


def test_a_gpu_of_unknown_memory_and_no_host_admission():
    room = hub_room(read_back(pool(["80G", None], host=None)))
    assert room is not None and room.gpus == GpuCapacity(2, None) and room.host is None
    assert hub_room(read_back(pool([], host=None))).gpus == GpuCapacity(0, None)


@pytest.mark.parametrize("odd", [None, {}, {"version": 2, "gpus": [], "time": 1},
                                 {"version": 1, "gpus": "three", "time": 1},
                                 {"version": 1, "gpus": [], "time": "now"}])
def test_an_odd_document_tells_nothing(odd):
    assert hub_room(odd) is None


def test_an_odd_host_part_is_no_host():
    document = read_back(pool(["80G"]))
    document["host"]["cpu_ratio"] = 0.5  # a ratio below 1 is no HostCapacity
    assert hub_room(document).host is None
    document["host"] = {"cpus": "many"}
    assert hub_room(document).host is None


async def test_the_pool_publishes_as_soon_as_it_has_its_host():
    published: list[str] = []
    pool(["80G"] * 3, published=published)
    await asyncio.sleep(0.05)  # the writer's timer, on the loop
    [text] = published
    assert hub_room(json.loads(text)).gpus.count == 3


def test_a_role_larger_than_the_hosts_share_is_a_problem_at_its_line():
    text = """\
images:
  py: {image: "x:1"}
roles:
  small: {cpus: 1, memory: 1G, images: [py]}
  huge:
    cpus: 100
    memory: 1G
    images: [py]
assignments:
  default: [small]
"""
    table = parse_quota_table(text, "q.yaml")
    [problem] = never_fit(table, HOST)
    assert str(problem) == ("q.yaml:5: role 'huge' (100 CPUs, 1 GiB): none fit on this "
                            "host: one server's 100 CPUs are more than the notebooks' 60")
