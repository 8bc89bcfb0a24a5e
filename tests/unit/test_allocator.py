"""The GPU allocator: exclusive and shared holdings, packing, adoption, races, and a
property test against a plain model."""

from __future__ import annotations

import sys
import threading

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from spawner.gpu.allocator import GpuAllocator, GpuRequest, NoGpuFree, Usage
from spawner.gpu.inventory import GpuDevice

G = 2**30


def devices(n: int, memory: int | None = 80 * G) -> list[GpuDevice]:
    return [GpuDevice(str(i), f"GPU-{i}", "H100", memory) for i in range(n)]


EXCLUSIVE = GpuRequest(1)


def shared(share: int, count: int = 1) -> GpuRequest:
    return GpuRequest(count, "shared", share)


def test_exclusive_exhaustion_and_release():
    alloc = GpuAllocator(devices(2))
    assert alloc.acquire("a", EXCLUSIVE) == ("GPU-0",)
    assert alloc.acquire("b", EXCLUSIVE) == ("GPU-1",)
    with pytest.raises(NoGpuFree) as info:
        alloc.acquire("c", EXCLUSIVE)
    assert info.value.usage == Usage(total=2, exclusive=2, shared=0, free=0)
    assert info.value.available == 0
    assert info.value.request == EXCLUSIVE
    assert str(info.value) == "1 exclusive GPU(s) wanted, 0 available"
    assert alloc.holding("c") is None
    assert alloc.release("a") == ("GPU-0",)
    assert alloc.release("a") == ()
    assert alloc.usage() == Usage(2, 1, 0, 1)
    assert alloc.acquire("c", EXCLUSIVE) == ("GPU-0",)
    assert alloc.holders("GPU-0") == ["c"]


def test_count_zero_is_refused():
    with pytest.raises(ValueError):
        GpuAllocator(devices(1)).acquire("a", GpuRequest(0))


def test_shared_packs_before_opening_an_empty_gpu():
    alloc = GpuAllocator(devices(3))
    got = [alloc.acquire(f"u{i}", shared(3)) for i in range(4)]
    assert got == [("GPU-0",)] * 3 + [("GPU-1",)]
    assert alloc.usage() == Usage(3, 0, 2, 1)
    assert sorted(alloc.holders("GPU-0")) == ["u0", "u1", "u2"]
    # the next shared user joins GPU-1 (already shared), not the empty GPU-2
    assert alloc.acquire("u4", shared(3)) == ("GPU-1",)


def test_shared_and_exclusive_never_mix():
    alloc = GpuAllocator(devices(2))
    assert alloc.acquire("x", EXCLUSIVE) == ("GPU-0",)
    assert alloc.acquire("s", shared(4)) == ("GPU-1",)  # never on x's GPU
    with pytest.raises(NoGpuFree) as info:
        alloc.acquire("x2", EXCLUSIVE)  # never on s's GPU, though it has room for 3 more
    assert info.value.usage == Usage(2, 1, 1, 0)
    alloc.release("s")
    assert alloc.acquire("x2", EXCLUSIVE) == ("GPU-1",)
    with pytest.raises(NoGpuFree) as info:
        alloc.acquire("s2", shared(4))
    assert info.value.usage == Usage(2, 2, 0, 0)
    assert str(info.value) == "1 shared GPU(s) wanted, 0 available"


def test_mixed_shares_use_the_smallest():
    alloc = GpuAllocator(devices(2))
    alloc.acquire("two", shared(2))
    assert alloc.acquire("four", shared(4)) == ("GPU-0",)  # 2 holders <= min(4, 2)
    assert alloc.acquire("four-b", shared(4)) == ("GPU-1",)  # 3 > min(4, 2, 4)
    assert alloc.acquire("four-c", shared(4)) == ("GPU-1",)
    # a newcomer with a smaller share may not join a GPU already fuller than it allows
    assert alloc.available(shared(2)) == 0
    with pytest.raises(NoGpuFree):
        alloc.acquire("two-b", shared(2))
    assert alloc.acquire("four-d", shared(4)) == ("GPU-1",)
    assert len(alloc.holders("GPU-1")) == 3


def test_multi_gpu_requests_get_distinct_gpus():
    alloc = GpuAllocator(devices(4))
    assert alloc.acquire("a", GpuRequest(3)) == ("GPU-0", "GPU-1", "GPU-2")
    with pytest.raises(NoGpuFree) as info:
        alloc.acquire("b", GpuRequest(2))
    assert info.value.available == 1
    assert alloc.holding("b") is None  # nothing half-taken
    assert alloc.acquire("b", GpuRequest(1)) == ("GPU-3",)


