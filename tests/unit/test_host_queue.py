"""Host room in the queue (spawner/gpu/pool.py, gpu/queue.py with host/admission.py):
every start reserves its role's CPUs and memory, and waits in the GPU starts' queue, by
priority then arrival, while the host is full."""

from __future__ import annotations

import logging

from spawner.gpu.inventory import declared_inventory
from spawner.gpu.pool import GpuPool, Server
from spawner.host.admission import HostBook, HostCapacity, Reservation
from spawner.quota.model import Role

GiB = 2**30


def pool(memory_gib: int = 8, gpus: int = 0) -> GpuPool:
    """A pool whose notebooks may reserve 8 CPUs and ``memory_gib`` GiB (no reserve)."""
    inventory = declared_inventory([{"uuid": f"GPU-{i}", "memory": "16G"}
                                    for i in range(gpus)])
    found = GpuPool(inventory, "hub", log=logging.getLogger("test"))
    found.set_host(HostBook(HostCapacity(cpus=8, memory=memory_gib * GiB, reserve_cpus=0,
                                         reserve_memory=0, cpu_ratio=1)))
    return found


def role(name: str, memory_gib: int, priority: int = 0, gpus: int = 0) -> Role:
    return Role(name, 1, memory_gib * GiB, ("p",), priority=priority, gpus=gpus)


def join(p: GpuPool, owner: str, r: Role):
    return p.join(owner, Server(owner, r.name, 0.0), r)


async def test_cpu_only_starts_are_admitted_while_they_fit_then_wait_in_order():
    p = pool(memory_gib=8)
    small = role("small", 4)
    a, b = join(p, "a", small), join(p, "b", small)
    assert a.grant.result() == () and b.grant.result() == ()
    assert p.host.reserved == Reservation(2, 8 * GiB)
    c, d = join(p, "c", small), join(p, "d", small)
    assert not c.grant.done() and not d.grant.done()
    assert c.short.sentence() == "the host's memory is fully reserved: 12 GiB of 8 GiB"
    assert p.queue.position("d") == (2, 2)
    p.release("a", "stopped")
    assert c.grant.result() == () and not d.grant.done()  # arrival order
    p.leave("c", "served")
    assert p.host.holding("c") == Reservation(1, 4 * GiB)  # held until its server stops


async def test_nobody_behind_takes_room_that_someone_ahead_waits_for():
    p = pool(memory_gib=8)
    join(p, "a", role("half", 4))
    big = join(p, "big", role("big", 6))
    tiny = join(p, "tiny", role("tiny", 1))
    assert not big.grant.done()
    assert not tiny.grant.done()  # 5 GiB would fit, but 'big' is ahead
    assert tiny.short == big.short
    p.release("a", "stopped")
    assert big.grant.done() and tiny.grant.done()  # 6 + 1 of 8


async def test_priority_goes_first_and_a_leaver_holds_nothing():
    p = pool(memory_gib=4)
    join(p, "a", role("all", 4))
    low = join(p, "low", role("low", 4))
    high = join(p, "high", role("high", 4, priority=10))
    assert p.queue.position("high") == (1, 2)
    p.leave("high", "its start was stopped")
    assert p.host.holding("high") is None
    p.release("a", "stopped")
    assert low.grant.result() == () and high.grant.cancelled()


async def test_a_gpu_start_waits_for_room_before_it_takes_a_gpu():
    p = pool(memory_gib=4, gpus=1)
    join(p, "cpu", role("cpu", 4))
    gpu = join(p, "gpu", role("gpu", 2, gpus=1))
    assert not gpu.grant.done() and gpu.short.resource == "memory"
    assert p.allocator.holding("gpu") is None  # the GPU stays free for someone who fits
    p.release("cpu", "stopped")
    assert gpu.grant.result() == ("GPU-0",)
    assert p.host.holding("gpu") == Reservation(1, 2 * GiB)
    p.release("gpu", "stopped")
    assert p.host.reserved == Reservation() and p.allocator.holding("gpu") is None


async def test_a_container_found_running_is_counted():
    p = pool(memory_gib=4)
    p.adopt_room("found", Reservation(2, 3 * GiB))
    waiting = join(p, "next", role("two", 2))
    assert waiting.short.sentence() == "the host's memory is fully reserved: 5 GiB of 4 GiB"
    p.release("found", "its container is gone")
    assert waiting.grant.done()
