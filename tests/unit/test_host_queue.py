"""Host room in the queue (spawner/gpu/pool.py, gpu/queue.py with host/admission.py):
every start reserves its role's CPUs and memory, and waits in the GPU starts' queue, by
priority, then fairness between users, then arrival, while the host is full: under
BestEffortFIFO a start that fits is not held up by an older one that does not, under
StrictFIFO it is; each is told its own shortfall."""

from __future__ import annotations

import logging
import time
from types import SimpleNamespace

from spawner.docker.gpus import GpuStart
from spawner.gpu.inventory import declared_inventory
from spawner.gpu.pool import GpuPool, Server
from spawner.gpu.queue import BEST_EFFORT_FIFO, STRICT_FIFO
from spawner.host.admission import HostBook, HostCapacity, Reservation
from spawner.quota.model import Role

GiB = 2**30


def pool(memory_gib: int = 8, gpus: int = 0, strategy: str = BEST_EFFORT_FIFO) -> GpuPool:
    """A pool whose notebooks may reserve 8 CPUs and ``memory_gib`` GiB (no reserve)."""
    inventory = declared_inventory([{"uuid": f"GPU-{i}", "memory": "16G"}
                                    for i in range(gpus)])
    found = GpuPool(inventory, "hub", log=logging.getLogger("test"), strategy=strategy)
    found.set_host(HostBook(HostCapacity(cpus=8, memory=memory_gib * GiB, reserve_cpus=0,
                                         reserve_memory=0, cpu_ratio=1)))
    return found


def role(name: str, memory_gib: int, priority: int = 0, gpus: int = 0) -> Role:
    return Role(name, 1, memory_gib * GiB, ("p",), priority=priority, gpus=gpus)


def join(p: GpuPool, owner: str, r: Role, user: str | None = None):
    return p.join(owner, Server(user or owner, r.name, 0.0), r)


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


async def test_strict_fifo_nobody_behind_takes_room_that_someone_ahead_waits_for():
    p = pool(memory_gib=8, strategy=STRICT_FIFO)
    join(p, "a", role("half", 4))
    big = join(p, "big", role("big", 6))
    tiny = join(p, "tiny", role("tiny", 1))
    assert not big.grant.done()
    assert not tiny.grant.done()  # 5 GiB would fit, but 'big' is ahead
    assert big.room_sentence() == "the host's memory is fully reserved: 10 GiB of 8 GiB"
    # tiny is told why it waits, not big's figures as if they were its own
    assert tiny.short is None and tiny.behind.owner == "big"
    assert tiny.room_sentence() == (
        "this start would fit, but the queue is StrictFIFO and an older start waits ahead "
        "of it for room: big's (role 'big'), for which the host's memory is fully "
        "reserved: 10 GiB of 8 GiB")
    mid = join(p, "mid", role("mid", 5))  # would not fit on its own either: its own figures
    assert mid.room_sentence() == "the host's memory is fully reserved: 9 GiB of 8 GiB"
    p.release("a", "stopped")
    assert big.grant.done() and tiny.grant.done()  # 6 + 1 of 8
    assert mid.room_sentence() == "the host's memory is fully reserved: 12 GiB of 8 GiB"


async def test_best_effort_fifo_starts_what_fits_and_the_older_keeps_its_place():
    p = pool(memory_gib=8)  # BestEffortFIFO, the default
    join(p, "a", role("half", 4))
    big = join(p, "big", role("big", 6))
    tiny = join(p, "tiny", role("tiny", 1))
    assert not big.grant.done()
    assert tiny.grant.result() == ()  # 5 of 8: not held up by big, which does not fit
    mid = join(p, "mid", role("mid", 4))
    # each says its own shortfall
    assert big.room_sentence() == "the host's memory is fully reserved: 11 GiB of 8 GiB"
    assert mid.room_sentence() == "the host's memory is fully reserved: 9 GiB of 8 GiB"
    assert p.queue.position("big") == (1, 2) and p.queue.position("mid") == (2, 2)
    p.release("a", "stopped")  # 1 held: big goes first, mid then no longer fits
    assert big.grant.done() and not mid.grant.done()
    assert mid.room_sentence() == "the host's memory is fully reserved: 11 GiB of 8 GiB"
    p.leave("mid", "test")


async def test_best_effort_fifo_lets_a_gpu_start_that_fits_pass_one_waiting_for_room():
    p = pool(memory_gib=4, gpus=1)
    join(p, "a", role("cpu", 2))
    big = join(p, "big", role("big", 3, gpus=1))
    small = join(p, "small", role("small", 1, gpus=1))
    assert not big.grant.done() and small.grant.result() == ("GPU-0",)
    p.release("a", "stopped")  # room for big now; the GPU it waits for is small's
    assert not big.grant.done() and not big.waits_for_room
    p.leave("big", "test")