def test_shared_multi_gpu_takes_distinct_gpus():
    alloc = GpuAllocator(devices(3))
    assert alloc.acquire("s1", shared(2, count=2)) == ("GPU-0", "GPU-1")
    assert alloc.acquire("s2", shared(2, count=2)) == ("GPU-0", "GPU-1")
    with pytest.raises(NoGpuFree) as info:
        alloc.acquire("s3", shared(2, count=2))  # only GPU-2 has room
    assert info.value.available == 1
    assert alloc.acquire("s3", shared(2, count=1)) == ("GPU-2",)


def test_free_memory_breaks_ties():
    alloc = GpuAllocator(devices(3))
    alloc.set_free_memory({"GPU-2": 50 * G, "GPU-0": 10 * G})
    assert alloc.acquire("a", EXCLUSIVE) == ("GPU-2",)
    assert alloc.acquire("b", EXCLUSIVE) == ("GPU-0",)
    assert alloc.acquire("c", EXCLUSIVE) == ("GPU-1",)  # unknown free memory comes last


def test_packing_and_fewest_holders_come_before_free_memory():
    alloc = GpuAllocator(devices(3))
    alloc.acquire("a", shared(4))  # GPU-0
    alloc.set_free_memory({"GPU-0": 1 * G, "GPU-1": 70 * G, "GPU-2": 70 * G})
    assert alloc.acquire("b", shared(4)) == ("GPU-0",)  # an already shared GPU first
    alloc.adopt("c", ["GPU-1"], shared(4))  # GPU-1: 1 holder, GPU-0: 2
    alloc.set_free_memory({"GPU-0": 70 * G, "GPU-1": 1 * G, "GPU-2": 80 * G})
    assert alloc.acquire("d", shared(4)) == ("GPU-1",)  # fewest holders beats free memory


def test_acquire_twice_releases_the_first_holding():
    alloc = GpuAllocator(devices(1))
    assert alloc.acquire("a", EXCLUSIVE) == ("GPU-0",)
    assert alloc.acquire("a", EXCLUSIVE) == ("GPU-0",)  # not refused: its own GPU
    assert alloc.acquire("a", shared(2)) == ("GPU-0",)
    assert list(alloc.holdings()) == ["a"]
    assert alloc.holders("GPU-0") == ["a"]
    assert alloc.holding("a").request == shared(2)


def test_adopt_reports_conflicts_but_records_them():
    alloc = GpuAllocator(devices(2))
    alloc.acquire("a", EXCLUSIVE)
    assert alloc.adopt("b", ["GPU-0"], EXCLUSIVE) == ["GPU-0 is held by b and by a"]
    assert sorted(alloc.holders("GPU-0")) == ["a", "b"]  # reality wins
    assert alloc.usage() == Usage(2, 1, 0, 1)
    assert alloc.adopt("s1", ["GPU-1"], shared(2)) == []
    assert alloc.adopt("s2", ["GPU-1"], shared(2)) == []
    assert alloc.adopt("s3", ["GPU-1"], shared(2)) == ["GPU-1 is held by s3 and by s1, s2"]
    assert alloc.adopt("s4", ["GPU-0"], shared(9)) == ["GPU-0 is held by s4 and by a, b"]
    # unknown UUIDs are dropped; nothing known means no holding at all
    assert alloc.adopt("ghost", ["GPU-gone"], EXCLUSIVE) == []
    assert alloc.holding("ghost") is None
    alloc.adopt("half", ["GPU-gone", "GPU-1"], shared(9, count=2))
    assert alloc.holding("half").uuids == ("GPU-1",)


def test_available_counts():
    alloc = GpuAllocator(devices(3))
    assert alloc.available(EXCLUSIVE) == 3
    alloc.acquire("x", EXCLUSIVE)
    alloc.acquire("s", shared(2))
    assert alloc.available(EXCLUSIVE) == 1
    assert alloc.available(shared(2)) == 2  # GPU-1 has room for one more, GPU-2 is empty
    assert alloc.available(shared(1)) == 1  # only the empty one
    alloc.acquire("s2", shared(2))
    assert alloc.available(shared(2)) == 1
    assert GpuAllocator().available(EXCLUSIVE) == 0


