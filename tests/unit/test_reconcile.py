"""The GPU pool in step with Docker (spawner/docker/reconcile.py): labels, adoption,
release, zombies, free memory."""

from __future__ import annotations

import logging
import time

import pytest

from fake_pynvml import FakeGpu, FakeNvml
from spawner.contract import GPU_MODE_LABEL, GPUS_LABEL, HUB_LABEL, USER_LABEL
from spawner.docker import reconcile
from spawner.docker.reconcile import Claims, Reconciler, request_from_labels
from spawner.gpu import inventory
from spawner.gpu.allocator import GpuRequest, NoGpuFree
from spawner.gpu.inventory import declared_inventory, discover_nvml
from spawner.gpu.pool import GpuPool, mode_label
from spawner.usage.ledger import ZOMBIE

G = 2**30


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
    """A FAKE docker APIClient: the two calls the reconciler makes."""

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


def make_reconciler(containers, zombie_grace=300.0, known=None, n=4, remove_error=None):
    """A pool of ``n`` declared GPUs and its reconciler (``known``: the claimed containers)."""
    inv = declared_inventory([{"uuid": f"GPU-{i}"} for i in range(n)])
    docker = FakeDocker(containers, remove_error)
    log = logging.getLogger("test.gpu_pool")
    claims = Claims()
    claims.known.update(known or ())
    rec = Reconciler(GpuPool(inv, HUB, log), docker, log, zombie_grace=zombie_grace,
                     claims=claims)
    return rec, docker


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
    rec, _ = make_reconciler([
        container("x", "GPU-0", "exclusive"),
        container("s", "GPU-1", "shared:3"),
        container("old", "GPU-2", "exclusive", state="exited"),
        container("cpu", ""),
    ], known={"x", "s", "old", "cpu"})
    rec._reconcile(rec.client.list, 0.0)
    held = rec.pool.allocator.holdings()
    assert {o: (h.uuids, h.request) for o, h in held.items()} == {
        "x": (("GPU-0",), GpuRequest(1)),
        "s": (("GPU-1",), GpuRequest(1, "shared", 3)),
    }
    # what was adopted is never handed out again
    assert rec.pool.allocator.acquire("new", GpuRequest(1, "shared", 3)) == ("GPU-1",)
    assert rec.pool.allocator.acquire("new2", GpuRequest(2)) == ("GPU-2", "GPU-3")


def test_relabelled_container_is_readopted():
    rec, _ = make_reconciler([container("x", "GPU-1")], known={"x"})
    rec.pool.allocator.acquire("x", GpuRequest(1))  # GPU-0 in the allocator, GPU-1 on the label
    rec._reconcile(rec.client.list, 0.0)
    assert rec.pool.allocator.holding("x").uuids == ("GPU-1",)
    assert rec.pool.allocator.holders("GPU-0") == []


def test_gone_containers_release_but_starting_ones_keep(caplog):
    rec, _ = make_reconciler([container("stopped", "GPU-2", state="exited")])
    for owner in ("gone", "starting", "stopped"):
        rec.pool.acquire(owner, GpuRequest(1))
    rec.pool.starting.add("starting")
    with caplog.at_level(logging.INFO, logger="test.gpu_pool"):
        rec._reconcile(rec.client.list, time.monotonic())
    assert set(rec.pool.allocator.holdings()) == {"starting"}
    assert "GPU GPU-0 released by gone: its container is gone" in caplog.text


def test_a_list_taken_before_a_change_does_not_undo_it():
    rec, docker = make_reconciler([container("old", "GPU-1")], known={"old", "fresh"})
    rec._reconcile(docker.list, time.monotonic())  # adopts old on GPU-1
    listed_at = time.monotonic()
    rec.pool.acquire("fresh", GpuRequest(1))  # its container is not in the list yet
    rec.pool.release("old", "stopped")  # its container still is
    rec._reconcile(docker.list, listed_at)
    assert {o: h.uuids for o, h in rec.pool.allocator.holdings().items()} == {"fresh": ("GPU-0",)}
    # a list taken after both changes is believed
    rec._reconcile(docker.list, time.monotonic())
    assert {o: h.uuids for o, h in rec.pool.allocator.holdings().items()} == {"old": ("GPU-1",)}


async def test_sync_lists_all_containers_with_the_gpus_label():
    rec, docker = make_reconciler([container("x", "GPU-0", hub="other"),
                              {"Names": ["/unlabelled"], "State": "running", "Labels": {}}])
    await rec.sync()
    assert docker.listed == [{"all": True, "filters": {"label": GPUS_LABEL}}]
    assert set(rec.pool.allocator.holdings()) == {"x"}


async def test_unclaimed_container_reported_then_removed_after_grace(caplog):
    rec, docker = make_reconciler([container("zombie", "GPU-0", user="alice")], zombie_grace=3600)
    with caplog.at_level(logging.WARNING, logger="test.gpu_pool"):
        await rec.sync()
        await rec.sync()
    assert docker.removed == []
    assert rec.pool.allocator.holding("zombie").uuids == ("GPU-0",)  # adopted meanwhile
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [  # once, not at every sync
        "Container zombie (user alice, GPUs GPU-0) has this hub's labels, but no server "
        "of this hub claims it; it will be stopped in 3600 s unless one does"]

    rec.zombie_grace = 0
    await rec.sync()
    assert docker.removed == [("zombie", True)]
    assert rec.pool.allocator.holding("zombie") is None
    assert rec.pool.allocator.usage().free == 4


class FakeWriter:
    """The usage ledger's writer, as the reconciler tells it of removed zombies."""

    def __init__(self):
        self.closed: list[tuple[str, str, str]] = []

    async def close(self, hub: str, container: str, reason: str) -> None:
        self.closed.append((hub, container, reason))