def spawn_page(p: GpuPool, owner: str, r: Role) -> str:
    """What the spawn page of ``owner``'s waiting start says (docker/gpus.py)."""
    runtime = SimpleNamespace(pool=p, evictor=SimpleNamespace(waiting_on=lambda owner: []))
    start = GpuStart(runtime, owner, owner, logging.getLogger("test"),  # type: ignore[arg-type]
                     lambda text, percent: None)
    return start._standing(p.queue.ticket(owner), r)[1]


ORDER = "by priority, then a user's first server before anyone's second, then arrival"


async def test_the_spawn_page_says_the_strategy_and_whom_a_start_waits_behind():
    p = pool(memory_gib=8, gpus=1, strategy=STRICT_FIFO)
    join(p, "a", role("half", 4))
    big, tiny, gpu = role("big", 6), role("tiny", 1), role("gpu", 1, gpus=1)
    join(p, "big", big)
    join(p, "tiny", tiny)
    assert spawn_page(p, "big", big) == (
        "Waiting for room on the host for the role 'big': the host's memory is fully "
        "reserved: 10 GiB of 8 GiB. Number 1 of 2 in the queue (StrictFIFO, fair between "
        f"users: {ORDER}); you start when a server stops.")
    assert spawn_page(p, "tiny", tiny) == (
        "Waiting for room on the host for the role 'tiny': this start would fit, but the "
        "queue is StrictFIFO and an older start waits ahead of it for room: big's (role "
        "'big'), for which the host's memory is fully reserved: 10 GiB of 8 GiB. Number 2 "
        f"of 2 in the queue (StrictFIFO, fair between users: {ORDER}); you start when that "
        "start is served or leaves the queue.")
    p.queue.strategy = BEST_EFFORT_FIFO
    p.dispatch()  # tiny starts; a GPU start then waits for the GPU, not for room
    join(p, "holder", role("gpu", 0, gpus=1))
    join(p, "gpu", gpu)
    assert spawn_page(p, "gpu", gpu) == (
        "Waiting for 1 exclusive GPU for the role 'gpu': number 2 of 2 in the queue "
        f"(BestEffortFIFO, fair between users: {ORDER}).")
    for owner in ("big", "gpu"):
        p.leave(owner, "test")


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


# --- preempting for host room (gpu/preemption.py choose_host_victims) ---------------------


class Recorder:
    """Stands in for the evictor: records what the queue asks it to do."""

    def __init__(self):
        self.started: list[tuple[str, tuple[str, ...]]] = []
        self.called_off: list[tuple[str, tuple[str, ...], str]] = []

    def start(self, ticket):
        self.started.append((ticket.owner, ticket.plan.victims))

    def call_off(self, ticket, victims, why):
        self.called_off.append((ticket.owner, victims, why))


def preempting_pool(memory_gib: int = 8) -> tuple[GpuPool, Recorder]:
    p = pool(memory_gib=memory_gib)
    p.evictions = recorder = Recorder()
    return p, recorder


def table(p: GpuPool, *roles: Role) -> None:
    p.roles = {r.name: r for r in roles}


def running_since(p: GpuPool, owner: str, r: Role, started: float) -> None:
    """A server of ``r`` granted room, started at ``started`` (epoch)."""
    ticket = join(p, owner, r)
    assert ticket.grant.done()
    p.servers[owner] = Server(owner, r.name, started)
    p.leave(owner, "served")


async def test_a_preempting_start_frees_memory_from_the_least_important_servers():
    p, evictor = preempting_pool(memory_gib=8)
    low = Role("low", 1, 2 * GiB, ("p",), priority=0, min_runtime=0)
    mid = Role("mid", 1, 2 * GiB, ("p",), priority=5, min_runtime=0)
    boss = Role("boss", 1, 4 * GiB, ("p",), priority=10)
    table(p, low, mid, boss)
    now = time.time()
    running_since(p, "old-low", low, now - 300)
    running_since(p, "new-low", low, now - 60)
    running_since(p, "mid", mid, now - 60)
    running_since(p, "mid2", mid, now - 60)
    ticket = join(p, "boss", boss)  # 8 + 4 of 8 GiB: 4 GiB must go
    assert not ticket.grant.done()
    # both low servers go (the lowest priority), not the mid ones; the older is no
    # more important than the younger, but both are needed
    assert evictor.started == [("boss", ("new-low", "old-low"))]
    assert p.queue.evicting == {"new-low": "boss", "old-low": "boss"}
    p.release("new-low", "preempted")
    assert not ticket.grant.done()  # 2 GiB more to go
    p.release("old-low", "preempted")
    assert ticket.grant.result() == ()
    assert p.host.holding("boss") == Reservation(1, 4 * GiB)