def race(alloc: GpuAllocator, n: int) -> tuple[list[tuple[str, ...]], list[NoGpuFree]]:
    """n threads acquire one exclusive GPU each, all at once."""
    barrier = threading.Barrier(n)
    won: list[tuple[str, ...]] = []
    refused: list[NoGpuFree] = []

    def spawn(i: int) -> None:
        barrier.wait()
        try:
            won.append(alloc.acquire(f"user{i}", EXCLUSIVE))
        except NoGpuFree as e:
            refused.append(e)

    threads = [threading.Thread(target=spawn, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return won, refused


def test_concurrent_acquires_never_double_book():
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: races show
    try:
        for _ in range(30):
            alloc = GpuAllocator(devices(4))
            won, refused = race(alloc, 32)
            assert len(won) == 4 and len(refused) == 28
            assert sorted(u for (u,) in won) == ["GPU-0", "GPU-1", "GPU-2", "GPU-3"]
            assert all(e.available == 0 for e in refused)
            assert all(len(alloc.holders(f"GPU-{i}")) == 1 for i in range(4))
    finally:
        sys.setswitchinterval(interval)


OWNERS = [f"u{i}" for i in range(6)]
REQUESTS = st.builds(GpuRequest, count=st.integers(1, 3),
                     mode=st.sampled_from(["exclusive", "shared"]), share=st.integers(1, 4))


class AllocatorMachine(RuleBasedStateMachine):
    """The allocator against a plain model: owner -> (uuids, request)."""

    def __init__(self):
        super().__init__()
        self.alloc: GpuAllocator | None = None
        self.uuids: list[str] = []
        self.model: dict[str, tuple[tuple[str, ...], GpuRequest]] = {}
        self.free: dict[str, int] = {}

    @initialize(n=st.integers(1, 8))
    def inventory(self, n):
        self.alloc = GpuAllocator(devices(n))
        self.uuids = [f"GPU-{i}" for i in range(n)]

    # the reference: counted from the model, not from the allocator
    def holders(self, uuid: str) -> list[GpuRequest]:
        return [r for us, r in self.model.values() if uuid in us]

    def room(self, uuid: str, request: GpuRequest) -> bool:
        holders = self.holders(uuid)
        if not holders:
            return True
        if not request.shared or any(r.mode == "exclusive" for r in holders):
            return False
        return len(holders) < min(r.share for r in [request, *holders])

    def best(self, request: GpuRequest) -> list[str]:
        def rank(uuid: str):
            n = len(self.holders(uuid))
            return (request.shared and n == 0, n, -self.free.get(uuid, 0), self.uuids.index(uuid))

        return sorted((u for u in self.uuids if self.room(u, request)), key=rank)

    def usage(self) -> Usage:
        kinds = [{r.mode for r in self.holders(u)} for u in self.uuids]
        return Usage(len(self.uuids), sum("exclusive" in k for k in kinds),
                     sum(k == {"shared"} for k in kinds), sum(not k for k in kinds))

    @rule(owner=st.sampled_from(OWNERS), request=REQUESTS)
    def acquire(self, owner, request):
        self.model.pop(owner, None)  # an owner's old holding goes first
        expected = self.best(request)
        if len(expected) < request.count:
            with pytest.raises(NoGpuFree) as info:
                self.alloc.acquire(owner, request)
            assert info.value.available == len(expected)
            assert info.value.usage == self.usage()
        else:
            got = self.alloc.acquire(owner, request)
            assert got == tuple(expected[: request.count])
            self.model[owner] = (got, request)

    @rule(owner=st.sampled_from(OWNERS))
    def release(self, owner):
        held = self.model.pop(owner, ((), None))[0]
        assert self.alloc.release(owner) == held

    @rule(owner=st.sampled_from(OWNERS), request=REQUESTS, data=st.data())
    def adopt_free(self, owner, request, data):
        self.model.pop(owner, None)
        fitting = [u for u in self.uuids if self.room(u, request)]
        picked = data.draw(st.lists(st.sampled_from(fitting), unique=True, max_size=3)) \
            if fitting else []
        labels = picked + (["GPU-elsewhere"] if data.draw(st.booleans()) else [])
        adopted = GpuRequest(max(1, len(labels)), request.mode, request.share)
        assert self.alloc.adopt(owner, labels, adopted) == []
        if picked:
            self.model[owner] = (tuple(picked), adopted)

    @rule(data=st.data())
    def set_free_memory(self, data):
        self.free = data.draw(st.dictionaries(st.sampled_from(self.uuids),
                                              st.integers(0, 3).map(lambda n: n * G)))
        self.alloc.set_free_memory(self.free)

    @rule(request=REQUESTS)
    def available(self, request):
        assert self.alloc.available(request) == len(self.best(request))

    @invariant()
    def consistent(self):
        if self.alloc is None:
            return
        holdings = self.alloc.holdings()
        assert {o: (h.uuids, h.request) for o, h in holdings.items()} == self.model
        for h in holdings.values():
            assert len(set(h.uuids)) == len(h.uuids)
            assert set(h.uuids) <= set(self.uuids)
        for uuid in self.uuids:
            owners = self.alloc.holders(uuid)
            assert sorted(owners) == sorted(o for o, h in holdings.items() if uuid in h.uuids)
            requests = [holdings[o].request for o in owners]
            if any(not r.shared for r in requests):
                assert len(owners) == 1, f"{uuid}: exclusive holder shares with {owners}"
            if requests:
                assert len(owners) <= min(r.share for r in requests)
        assert self.alloc.usage() == self.usage()


TestAllocatorProperties = AllocatorMachine.TestCase
TestAllocatorProperties.settings = settings(
    max_examples=150, stateful_step_count=25, deadline=None, database=None)