async def test_a_removed_zombie_closes_its_session_as_zombie():
    rec, docker = make_reconciler([container("z", "GPU-0"), container("mine", "GPU-1")],
                                  zombie_grace=0, known={"mine"})
    rec.usage = writer = FakeWriter()
    await rec.sync()
    assert docker.removed == [("z", True)]
    assert writer.closed == [(HUB, "z", ZOMBIE)]  # never a claimed server's


async def test_zombie_without_gpus_is_removed_too():
    rec, docker = make_reconciler([container("cpu-zombie", "")], zombie_grace=0)
    await rec.sync()
    assert docker.removed == [("cpu-zombie", True)]


@pytest.mark.parametrize("how", ["known", "claim", "claim-late", "starting"])
async def test_claimed_containers_are_never_removed(how, caplog):
    rec, docker = make_reconciler([container("mine", "GPU-0")],
                                  zombie_grace=0 if how != "claim-late" else 3600,
                                  known={"mine"} if how == "known" else None)
    if how == "claim":
        rec.claims.claim("mine")
    if how == "starting":
        rec.pool.starting.add("mine")
    with caplog.at_level(logging.WARNING, logger="test.gpu_pool"):
        await rec.sync()
        if how == "claim-late":
            rec.claims.claim("mine")
            rec.zombie_grace = 0
        await rec.sync()
    assert docker.removed == []
    warned = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == (1 if how == "claim-late" else 0)


async def test_a_container_claimed_then_forgotten_gets_a_fresh_grace_period(caplog):
    rec, docker = make_reconciler([container("z", "GPU-0")], zombie_grace=3600)
    with caplog.at_level(logging.WARNING, logger="test.gpu_pool"):
        await rec.sync()  # suspected
        rec.claims.known.add("z")  # a spawner of this hub claims it (the set is shared)
        await rec.sync()
        rec.claims.known.discard("z")  # and lets it go again
        await rec.sync()  # suspected anew: warned again, a new grace period
    assert [r.getMessage().split(" has ")[0] for r in caplog.records] == ["Container z (user alice, GPUs GPU-0)"] * 2
    assert docker.removed == []


async def test_other_hubs_containers_hold_gpus_but_are_never_removed(caplog):
    rec, docker = make_reconciler([
        container("theirs", "GPU-0", "exclusive", hub="hub-2"),
        container("no-hub", "GPU-1", "shared:2", hub=None),
        container("no-user", "GPU-2", user=None),
    ], zombie_grace=0, n=3)
    with caplog.at_level(logging.WARNING, logger="test.gpu_pool"):
        await rec.sync()
        await rec.sync()
    assert docker.removed == []
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert {o: h.uuids for o, h in rec.pool.allocator.holdings().items()} == {
        "theirs": ("GPU-0",), "no-hub": ("GPU-1",), "no-user": ("GPU-2",)}
    with pytest.raises(NoGpuFree):
        rec.pool.allocator.acquire("new", GpuRequest(1))


class _NotFound(Exception):
    def __init__(self, status):
        super().__init__(f"status {status}")
        self.response = type("Response", (), {"status_code": status})()


async def test_zombie_already_gone_counts_as_removed():
    rec, docker = make_reconciler([container("z", "GPU-0")], zombie_grace=0,
                                  remove_error=_NotFound(404))
    await rec.sync()
    assert docker.removed == [("z", True)]
    assert rec.pool.allocator.holding("z") is None


async def test_zombie_that_cannot_be_removed_keeps_its_gpus(caplog):
    rec, docker = make_reconciler([container("z", "GPU-0")], zombie_grace=0,
                                  remove_error=_NotFound(500))
    with caplog.at_level(logging.ERROR, logger="test.gpu_pool"):
        await rec.sync()
    assert rec.pool.allocator.holding("z").uuids == ("GPU-0",)
    assert "Could not remove unclaimed container z" in caplog.text
    await rec.sync()
    assert docker.removed == [("z", True), ("z", True)]  # tried again


async def test_sync_samples_free_memory_for_an_nvml_inventory(monkeypatch):
    gpus = [FakeGpu(f"GPU-{i}", used=u * G) for i, u in enumerate((50, 10, 70))]
    nvml = FakeNvml(gpus)
    inv = discover_nvml(nvml)
    monkeypatch.setattr(reconcile, "free_memory",
                        lambda uuids: inventory.free_memory(uuids, nvml=nvml))
    log = logging.getLogger("test.gpu_pool")
    rec = Reconciler(GpuPool(inv, HUB, log), FakeDocker([]), log)
    await rec.sync()
    assert rec.pool.allocator.acquire("a", GpuRequest(1)) == ("GPU-1",)  # the most free memory
    assert rec.pool.allocator.acquire("b", GpuRequest(1)) == ("GPU-0",)
    assert nvml.initialized == 0


def test_a_container_in_its_start_boost_reserves_its_roles_cpus():
    from spawner.docker.reconcile import room_of
    from spawner.host.admission import Reservation

    boosted = {"HostConfig": {"CpuQuota": 1_600_000, "CpuPeriod": 100_000, "Memory": 2**30},
               "Config": {"Env": ["CPU_LIMIT=0.5", "MEM_LIMIT=1073741824"]}}
    assert room_of(boosted) == Reservation(0.5, 2**30)
    without = {"HostConfig": {"NanoCpus": 2 * 10**9, "Memory": 2**30}, "Config": {"Env": []}}
    assert room_of(without) == Reservation(2.0, 2**30)
    odd = {"HostConfig": {"CpuQuota": 50_000, "CpuPeriod": 100_000}, "Config": {
        "Env": ["CPU_LIMIT=nan"]}}
    assert room_of(odd) == Reservation(0.5, 0)
