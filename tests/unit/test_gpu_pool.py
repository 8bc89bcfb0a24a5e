"""What the spawners ask of the GPU pool (spawner/gpu/pool.py) beside the queue
(test_gpu_queue.py): a role's request, the hub's inventory, the capacity the table is
checked against. Keeping it in step with Docker is test_reconcile.py's."""

from __future__ import annotations

import logging

from fake_pynvml import FakeGpu, FakeNvml
from spawner.gpu import pool as gpu_pool
from spawner.gpu.allocator import GpuRequest
from spawner.gpu.inventory import declared_inventory, discover_nvml
from spawner.gpu.pool import GpuPool, hub_inventory, mode_label, request_for

HUB = "hub-1"


# --- what the spawner asks of the pool ---------------------------------------------


def test_request_for_a_role():
    from spawner.quota.model import Role

    assert request_for(Role("cpu", 1, 2**30, ("p",))) is None
    assert request_for(Role("one", 1, 2**30, ("p",), gpus=1)) == GpuRequest(1)
    lab = Role("lab", 1, 2**30, ("p",), gpus=1, gpu_mode="shared", gpu_share=3,
               gpu_memory=2**34)
    assert request_for(lab) == GpuRequest(1, "shared", 3, 2**34)
    assert mode_label(request_for(lab)) == "shared:3"


def test_hub_inventory_declared_discovered_or_none(monkeypatch):
    declared = hub_inventory([{"uuid": "GPU-a", "memory": "16G"}], discovery=True)
    assert declared.source == "declared" and declared.uuids == ("GPU-a",)
    bad = hub_inventory([{"uuid": "GPU-a"}, {"uuid": "GPU-a"}], discovery=True)
    assert bad.devices == () and "QuotaSpawner.gpu_inventory is invalid" in bad.reason
    off = hub_inventory([], discovery=False)
    assert off.devices == () and "discovery is off" in off.reason
    nvml = FakeNvml([FakeGpu("GPU-n", memory=2**34)])
    monkeypatch.setattr(gpu_pool, "discover_nvml", lambda: discover_nvml(nvml))
    assert hub_inventory([], discovery=True).uuids == ("GPU-n",)


def test_capacity_is_what_the_table_is_checked_against():
    pool = GpuPool(declared_inventory([{"uuid": "GPU-a", "memory": "16G"},
                                       {"uuid": "GPU-b", "memory": "80G"}]),
                   HUB, log=logging.getLogger("test"))
    assert (pool.capacity.count, pool.capacity.smallest_memory) == (2, 16 * 2**30)
