"""What the admins' host map is drawn from, as its tests build it: the hub's GPU pool (a busy
pool: ``busy_pool``; a busy host with admission on: ``busy_host``) and a watchdog's
readings of the GPUs (``watched``, ``idle_book``) and of the host (``host_watched``), for
the data's tests (tests/unit/test_gpu_map.py, test_host_map.py) and the page's
(tests/service/test_gpus.py, test_gpus_host.py)."""

from __future__ import annotations

import logging

from spawner.gpu.allocator import GpuRequest
from spawner.gpu.inventory import declared_inventory
from spawner.gpu.pool import GpuPool, Server
from spawner.host.admission import HostBook, HostCapacity
from spawner.quota.model import Role
from spawner.usage.documents import GPUS, FolderDocuments
from spawner.usage.event_log import EventLog
from spawner.watchdog.model import GpuSample, ServerSample, Snapshot
from spawner.watchdog.model import Server as WatchedServer
from spawner.watchdog.rules import GPU_IDLE, Incident, IncidentBook

G = 2**30
T = 1_700_000_000.0
HUB = "hub-1"


# --- the GPUs: a busy pool, and a watchdog's readings of them --------------------------------


def make_pool(tmp_path=None, n=3) -> GpuPool:
    inv = declared_inventory([{"uuid": f"GPU-{i}", "name": "H200", "memory": "80G"}
                              for i in range(n)])
    events = EventLog("")
    publish = (lambda text: events.save(FolderDocuments(str(tmp_path)), GPUS, text)
               ) if tmp_path else None
    return GpuPool(inv, HUB, logging.getLogger("test.gpu_map"), events=events,
                   publish=publish)


def train() -> Role:
    return Role("train", 1, G, ("x",), gpus=2, priority=10)


async def busy_pool(tmp_path=None) -> GpuPool:
    """GPU-0 exclusive (alice), GPU-1 shared by two (bob, carol), GPU-2 free; dave waits
    for two exclusive GPUs."""
    pool = make_pool(tmp_path)
    pool.servers["quota-alice"] = Server("alice", "solo", T - 100)
    pool.acquire("quota-alice", GpuRequest(1))
    for who in ("bob", "carol"):
        pool.servers[f"quota-{who}"] = Server(who, "lab", T - 50)
        pool.acquire(f"quota-{who}", GpuRequest(1, "shared", 3, 8 * G))
    pool.join("quota-dave", Server("dave", "train", T), train())
    return pool


ALICE = WatchedServer(container_id="c1", name="quota-alice", user="alice", role="solo",
                      image="py", hub_id=HUB, gpus=("GPU-0",), gpu_mode="exclusive")
BOB = WatchedServer(container_id="c2", name="quota-bob", user="bob", role="lab",
                    image="py", hub_id=HUB, gpus=("GPU-1",), gpu_mode="shared:3")


def watched(at: float = T) -> Snapshot:
    return Snapshot(
        time=at, host="gpu-host-1",
        gpus={"GPU-0": GpuSample("GPU-0", 0, "H200", 1 * G, 80 * G, 0.0),
              "GPU-1": GpuSample("GPU-1", 1, "H200", 30 * G, 80 * G, 0.75),
              "GPU-2": GpuSample("GPU-2", 2, "H200", None, None, None, lost="GPU is lost"),
              "GPU-9": GpuSample("GPU-9", 9, "A100", 0, 40 * G, 0.0)},
        servers={"c1": ServerSample(ALICE, gpu_memory={"GPU-0": 1 * G}),
                 "c2": ServerSample(BOB, gpu_memory={"GPU-1": 6 * G})})


def idle_book() -> IncidentBook:
    book = IncidentBook()
    key = f"{GPU_IDLE}:quota-alice:GPU-0"
    book.open[key] = Incident(key=key, rule=GPU_IDLE, severity="info", server=ALICE,
                              since=T - 7200, gpu_uuid="GPU-0", opened=T - 3600)
    return book


# --- the host, with admission on: its room, and a watchdog's figures --------------------------


def pool(admission: bool = True, gpus: int = 1) -> GpuPool:
    """A hub of 16 CPUs and 64 GiB, 1 CPU and 4 GiB kept back: notebooks may reserve
    60 CPUs (4x) and 60 GiB (1x)."""
    inventory = declared_inventory([{"uuid": f"GPU-{i}", "memory": "80G"}
                                    for i in range(gpus)])
    found = GpuPool(inventory, "hub-1", logging.getLogger("test.host_map"))
    if admission:
        found.set_host(HostBook(HostCapacity(cpus=16, memory=64 * G, reserve_cpus=1,
                                             reserve_memory=4 * G)))
    return found


def role(name: str, cpus: float, memory_gib: float, gpus: int = 0, priority: int = 0) -> Role:
    return Role(name, cpus, int(memory_gib * G), ("p",), gpus=gpus, priority=priority)


def join(p: GpuPool, owner: str, user: str, r: Role):
    return p.join(owner, Server(user, r.name, T - 60), r)


async def busy_host() -> GpuPool:
    """alice (1 GPU, 0.5 CPUs, 2 GiB) and bob (CPU-only, 0.25 CPUs, 57 GiB) hold room;
    carol (CPU-only, 0.5 CPUs, 2 GiB) waits for memory, dave (a GPU) behind her."""
    p = pool(gpus=2)
    join(p, "quota-alice", "alice", role("solo", 0.5, 2, gpus=1))
    join(p, "quota-bob", "bob", role("big", 0.25, 57))
    join(p, "quota-carol", "carol", role("small", 0.5, 2, priority=5))
    join(p, "quota-dave", "dave", role("solo", 0.5, 2, gpus=1))
    return p


def leave_all(p: GpuPool) -> None:
    for ticket in p.queue.waiting():
        p.leave(ticket.owner, "test")


def watched_server(name: str, user: str, cpus: float | None, memory: int | None,
                   reserved: float | None = None) -> WatchedServer:
    return WatchedServer(container_id=f"id-{name}", name=name, user=user, role="r",
                         image="py", hub_id="hub-1", memory_limit=memory, cpus=cpus,
                         cpus_reserved=reserved if reserved is not None else cpus)


def host_watched(at: float = T) -> Snapshot:
    alice = watched_server("quota-alice", "alice", 0.5, 2 * G)
    # bob's start boost is not over in the watchdog's view: the role's CPUs count
    bob = watched_server("quota-bob", "bob", 16.0, 57 * G, reserved=0.25)
    return Snapshot(time=at, host="gpu-host-1", engine_cpus=16.0, engine_memory=64 * G,
                    servers={"id-a": ServerSample(alice, memory_working_set=G, cpu_used=0.25),
                             "id-b": ServerSample(bob, memory_working_set=G // 2,
                                                  cpu_used=None)})
