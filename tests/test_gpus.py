"""GPUs without a GPU: quota fields, the allocator, NVML discovery (through a fake),
the container environment, the torch cap hook, the pool's sync with Docker, the form."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from fake_pynvml import (
    FakeGpu,
    FakeNvml,
    NVMLError_DriverNotLoaded,
    NVMLError_GpuIsLost,
    NVMLError_LibraryNotFound,
    NVMLError_NoPermission,
    NVMLError_NotSupported,
)
from spawner.cli import main as cli_main
from spawner.contract import CAP_VARIABLES, GPU_MODE_LABEL, GPUS_LABEL, HUB_LABEL, USER_LABEL
from spawner.gpu import inventory
from spawner.gpu import pool as gpu_pool
from spawner.gpu.allocator import GpuAllocator, GpuRequest, NoGpuFree, Usage
from spawner.gpu.env import gpu_environment, memory_fraction
from spawner.gpu.inventory import (
    GpuDevice,
    Inventory,
    declared_inventory,
    discover_nvml,
    free_memory,
)
from spawner.gpu.pool import GpuPool, mode_label, request_from_labels
from spawner.quota.form import describe_free, describe_gpus, describe_limits, render_form
from spawner.quota.loader import parse_quota_table
from spawner.quota.model import Choice, GpuCapacity, ImageSpec, QuotaTableError, Role
from spawner.quota.store import QuotaStore

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "hub_config" / "quotas.yaml"
G = 2**30


def line_of(text: str, needle: str, after: str | None = None) -> int:
    """The 1-based line of the first line holding ``needle`` (after the line holding ``after``)."""
    lines = text.splitlines()
    start = next(i for i, t in enumerate(lines) if after in t) if after else 0
    return next(i for i, t in enumerate(lines[start:], start + 1) if needle in t)


# --- 1. quota table: GPU fields ------------------------------------------------


def gpu_table(fields: str) -> str:
    """A table whose role 'r' has the given extra lines (one field a line)."""
    extra = "".join(f"    {line}\n" for line in fields.splitlines())
    return (
        "images:\n"
        "  pytorch:\n"
        "    image: quota-spawner/pytorch:latest\n"
        "roles:\n"
        "  cpu:\n"
        "    cpus: 1\n"
        "    memory: 1G\n"
        "    images: [pytorch]\n"
        "  r:\n"
        "    cpus: 1\n"
        "    memory: 1G\n"
        f"{extra}"
        "    images: [pytorch]\n"
        "assignments:\n"
        "  default: [cpu, r]\n"
    )


def problems(text: str, gpus: GpuCapacity | None = None, path: str = "q.yaml") -> list[str]:
    with pytest.raises(QuotaTableError) as info:
        parse_quota_table(text, path, gpus)
    return [str(p) for p in info.value.problems]


EXCLUSIVE_ONLY = "gpu_share needs gpu_mode: shared (exclusive GPUs have one user)"
CAP_NEEDS_SHARED = ("gpu_memory is the per-user cap on a shared GPU; it needs gpu_mode: shared "
                    "(an exclusive user has the whole GPU)")


@pytest.mark.parametrize("fields, capacity, expected", [
    ("gpus: 1\ngpu_share: 2", None, [("gpu_share", EXCLUSIVE_ONLY)]),
    ("gpus: 1\ngpu_mode: exclusive\ngpu_share: 2", None, [("gpu_share", EXCLUSIVE_ONLY)]),
    ("gpus: 1\ngpu_memory: 8G", None, [("gpu_memory", CAP_NEEDS_SHARED)]),
    ("gpus: 1\ngpu_mode: exclusive\ngpu_memory: 8G", None, [("gpu_memory", CAP_NEEDS_SHARED)]),
    ("gpus: 2\ngpu_mode: shared", None,
     [("gpu_mode", "gpu_mode: shared needs gpu_share, the most users on one GPU")]),
    ("gpus: 2\ngpu_mode: shared\ngpu_memory: 8G", None,
     [("gpu_mode", "gpu_mode: shared needs gpu_share, the most users on one GPU")]),
    ("gpus: 0\ngpu_mode: shared\ngpu_share: 2", None,
     [("gpu_mode", "gpu_mode applies only to a role with gpus of 1 or more"),
      ("gpu_share", "gpu_share applies only to a role with gpus of 1 or more")]),
    ("gpu_mode: exclusive", None,
     [("gpu_mode", "gpu_mode applies only to a role with gpus of 1 or more")]),
    ("gpu_memory: 8G", None,
     [("gpu_memory", "gpu_memory applies only to a role with gpus of 1 or more")]),
    ("gpus: -1", None, [("gpus", "gpus must be a whole number, 0 or more, not -1")]),
    ("gpus: two", None, [("gpus", "gpus must be a whole number, 0 or more, not text 'two'")]),
    ("gpus: 1.5", None, [("gpus", "gpus must be a whole number, 0 or more, not 1.5")]),
    ("gpus: true", None, [("gpus", "gpus must be a whole number, 0 or more, not True")]),
    ("gpus: 1\ngpu_mode: partial", None,
     [("gpu_mode", "gpu_mode must be one of exclusive, shared, not text 'partial'")]),
    ("gpus: 1\ngpu_mode: Shared\ngpu_share: 2", None,
     [("gpu_mode", "gpu_mode must be one of exclusive, shared, not text 'Shared'")]),
    ("gpus: 1\ngpu_mode: shared\ngpu_share: 0", None,
     [("gpu_share", "gpu_share must be a whole number of at least 1, not 0")]),
    ("gpus: 2", GpuCapacity(1, 80 * G),
     [("gpus", "gpus is 2, but this hub has only 1 GPU")]),
    ("gpus: 5\ngpu_mode: shared\ngpu_share: 2", GpuCapacity(4),
     [("gpus", "gpus is 5, but this hub has only 4 GPUs")]),
    ("gpus: 1\ngpu_mode: shared\ngpu_share: 2\ngpu_memory: 96G", GpuCapacity(2, 80 * G),
     [("gpu_memory", "gpu_memory 96 GiB is more than the smallest GPU's memory (80 GiB)")]),
    ("gpus: 3\ngpu_mode: shared\ngpu_share: 2\ngpu_memory: 96G", GpuCapacity(2, 80 * G),
     [("gpus", "gpus is 3, but this hub has only 2 GPUs"),
      ("gpu_memory", "gpu_memory 96 GiB is more than the smallest GPU's memory (80 GiB)")]),
])
def test_gpu_field_problems_with_file_and_line(fields, capacity, expected):
    text = gpu_table(fields)
    want = [f"q.yaml:{line_of(text, key + ':', after='  r:')}: role 'r': {message}"
            for key, message in expected]
    assert problems(text, capacity) == want


def test_gpu_problems_in_several_roles_are_all_reported_in_line_order():
    text = gpu_table("gpus: 1\ngpu_share: 2").replace(
        "  cpu:\n    cpus: 1\n", "  cpu:\n    cpus: 1\n    gpu_mode: shared\n")
    assert problems(text) == [
        f"q.yaml:{line_of(text, 'gpu_mode')}: role 'cpu': gpu_mode applies only to a role "
        "with gpus of 1 or more",
        f"q.yaml:{line_of(text, 'gpu_share')}: role 'r': {EXCLUSIVE_ONLY}",
    ]


def test_valid_gpu_roles_parse():
    text = gpu_table("gpus: 2\ngpu_mode: shared\ngpu_share: 3\ngpu_memory: 80G").replace(
        "assignments:",
        "  whole:\n    cpus: 1\n    memory: 1G\n    images: [pytorch]\n"
        "    gpus: 1\n    gpu_mode: exclusive\nassignments:")
    table = parse_quota_table(text, "q.yaml", GpuCapacity(2, 80 * G))  # both at the limit
    r = table.roles["r"]
    assert (r.gpus, r.gpu_mode, r.gpu_share, r.gpu_memory) == (2, "shared", 3, 80 * G)
    whole = table.roles["whole"]
    assert (whole.gpus, whole.gpu_mode, whole.gpu_share, whole.gpu_memory) == (
        1, "exclusive", 1, None)
    cpu = table.roles["cpu"]
    assert (cpu.gpus, cpu.gpu_mode, cpu.gpu_share, cpu.gpu_memory) == (0, "exclusive", 1, None)


@pytest.mark.parametrize("capacity", [None, GpuCapacity(0), GpuCapacity(0, 8 * G),
                                      GpuCapacity(8)])
def test_gpu_roles_accepted_without_inventory_or_memory_figure(capacity):
    # No inventory: GPU roles are refused at spawn time, not when the table loads.
    # No memory figure: gpu_memory cannot be checked against it.
    text = gpu_table("gpus: 8\ngpu_mode: shared\ngpu_share: 2\ngpu_memory: 1T")
    assert parse_quota_table(text, "q.yaml", capacity).roles["r"].gpus == 8


def test_example_table_valid_for_one_80g_gpu():
    text = EXAMPLE.read_text()
    table = parse_quota_table(text, str(EXAMPLE), GpuCapacity(1, 80 * G))
    shared = [r for r in table.roles.values() if r.gpu_mode == "shared" and r.gpus]
    exclusive = [r for r in table.roles.values() if r.gpu_mode == "exclusive" and r.gpus]
    assert shared and exclusive
    # and a GPU smaller than a shared role's cap is caught, at that role's gpu_memory line
    role = next(r for r in shared if r.gpu_memory)
    small = role.gpu_memory // 2
    found = problems(text, GpuCapacity(1, small), str(EXAMPLE))
    line = line_of(text, "gpu_memory:", after=f"  {role.name}:")
    assert any(p.startswith(f"{EXAMPLE}:{line}: role '{role.name}': gpu_memory ") for p in found)


def test_store_revalidates_when_capacity_changes(tmp_path, caplog):
    path = tmp_path / "quotas.yaml"
    text = gpu_table("gpus: 2")
    path.write_text(text)
    log = logging.getLogger("test.store")
    store = QuotaStore(str(path))
    assert store.get(log, GpuCapacity(0)).roles["r"].gpus == 2
    assert store.problems == []
    with caplog.at_level(logging.ERROR):
        kept = store.get(log, GpuCapacity(1))  # same file, smaller hub
    assert kept.roles["r"].gpus == 2  # the last good table stays in use
    line = line_of(text, "gpus:")
    assert [str(p) for p in store.problems] == [
        f"{path}:{line}: role 'r': gpus is 2, but this hub has only 1 GPU"]
    assert f"{path}:{line}: role 'r': gpus is 2" in caplog.text
    store.get(log, GpuCapacity(2))
    assert store.problems == []
    with pytest.raises(QuotaTableError):
        QuotaStore(str(path)).get(log, GpuCapacity(1))  # never a good table


# --- 2. allocator ---------------------------------------------------------------


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


# --- 3. inventory, with the fake NVML --------------------------------------------


def two_gpus() -> list[FakeGpu]:
    return [FakeGpu("GPU-aaaa", "NVIDIA H100 80GB HBM3", 80 * G, used=30 * G),
            FakeGpu("GPU-bbbb", "NVIDIA A100-SXM4-40GB", 40 * G)]


@pytest.mark.parametrize("bytes_strings", [False, True])
def test_discover_two_gpus(bytes_strings):
    nvml = FakeNvml(two_gpus(), bytes_strings=bytes_strings)
    assert discover_nvml(nvml) == Inventory((
        GpuDevice("0", "GPU-aaaa", "NVIDIA H100 80GB HBM3", 80 * G),
        GpuDevice("1", "GPU-bbbb", "NVIDIA A100-SXM4-40GB", 40 * G),
    ), "nvml", "")
    assert nvml.calls[0] == "nvmlInit" and nvml.calls[-1] == "nvmlShutdown"
    assert nvml.initialized == 0


def test_discover_mig_instances_replace_their_gpu():
    gpus = two_gpus()
    gpus[1].mig_mode = 1
    gpus[1].mig = [FakeGpu("MIG-b0", "NVIDIA A100-SXM4-40GB MIG 3g.20gb", 20 * G), None,
                   FakeGpu("MIG-b2", "NVIDIA A100-SXM4-40GB MIG 1g.5gb", 5 * G)]
    gpus[0].mig_mode = 0  # MIG capable, but off: the whole GPU
    nvml = FakeNvml(gpus)
    inv = discover_nvml(nvml)
    assert inv.devices == (
        GpuDevice("0", "GPU-aaaa", "NVIDIA H100 80GB HBM3", 80 * G),
        GpuDevice("1:0", "MIG-b0", "NVIDIA A100-SXM4-40GB MIG 3g.20gb", 20 * G, "GPU-bbbb"),
        GpuDevice("1:2", "MIG-b2", "NVIDIA A100-SXM4-40GB MIG 1g.5gb", 5 * G, "GPU-bbbb"),
    )
    assert inv.uuids == ("GPU-aaaa", "MIG-b0", "MIG-b2")
    assert nvml.initialized == 0


def test_mig_on_without_instances_offers_nothing_of_that_gpu():
    gpus = two_gpus()
    gpus[0].mig_mode = 1
    assert discover_nvml(FakeNvml(gpus)).uuids == ("GPU-bbbb",)


@pytest.mark.parametrize("error, reason", [
    (NVMLError_LibraryNotFound, "NVML: NVML Shared Library Not Found"),
    (NVMLError_DriverNotLoaded, "NVML: Driver Not Loaded"),
])
def test_no_library_or_driver_is_a_reason_not_an_exception(error, reason):
    nvml = FakeNvml(two_gpus(), init_error=error)
    assert discover_nvml(nvml) == Inventory((), "none", reason)
    assert nvml.calls == ["nvmlInit"]  # no shutdown without an init
    assert free_memory(["GPU-aaaa"], nvml) == {}


def test_binding_not_installed(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    inv = discover_nvml()
    assert inv == Inventory((), "none", "the NVML binding (nvidia-ml-py) is not installed")
    assert inv.describe() == "no GPUs (the NVML binding (nvidia-ml-py) is not installed)"
    assert free_memory(["GPU-x"]) == {}


@pytest.mark.parametrize("function, error, reason", [
    ("nvmlDeviceGetCount", NVMLError_NoPermission, "NVML: Insufficient Permissions"),
    ("nvmlDeviceGetHandleByIndex", NVMLError_GpuIsLost,
     "GPU 0 skipped: NVML: GPU is lost; GPU 1 skipped: NVML: GPU is lost"),
])
def test_error_mid_discovery_gives_empty_inventory_and_shuts_down(function, error, reason):
    nvml = FakeNvml(two_gpus(), fail={function: error})
    assert discover_nvml(nvml) == Inventory((), "none", reason)
    assert nvml.calls[-1] == "nvmlShutdown" and nvml.initialized == 0


@pytest.mark.parametrize("lost", ["a whole GPU", "a MIG instance"])
def test_a_lost_gpu_is_skipped_and_the_others_kept(lost):
    gpus = [*two_gpus(), FakeGpu("GPU-cccc", mig_mode=1, mig=[FakeGpu("MIG-c0", memory=10 * G)])]
    if lost == "a whole GPU":
        gpus[0].fail["nvmlDeviceGetUUID"] = NVMLError_GpuIsLost
        index, kept = 0, [("1", "GPU-bbbb"), ("2:0", "MIG-c0")]
    else:  # none of that GPU's instances, and nothing half-read
        gpus[2].mig[0].fail["nvmlDeviceGetUUID"] = NVMLError_GpuIsLost
        index, kept = 2, [("0", "GPU-aaaa"), ("1", "GPU-bbbb")]
    nvml = FakeNvml(gpus)
    inv = discover_nvml(nvml)
    assert (inv.source, inv.reason) == ("nvml", f"GPU {index} skipped: NVML: GPU is lost")
    assert [(d.index, d.uuid) for d in inv.devices] == kept
    assert nvml.initialized == 0


def test_unsupported_fields_become_unknown():
    gpus = two_gpus()
    gpus[0].fail["nvmlDeviceGetMemoryInfo"] = NVMLError_NotSupported
    gpus[1].fail["nvmlDeviceGetName"] = NVMLError_NotSupported
    nvml = FakeNvml(gpus, fail={"nvmlShutdown": NVMLError_GpuIsLost})  # and a failing shutdown
    assert discover_nvml(nvml).devices == (
        GpuDevice("0", "GPU-aaaa", "NVIDIA H100 80GB HBM3", None),
        GpuDevice("1", "GPU-bbbb", "GPU", 40 * G),
    )


def test_no_gpus_found():
    inv = discover_nvml(FakeNvml([]))
    assert inv == Inventory((), "none", "NVML found no GPUs")
    assert inv.describe() == "no GPUs (NVML found no GPUs)"


def test_free_memory():
    gpus = two_gpus()
    gpus[1].mig_mode = 1
    gpus[1].mig = [FakeGpu("MIG-b0", memory=20 * G, used=5 * G)]
    gpus[1].fail["nvmlDeviceGetMemoryInfo"] = NVMLError_GpuIsLost
    nvml = FakeNvml(gpus)
    assert free_memory(["GPU-aaaa", "MIG-b0", "GPU-bbbb", "GPU-missing"], nvml) == {
        "GPU-aaaa": 50 * G, "MIG-b0": 15 * G}
    assert nvml.initialized == 0


def test_declared_inventory():
    inv = declared_inventory([
        {"uuid": "GPU-1", "name": "A100", "memory": "80G"},
        {"uuid": " GPU-2 "},
        {"uuid": "MIG-3", "index": "0:1", "memory": 5 * G, "parent": "GPU-1"},
    ])
    assert inv == Inventory((
        GpuDevice("0", "GPU-1", "A100", 80 * G),
        GpuDevice("1", "GPU-2", "GPU", None),
        GpuDevice("0:1", "MIG-3", "GPU", 5 * G, "GPU-1"),
    ), "declared")
    assert inv.describe() == "3 GPUs from declared: 0: A100 GPU-1, 1: GPU GPU-2, 0:1: GPU MIG-3"
    assert declared_inventory([]) == Inventory((), "declared")


@pytest.mark.parametrize("entries, message", [
    ([{"uuid": "GPU-1"}, {"uuid": "GPU-1"}], "GPU GPU-1 is declared twice"),
    ([{"name": "A100"}], "GPU 0 in the declared inventory needs a 'uuid'"),
    ([{"uuid": "GPU-1"}, {"uuid": ""}], "GPU 1 in the declared inventory needs a 'uuid'"),
    ([{"uuid": "GPU-1,GPU-2"}], "without commas or spaces"),
    ([{"uuid": "GPU 1"}], "without commas or spaces"),
    ([{"uuid": "GPU-1", "memory": "lots"}], "cannot read 'lots' as a size"),
])
def test_declared_inventory_rejects(entries, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        declared_inventory(entries)


def test_fake_matches_real_pynvml_error_texts():
    pynvml = pytest.importorskip("pynvml")
    for name in ("LibraryNotFound", "DriverNotLoaded", "NotSupported", "NotFound",
                 "GpuIsLost", "NoPermission"):
        real, fake = getattr(pynvml, f"NVMLError_{name}"), getattr(FakeNvml, f"NVMLError_{name}")
        assert str(real()) == str(fake()) and real().value == fake().value, name


# --- 4. the container environment ---------------------------------------------------


def test_no_gpus_only_void():
    assert gpu_environment([]) == {"NVIDIA_VISIBLE_DEVICES": "void"}
    assert gpu_environment([], 16 * G, 80 * G) == {"NVIDIA_VISIBLE_DEVICES": "void"}


def test_exclusive_only_the_uuids():
    assert gpu_environment(["GPU-a", "GPU-b"]) == {"NVIDIA_VISIBLE_DEVICES": "GPU-a,GPU-b"}


def test_soft_cap_variables():
    env = gpu_environment(["GPU-a"], 16 * G, 80 * G)
    assert env == {
        "NVIDIA_VISIBLE_DEVICES": "GPU-a",
        "GPU_MEMORY_LIMIT": str(16 * G),
        "FLAGS_gpu_memory_limit_mb": "16384",
        "FLAGS_allocator_strategy": "auto_growth",
        "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
        "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.200",
        "TF_FORCE_GPU_ALLOW_GROWTH": "true",
    }
    assert set(CAP_VARIABLES) == set(env) - {"NVIDIA_VISIBLE_DEVICES"}
    assert len(CAP_VARIABLES) == len(set(CAP_VARIABLES))
    # without the card's size, JAX gets no fraction; the rest stays
    assert set(gpu_environment(["GPU-a"], 16 * G)) == set(env) - {
        "XLA_PYTHON_CLIENT_MEM_FRACTION"}


@pytest.mark.parametrize("cap, device, text", [
    (2 * G, 3 * G, "0.666"),  # rounded down, never up
    (G, 3 * G, "0.333"),
    (10 * G, 80 * G, "0.125"),
    (96 * G, 80 * G, "1.000"),
    (1, 80 * G, "0.001"),
])
def test_memory_fraction_rounds_down(cap, device, text):
    assert f"{memory_fraction(cap, device):.3f}" == text
    assert gpu_environment(["GPU-a"], cap, device)["XLA_PYTHON_CLIENT_MEM_FRACTION"] == text
    assert memory_fraction(cap, device) <= max(0.001, cap / device)


# --- 5. the torch cap hook, in a child process with a fake torch ---------------------


FAKE_TORCH_CUDA = '''\
"""A FAKE torch.cuda: records what the cap hook queues and what it sets."""
queued = []
fractions = []
TOTALS = [80 * 2**30, 16 * 2**30]


class _Properties:
    def __init__(self, total):
        self.total_memory = total


def _lazy_call(fn):
    queued.append(fn)


def device_count():
    return len(TOTALS)


def get_device_properties(device):
    return _Properties(TOTALS[device])


def set_per_process_memory_fraction(fraction, device):
    fractions.append([device, fraction])
'''

REPORT = (  # after the lines that set `hooked`: import torch, run CUDA's lazy init, print
    "import torch\n"
    "queued = len(torch.cuda.queued)\n"
    "[fn() for fn in list(torch.cuda.queued)]\n"
    "print(json.dumps({'hooked': hooked, 'queued': queued, 'fractions': torch.cuda.fractions}))\n"
)
HOOKS = "sum(type(f).__name__ == '_TorchImportHook' for f in sys.meta_path)"


def cap_child(torch_first: bool = False, installs: int = 1) -> str:
    """Install the hook (after or before torch is imported), then REPORT."""
    return (
        "import json, sys\n"
        + ("import torch\n" if torch_first else "")
        + "import spawner.gpu.torch_cap as m\n"
        + "m.install()\n" * installs
        + f"hooked = {HOOKS}\n"
        + REPORT
        + f"assert {HOOKS} == 0, 'the hook stays after torch was imported'\n"
    )


@pytest.fixture
def fake_torch(tmp_path):
    package = tmp_path / "fake" / "torch"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text('"""A FAKE torch."""\nfrom . import cuda  # noqa\n')
    (package / "cuda.py").write_text(FAKE_TORCH_CUDA)
    return package.parent


def run_child(code: str, fake: Path, limit: str | None, *args: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("GPU_MEMORY_LIMIT", "PYTHONPATH")}
    env["PYTHONPATH"] = f"{fake}{os.pathsep}{ROOT}"
    if limit is not None:
        env["GPU_MEMORY_LIMIT"] = limit
    result = subprocess.run([sys.executable, "-c", code, *args], env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("torch_first", [False, True])
def test_torch_cap_applied_to_every_device(fake_torch, torch_first):
    out = run_child(cap_child(torch_first, installs=1 if torch_first else 2), fake_torch,
                    str(20 * G))
    assert out["fractions"] == [[0, 0.25], [1, 1.0]]  # 20G of 80G; more than 16G -> all of it
    assert out["queued"] == 1  # one lazy call, however often install() ran
    assert out["hooked"] == (0 if torch_first else 1)


@pytest.mark.parametrize("limit", [None, "", "0", "-5", "lots"])
def test_torch_untouched_without_a_valid_limit(fake_torch, limit):
    assert run_child(cap_child(), fake_torch, limit) == {
        "hooked": 0, "queued": 0, "fractions": []}


PTH = ROOT / "images" / "common" / "quota_spawner_gpu_cap.pth"


def pth_line() -> str:
    script = (ROOT / "images" / "common" / "notebook-setup.sh").read_text()
    assert f'"$HERE/{PTH.name}"' in script, "notebook-setup.sh no longer installs the .pth file"
    return PTH.read_text().strip()


@pytest.mark.parametrize("limit, hooked, fractions", [
    (str(8 * G), True, [[0, 0.1], [1, 0.5]]),
    (None, False, []),
    ("", False, []),
])
def test_pth_line_from_notebook_setup(fake_torch, tmp_path, limit, hooked, fractions):
    site_dir = tmp_path / "site"
    site_dir.mkdir()
    (site_dir / "quota_spawner_gpu_cap.pth").write_text(pth_line() + "\n")
    code = (
        "import json, site, sys\n"
        "site.addsitedir(sys.argv[1])\n"
        "hooked = 'spawner.gpu.torch_cap' in sys.modules\n"
        + REPORT
    )
    out = run_child(code, fake_torch, limit, str(site_dir))
    assert out["hooked"] is hooked
    assert out["fractions"] == fractions


# --- 6. the pool in step with Docker --------------------------------------------------


HUB = "hub-1"


def container(name: str, gpus: str = "", mode: str | None = None, state: str = "running",
              hub: str | None = HUB, user: str | None = "alice") -> dict:
    labels = {GPUS_LABEL: gpus}
    if mode:
        labels[GPU_MODE_LABEL] = mode
    if hub:
        labels[HUB_LABEL] = hub
    if user:
        labels[USER_LABEL] = user
    return {"Names": [f"/{name}"], "State": state, "Labels": labels}


class FakeDocker:
    """A FAKE docker APIClient: the two calls the pool makes."""

    def __init__(self, containers: list[dict], remove_error: Exception | None = None):
        self.list = containers
        self.remove_error = remove_error
        self.listed: list[dict] = []
        self.removed: list[tuple[str, bool]] = []

    def containers(self, all=False, filters=None):
        self.listed.append({"all": all, "filters": filters})
        key = (filters or {}).get("label")
        return [c for c in self.list if all or c["State"] == "running"
                if key is None or key in c["Labels"]]

    def remove_container(self, name, force=False):
        self.removed.append((name, force))
        if self.remove_error is not None:
            raise self.remove_error
        self.list = [c for c in self.list if c["Names"] != [f"/{name}"]]


def make_pool(containers, zombie_grace=300.0, known=None, n=4, remove_error=None):
    inv = declared_inventory([{"uuid": f"GPU-{i}"} for i in range(n)])
    docker = FakeDocker(containers, remove_error)
    pool = GpuPool(inv, HUB, docker, logging.getLogger("test.gpu_pool"),
                   zombie_grace=zombie_grace, known=known)
    return pool, docker


def test_labels_round_trip():
    assert request_from_labels({GPUS_LABEL: "GPU-0,GPU-1", GPU_MODE_LABEL: "shared:3"}) == (
        ("GPU-0", "GPU-1"), GpuRequest(2, "shared", 3))
    assert request_from_labels({GPUS_LABEL: "GPU-0"}) == (("GPU-0",), GpuRequest(1))
    assert request_from_labels({GPUS_LABEL: "GPU-0", GPU_MODE_LABEL: "shared:x"}) == (
        ("GPU-0",), GpuRequest(1, "shared", 1))
    assert request_from_labels({GPUS_LABEL: ""}) == ((), None)
    assert request_from_labels({}) == ((), None)
    for request in (GpuRequest(1), GpuRequest(2, "shared", 4)):
        labels = {GPUS_LABEL: ",".join(f"GPU-{i}" for i in range(request.count)),
                  GPU_MODE_LABEL: mode_label(request)}
        assert request_from_labels(labels)[1] == request
    assert mode_label(None) == ""


def test_rebuild_adopts_running_containers():
    pool, _ = make_pool([
        container("x", "GPU-0", "exclusive"),
        container("s", "GPU-1", "shared:3"),
        container("old", "GPU-2", "exclusive", state="exited"),
        container("cpu", ""),
    ], known={"x", "s", "old", "cpu"})
    pool._reconcile(pool._docker.list, 0.0)
    held = pool.allocator.holdings()
    assert {o: (h.uuids, h.request) for o, h in held.items()} == {
        "x": (("GPU-0",), GpuRequest(1)),
        "s": (("GPU-1",), GpuRequest(1, "shared", 3)),
    }
    # what was adopted is never handed out again
    assert pool.allocator.acquire("new", GpuRequest(1, "shared", 3)) == ("GPU-1",)
    assert pool.allocator.acquire("new2", GpuRequest(2)) == ("GPU-2", "GPU-3")


def test_relabelled_container_is_readopted():
    pool, _ = make_pool([container("x", "GPU-1")], known={"x"})
    pool.allocator.acquire("x", GpuRequest(1))  # GPU-0 in the allocator, GPU-1 on the label
    pool._reconcile(pool._docker.list, 0.0)
    assert pool.allocator.holding("x").uuids == ("GPU-1",)
    assert pool.allocator.holders("GPU-0") == []


def test_gone_containers_release_but_starting_ones_keep(caplog):
    pool, _ = make_pool([container("stopped", "GPU-2", state="exited")])
    for owner in ("gone", "starting", "stopped"):
        pool.acquire(owner, GpuRequest(1))
    pool.starting.add("starting")
    with caplog.at_level(logging.INFO, logger="test.gpu_pool"):
        pool._reconcile(pool._docker.list, time.monotonic())
    assert set(pool.allocator.holdings()) == {"starting"}
    assert "GPU GPU-0 released by gone: its container is gone" in caplog.text


def test_a_list_taken_before_a_change_does_not_undo_it():
    pool, docker = make_pool([container("old", "GPU-1")], known={"old", "fresh"})
    pool._reconcile(docker.list, time.monotonic())  # adopts old on GPU-1
    listed_at = time.monotonic()
    pool.acquire("fresh", GpuRequest(1))  # its container is not in the list yet
    pool.release("old", "stopped")  # its container still is
    pool._reconcile(docker.list, listed_at)
    assert {o: h.uuids for o, h in pool.allocator.holdings().items()} == {"fresh": ("GPU-0",)}
    # a list taken after both changes is believed
    pool._reconcile(docker.list, time.monotonic())
    assert {o: h.uuids for o, h in pool.allocator.holdings().items()} == {"old": ("GPU-1",)}


async def test_sync_lists_all_containers_with_the_gpus_label():
    pool, docker = make_pool([container("x", "GPU-0", hub="other"),
                              {"Names": ["/unlabelled"], "State": "running", "Labels": {}}])
    await pool.sync()
    assert docker.listed == [{"all": True, "filters": {"label": GPUS_LABEL}}]
    assert set(pool.allocator.holdings()) == {"x"}


async def test_unclaimed_container_reported_then_removed_after_grace(caplog):
    pool, docker = make_pool([container("zombie", "GPU-0", user="alice")], zombie_grace=3600)
    with caplog.at_level(logging.WARNING, logger="test.gpu_pool"):
        await pool.sync()
        await pool.sync()
    assert docker.removed == []
    assert pool.allocator.holding("zombie").uuids == ("GPU-0",)  # adopted meanwhile
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [  # once, not at every sync
        "Container zombie (user alice, GPUs GPU-0) has this hub's labels, but no server "
        "of this hub claims it; it will be stopped in 3600 s unless one does"]

    pool.zombie_grace = 0
    await pool.sync()
    assert docker.removed == [("zombie", True)]
    assert pool.allocator.holding("zombie") is None
    assert pool.allocator.usage().free == 4


async def test_zombie_without_gpus_is_removed_too():
    pool, docker = make_pool([container("cpu-zombie", "")], zombie_grace=0)
    await pool.sync()
    assert docker.removed == [("cpu-zombie", True)]


@pytest.mark.parametrize("how", ["known", "claim", "claim-late", "starting"])
async def test_claimed_containers_are_never_removed(how, caplog):
    pool, docker = make_pool([container("mine", "GPU-0")],
                             zombie_grace=0 if how != "claim-late" else 3600,
                             known={"mine"} if how == "known" else None)
    if how == "claim":
        pool.claim("mine")
    if how == "starting":
        pool.starting.add("mine")
    with caplog.at_level(logging.WARNING, logger="test.gpu_pool"):
        await pool.sync()
        if how == "claim-late":
            pool.claim("mine")
            pool.zombie_grace = 0
        await pool.sync()
    assert docker.removed == []
    warned = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == (1 if how == "claim-late" else 0)


async def test_a_container_claimed_then_forgotten_gets_a_fresh_grace_period(caplog):
    pool, docker = make_pool([container("z", "GPU-0")], zombie_grace=3600)
    with caplog.at_level(logging.WARNING, logger="test.gpu_pool"):
        await pool.sync()  # suspected
        pool.known.add("z")  # a spawner of this hub claims it (the set is shared)
        await pool.sync()
        pool.known.discard("z")  # and lets it go again
        await pool.sync()  # suspected anew: warned again, a new grace period
    assert [r.getMessage().split(" has ")[0] for r in caplog.records] == ["Container z (user alice, GPUs GPU-0)"] * 2
    assert docker.removed == []


async def test_other_hubs_containers_hold_gpus_but_are_never_removed(caplog):
    pool, docker = make_pool([
        container("theirs", "GPU-0", "exclusive", hub="hub-2"),
        container("no-hub", "GPU-1", "shared:2", hub=None),
        container("no-user", "GPU-2", user=None),
    ], zombie_grace=0, n=3)
    with caplog.at_level(logging.WARNING, logger="test.gpu_pool"):
        await pool.sync()
        await pool.sync()
    assert docker.removed == []
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert {o: h.uuids for o, h in pool.allocator.holdings().items()} == {
        "theirs": ("GPU-0",), "no-hub": ("GPU-1",), "no-user": ("GPU-2",)}
    with pytest.raises(NoGpuFree):
        pool.allocator.acquire("new", GpuRequest(1))


class _NotFound(Exception):
    def __init__(self, status):
        super().__init__(f"status {status}")
        self.response = type("Response", (), {"status_code": status})()


async def test_zombie_already_gone_counts_as_removed():
    pool, docker = make_pool([container("z", "GPU-0")], zombie_grace=0,
                             remove_error=_NotFound(404))
    await pool.sync()
    assert docker.removed == [("z", True)]
    assert pool.allocator.holding("z") is None


async def test_zombie_that_cannot_be_removed_keeps_its_gpus(caplog):
    pool, docker = make_pool([container("z", "GPU-0")], zombie_grace=0,
                             remove_error=_NotFound(500))
    with caplog.at_level(logging.ERROR, logger="test.gpu_pool"):
        await pool.sync()
    assert pool.allocator.holding("z").uuids == ("GPU-0",)
    assert "Could not remove unclaimed container z" in caplog.text
    await pool.sync()
    assert docker.removed == [("z", True), ("z", True)]  # tried again


async def test_sync_samples_free_memory_for_an_nvml_inventory(monkeypatch):
    gpus = [FakeGpu(f"GPU-{i}", used=u * G) for i, u in enumerate((50, 10, 70))]
    nvml = FakeNvml(gpus)
    inv = discover_nvml(nvml)
    monkeypatch.setattr(gpu_pool, "free_memory",
                        lambda uuids: inventory.free_memory(uuids, nvml=nvml))
    pool = GpuPool(inv, HUB, FakeDocker([]), logging.getLogger("test.gpu_pool"))
    await pool.sync()
    assert pool.allocator.acquire("a", GpuRequest(1)) == ("GPU-1",)  # the most free memory
    assert pool.allocator.acquire("b", GpuRequest(1)) == ("GPU-0",)
    assert nvml.initialized == 0


# --- 7. the spawn form and the CLI -------------------------------------------------------


IMAGE = ImageSpec("pytorch", "quota-spawner/pytorch:latest", "PyTorch")
WHOLE = Role("gpu-training", 8, 32 * G, ("pytorch",), gpus=1)
TWO = Role("gpu-two", 8, 32 * G, ("pytorch",), gpus=2)
LAB = Role("gpu-lab", 2, 4 * G, ("pytorch",), gpus=1, gpu_mode="shared", gpu_share=3,
           gpu_memory=16 * G)
CPU = Role("cpu", 2, 4 * G, ("pytorch",))


def test_describe_gpus_and_free():
    assert describe_gpus(CPU) == ""
    assert describe_gpus(WHOLE) == "1 GPU, exclusive"
    assert describe_gpus(TWO) == "2 GPUs, exclusive"
    assert describe_gpus(LAB) == "1 GPU, shared by up to 3 · 16 GiB GPU memory cap"
    assert describe_gpus(Role("s", 1, G, ("pytorch",), gpus=1, gpu_mode="shared",
                              gpu_share=2)) == "1 GPU, shared by up to 2"
    assert describe_limits(WHOLE) == "8 CPUs · 32 GiB memory · 1 GPU, exclusive"
    assert describe_limits(CPU) == "2 CPUs · 4 GiB memory"
    assert describe_free(WHOLE, 2, 4) == "2 of 4 GPUs free now"
    assert describe_free(LAB, 3, 4) == "room on 3 of 4 GPUs now"
    assert describe_free(LAB, 0, 0) == "this hub has no GPUs"


def gpu_rows(html: str) -> dict[str, str]:
    """role name -> its GPU line, as (data-available, class, text)."""
    rows = {}
    for row in re.findall(r'<label .*?</label>', html):
        role = re.search(r'data-role="([^"]*)"', row).group(1)
        state = re.search(r'<div class="quota-gpus small ([^"]*)" data-available="(\d+)">'
                          r'([^<]*)</div>', row)
        rows[role] = state.groups() if state else None
    return rows


def test_form_shows_gpu_roles_and_what_is_free():
    choices = [Choice(r, IMAGE) for r in (CPU, WHOLE, TWO, LAB)]
    html = render_form(choices, gpus=({"gpu-training": 2, "gpu-two": 1, "gpu-lab": 3}, 4))
    assert "1 GPU, exclusive" in html and "shared by up to 3" in html
    assert gpu_rows(html) == {
        "cpu": None,
        "gpu-training": ("text-success", "2", "2 of 4 GPUs free now"),
        "gpu-two": ("text-danger", "1", "1 of 4 GPUs free now"),  # needs 2
        "gpu-lab": ("text-success", "3", "room on 3 of 4 GPUs now"),
    }
    none = render_form(choices, gpus=({}, 0))
    assert gpu_rows(none)["gpu-training"] == ("text-danger", "0", "this hub has no GPUs")
    assert "quota-gpus" not in render_form(choices)  # no GPU figures given


def test_form_escapes_gpu_role_text():
    evil = Role("<script>alert(1)</script>", 1, G, ("pytorch",), gpus=1,
                display_name="<script>x</script>", description="<b>bold</b>")
    image = ImageSpec("pytorch", "img", "<img src=x onerror=alert(1)>")
    html = render_form([Choice(evil, image), Choice(WHOLE, IMAGE)],
                       gpus=({evil.name: 1}, 1))
    assert "<script" not in html and "<img" not in html and "<b>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert 'data-available="1"' in html


def cli(capsys, *args: str) -> tuple[int, str]:
    code = cli_main(list(args))
    return code, capsys.readouterr().out


def test_cli_validate_against_a_gpu_count(tmp_path, capsys):
    path = tmp_path / "q.yaml"
    text = gpu_table("gpus: 2")
    path.write_text(text)
    code, out = cli(capsys, "validate", str(path), "--gpus", "1")
    assert code == 1
    assert out.strip() == f"{path}:{line_of(text, 'gpus: 2')}: role 'r': gpus is 2, but this hub has only 1 GPU"
    assert cli(capsys, "validate", str(path))[0] == 0  # no inventory given: not checked
    assert cli(capsys, "validate", str(path), "--gpus", "2")[0] == 0


def test_cli_validate_gpu_memory(tmp_path, capsys):
    path = tmp_path / "q.yaml"
    text = gpu_table("gpus: 1\ngpu_mode: shared\ngpu_share: 4\ngpu_memory: 48G")
    path.write_text(text)
    code, out = cli(capsys, "validate", str(path), "--gpus", "1", "--gpu-memory", "40G")
    assert code == 1
    assert out.strip() == (f"{path}:{line_of(text, 'gpu_memory')}: role 'r': gpu_memory 48 GiB "
                           "is more than the smallest GPU's memory (40 GiB)")
    assert cli(capsys, "validate", str(path), "--gpus", "1", "--gpu-memory", "80G")[0] == 0
    with pytest.raises(SystemExit) as info:
        cli_main(["validate", str(path), "--gpus", "1", "--gpu-memory", "lots"])
    assert info.value.code == 2
    assert "cannot read 'lots' as a size" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        cli_main(["validate", str(path), "--gpu-memory", "40G"])
    assert info.value.code == 2
    assert "--gpu-memory needs --gpus" in capsys.readouterr().err


def test_cli_validate_subprocess_exit_code(tmp_path):
    path = tmp_path / "q.yaml"
    path.write_text(gpu_table("gpus: 2"))
    result = subprocess.run([sys.executable, "-m", "spawner.cli", "validate", str(path),
                             "--gpus", "1"], capture_output=True, text=True)
    assert result.returncode == 1
    assert "gpus is 2, but this hub has only 1 GPU" in result.stdout


def test_cli_show_prints_gpus(tmp_path, capsys):
    path = tmp_path / "q.yaml"
    path.write_text(gpu_table("gpus: 1\ngpu_mode: shared\ngpu_share: 3\ngpu_memory: 16G"))
    code, out = cli(capsys, "show", str(path), "--user", "bob")
    assert code == 0
    assert "  cpu: 1 CPU · 1 GiB memory; images: pytorch" in out
    assert "  r: 1 CPU · 1 GiB memory · 1 GPU, shared by up to 3 · 16 GiB GPU memory cap" in out
    code, out = cli(capsys, "show", str(path), "--user", "bob", "--json")
    roles = {r["name"]: r for r in json.loads(out)["roles"]}
    assert {k: roles["r"][k] for k in ("gpus", "gpu_mode", "gpu_share", "gpu_memory")} == {
        "gpus": 1, "gpu_mode": "shared", "gpu_share": 3, "gpu_memory": 16 * G}
    assert {k: roles["cpu"][k] for k in ("gpus", "gpu_mode", "gpu_share", "gpu_memory")} == {
        "gpus": 0, "gpu_mode": None, "gpu_share": None, "gpu_memory": None}


def test_cli_show_example_gpu_role(capsys):
    code, out = cli(capsys, "show", str(EXAMPLE), "--user", "research-lead")
    assert code == 0
    assert re.search(r"gpu-training: .* · \d+ GPUs?, exclusive", out)


def test_torch_hook_stands_aside_for_a_torch_that_reads_the_allocator_setting(monkeypatch):
    from spawner.gpu import torch_cap as cap

    assert cap.reads_alloc_conf(cap.release("2.14.1+cu130")) and cap.reads_alloc_conf((3, 0))
    assert not cap.reads_alloc_conf(cap.release("2.7.1")) and not cap.reads_alloc_conf(None)
    assert cap.release("nightly") is None
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF",
                       "expandable_segments:True,per_process_memory_fraction:0.250")
    cap.drop_fraction_option()
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "per_process_memory_fraction:0.250")
    cap.drop_fraction_option()
    assert "PYTORCH_CUDA_ALLOC_CONF" not in os.environ