async def test_only_the_servers_needed_are_preempted_and_the_younger_goes_first():
    p, evictor = preempting_pool(memory_gib=8)
    low = Role("low", 1, 2 * GiB, ("p",), priority=0, min_runtime=0)
    boss = Role("boss", 1, 2 * GiB, ("p",), priority=10)
    table(p, low, boss)
    now = time.time()
    for i, age in enumerate((900, 60, 300, 30)):
        running_since(p, f"low-{i}", low, now - age)
    join(p, "boss", boss)
    assert evictor.started == [("boss", ("low-3",))]  # the youngest: the least work lost


async def test_protected_young_and_equal_servers_are_never_victims():
    p, evictor = preempting_pool(memory_gib=4)
    young = Role("young", 1, 2 * GiB, ("p",), priority=0, min_runtime=3600)
    kept = Role("kept", 1, 2 * GiB, ("p",), priority=0, preemptible=False)
    boss = Role("boss", 1, 2 * GiB, ("p",), priority=10)
    table(p, young, kept, boss)
    now = time.time()
    running_since(p, "young", young, now - 60)
    running_since(p, "kept", kept, now - 60)
    ticket = join(p, "boss", boss)
    assert evictor.started == [] and not ticket.grant.done()
    assert ticket.short.resource == "memory"
    peer = join(p, "peer", Role("peer", 1, 2 * GiB, ("p",), priority=10))
    assert evictor.started == [] and not peer.grant.done()


async def test_room_that_comes_free_another_way_calls_the_victims_off():
    p, evictor = preempting_pool(memory_gib=4)
    low = Role("low", 1, 2 * GiB, ("p",), priority=0, min_runtime=0)
    boss = Role("boss", 1, 2 * GiB, ("p",), priority=10)
    table(p, low, boss)
    now = time.time()
    running_since(p, "a", low, now - 60)
    running_since(p, "b", low, now - 30)
    ticket = join(p, "boss", boss)
    assert evictor.started == [("boss", ("b",))]
    p.release("a", "its user stopped it")  # room came free without the victim
    assert ticket.grant.result() == ()
    assert evictor.called_off == [
        ("boss", ("b",), "boss got room on the host without needing this server's")]
    assert p.queue.evicting == {}


async def test_best_effort_fifo_keeps_the_room_a_preemption_frees_for_the_older_start():
    p, evictor = preempting_pool(memory_gib=10)
    low = Role("low", 1, 2 * GiB, ("p",), priority=0, min_runtime=0)
    boss = Role("boss", 1, 5 * GiB, ("p",), priority=10)
    tiny = Role("tiny", 1, 1 * GiB, ("p",), priority=0)
    table(p, low, boss, tiny)
    now = time.time()
    for i, age in enumerate((300, 200, 100)):
        running_since(p, f"low-{i}", low, now - age)
    waiting = join(p, "boss", boss)  # 6 + 5 of 10 GiB: one low server must go
    assert evictor.started == [("boss", ("low-2",))]
    # 7 of 10 now, and 6 - 2 + 5 + 1 = 10 once the victim stops: it starts at once
    first = join(p, "tiny-1", tiny)
    assert first.grant.result() == ()
    # 8 of 10 now, but 11 once the victim stops: that room is boss's
    second = join(p, "tiny-2", tiny)
    assert not second.grant.done() and second.short is None
    assert second.room_sentence() == (
        "the room that is free is kept for an older start, boss's (role 'boss'), while "
        "servers are preempted for it")
    assert evictor.started == [("boss", ("low-2",))]  # boss alone preempts
    p.release("low-2", "preempted")
    assert waiting.grant.result() == () and not second.grant.done()
    assert second.room_sentence() == "the host's memory is fully reserved: 11 GiB of 10 GiB"
    p.leave("tiny-2", "test")


async def test_a_users_first_server_gets_the_room_before_another_users_second():
    p = pool(memory_gib=4)
    small = role("small", 2)
    join(p, "alice-1", small, user="alice")
    join(p, "x", small)
    second = join(p, "alice-2", small, user="alice")  # her second server, asked first
    first = join(p, "bob-1", small, user="bob")
    assert p.queue.position("bob-1") == (1, 2) and p.queue.position("alice-2") == (2, 2)
    p.release("x", "stopped")
    assert first.grant.done() and not second.grant.done()
    p.leave("alice-2", "test")


async def test_only_the_first_waiting_start_preempts_for_room():
    p, evictor = preempting_pool(memory_gib=4)
    low = Role("low", 1, 2 * GiB, ("p",), priority=0, min_runtime=0)
    boss = Role("boss", 1, 4 * GiB, ("p",), priority=10)
    second = Role("second", 1, 2 * GiB, ("p",), priority=5)
    table(p, low, boss, second)
    now = time.time()
    running_since(p, "a", low, now - 60)
    running_since(p, "b", low, now - 30)
    join(p, "boss", boss)
    behind = join(p, "second", second)
    # the room boss's victims free is boss's: the start behind preempts nobody more
    assert evictor.started == [("boss", ("a", "b"))]
    assert not behind.grant.done()
