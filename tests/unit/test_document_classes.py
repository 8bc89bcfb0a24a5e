"""Each shared document is one class (spawner/usage/documents.py lists them): its JSON
made by its writer reads back as the same document, what older writers stored (a hub
upgraded in place keeps 0.1's rows in its database and files in its state folder) reads
as it always did, and an odd document reads as unknown, never as an error; and, read
from the source, each document's version and each kind's name is defined once.
tests/unit/test_state_docs.py has how the documents are kept."""

from __future__ import annotations

import ast
import json
import logging
import re
from pathlib import Path

import pytest

from spawner.gpu.allocator import GpuRequest
from spawner.gpu.inventory import declared_inventory
from spawner.gpu.nvml import LOST, HostProcess, NvmlDevice, XidEvent
from spawner.gpu.pool import GpuPool, Server
from spawner.gpu.snapshot import PoolSnapshot, hub_room, pool_snapshot
from spawner.homes.base import HomeUse, Space
from spawner.host.admission import HostBook, HostCapacity
from spawner.quota.model import GpuCapacity, Role
from spawner.usage.documents import (
    BUDGET_MEMORY,
    GPU_USAGE,
    GPUS,
    KINDS,
    PREEMPTIONS,
    BudgetMemory,
    DatabaseDocuments,
    DiskUsage,
    Filesystem,
    FolderDocuments,
    HomeReading,
    Preemptions,
    SharedDocument,
    Told,
)
from spawner.usage.event_log import EventLog
from spawner.usage.gpu_readings import GpuSample, GpuUsage, read_usage
from spawner.watchdog.app import gpu_usage_snapshot, reading_of
from spawner.watchdog.homes import disk_document
from spawner.watchdog.model import DiskReading, ServerSample, Snapshot
from spawner.watchdog.model import Server as WatchedServer
from spawner.watchdog.rules import GPU_IDLE, Incident, IncidentBook
from spawner.webapp.gpus import map_document

G = 2**30
T = 1_700_000_000.0
PACKAGE = Path(__file__).resolve().parents[2] / "spawner"
CLASSES = (PoolSnapshot, GpuUsage, Preemptions, BudgetMemory, DiskUsage)
ODD_TEXTS = (None, "", '{"version": 1, "gpus": [', "[1, 2]", '"text"', "null",
             '{"version": 99, "time": 1, "gpus": [], "told": []}')


async def busy_pool() -> GpuPool:
    """GPU-0 exclusive (alice), GPU-1 shared (bob), a host of 16 CPUs; dave waits."""
    pool = GpuPool(declared_inventory([{"uuid": f"GPU-{i}", "name": "H200", "memory": "80G"}
                                       for i in range(2)]), "hub-1",
                   logging.getLogger("test.document_classes"))
    pool.set_host(HostBook(HostCapacity(cpus=16, memory=64 * G, reserve_cpus=1,
                                        reserve_memory=4 * G)))
    pool.servers["quota-alice"] = Server("alice", "solo", T - 100)
    pool.acquire("quota-alice", GpuRequest(1))
    pool.servers["quota-bob"] = Server("bob", "lab", T - 50)
    pool.acquire("quota-bob", GpuRequest(1, "shared", 3, 8 * G))
    pool.join("quota-dave", Server("dave", "train", T), Role("train", 1, G, ("x",), gpus=2))
    return pool


ALICE = WatchedServer(container_id="c1", name="quota-alice", user="alice", role="solo",
                      image="py", hub_id="hub-1", gpus=("GPU-0",), gpu_mode="exclusive",
                      memory_limit=4 * G, cpus=1.0, cpus_reserved=1.0)


def watched() -> Snapshot:
    """A cycle as the watchdog reads it: GPU-0 from NVML's record, with a process and an
    XID error; GPU-1 lost."""
    device = NvmlDevice("GPU-0", 0, name="H200", memory_used=G, memory_total=80 * G,
                        utilization=0.0, processes=[HostProcess(4242, G)])
    lost = NvmlDevice("GPU-1", 1, state=LOST, error="GPU is lost", name="H200")
    xids = [XidEvent("GPU-0", 79), XidEvent("GPU-9", 48)]
    return Snapshot(time=T, host="gpu-host-1", engine_cpus=16.0, engine_memory=64 * G,
                    gpus={d.uuid: reading_of(d, xids) for d in (device, lost)},
                    servers={"c1": ServerSample(ALICE, gpu_memory={"GPU-0": G},
                                                memory_working_set=G, cpu_used=0.5)})


def homes_read() -> DiskUsage:
    """A cycle's homes as the watchdog reads them: alice's server runs on hers, with the
    size of its label; bob's home is there without a server."""
    server = WatchedServer(container_id="c1", name="quota-alice", user="alice", role="solo",
                           image="py", hub_id="hub-1", disk=20 * G)
    disk = DiskReading("btrfs", True, "Homes are btrfs subvolumes under /srv/homes, each "
                       "limited by a qgroup",
                       {"alice": HomeUse("alice", 3 * G, 20 * G), "bob": HomeUse("bob", G, None)},
                       Space(Path("/srv/homes"), 100 * G, 30 * G, 70 * G))
    snapshot = Snapshot(time=T, host="gpu-host-1", disk=disk,
                        servers={"c1": ServerSample(server, home="alice")})
    return disk_document(snapshot, 5.0, "node-a")


def idle_book() -> IncidentBook:
    book = IncidentBook()
    key = f"{GPU_IDLE}:quota-alice:GPU-0"
    book.open[key] = Incident(key=key, rule=GPU_IDLE, severity="info", server=ALICE,
                              since=T - 7200, gpu_uuid="GPU-0", opened=T - 3600)
    return book


def preemption() -> dict:
    """A preemption as the evictor keeps it: the event as the event log recorded it."""
    return EventLog("").append(
        "preemption", hub="hub-1", by="carl", by_role="urgent", by_priority=10,
        user="bob", role="gpu", priority=0, container="quota-bob",
        for_container="quota-carl", gpus=["GPU-1"], for_gpus=["GPU-1"], grace_period=30,
        deadline=T + 30, ran_for=60.0, reason="carl needs 1 GPU", server_url="/user/bob/")


# --- round trips -------------------------------------------------------------------------


async def test_the_pools_snapshot_reads_back_as_the_hub_wrote_it():
    pool = await busy_pool()
    written = pool_snapshot(pool, T, monotonic_now=pool.queue.ticket("quota-dave").arrived)
    read = PoolSnapshot.from_text(json.dumps(written))
    assert read is not None and read.to_json() == written
    assert PoolSnapshot.from_json(read.to_json()) == read
    assert read.host_state == "on" and read.host.share.cpus == 60
    assert [h.user for g in read.gpus for h in g.holders] == ["alice", "bob"]
    assert [(t.user, t.gpus, t.cpus) for t in read.queue] == [("dave", 2, 1)]
    pool.set_host(None)  # host admission off: said as such, and read back so
    off = PoolSnapshot.from_json(json.loads(json.dumps(pool_snapshot(pool, T))))
    assert off.host_state == "off" and off.host is None and off.to_json()["host"] is None
    pool.leave("quota-dave", "test")


def test_a_watchdogs_reading_is_one_shape_from_nvml_to_the_page():
    """The GpuSample the watchdog made of NVML's record is what its document carries,
    what the merge and the map read back (less the host PIDs and XIDs, its own)."""
    snapshot = watched()
    sample = snapshot.gpus["GPU-0"]
    assert (sample.processes, sample.xids) == ([HostProcess(4242, G)], [79])
    written = gpu_usage_snapshot(snapshot, idle_book(), 5.0, node="node-a")
    usage = GpuUsage.from_text(json.dumps(written))
    assert usage is not None and usage.to_json() == written
    assert GpuUsage.from_json(usage.to_json()) == usage
    assert usage.gpus["GPU-0"] == GpuSample("GPU-0", 0, "H200", G, 80 * G, 0.0)
    assert usage.gpus["GPU-1"].lost == "GPU is lost" and usage.gpus["GPU-1"].held
    assert usage.node == "node-a" and usage.host == "gpu-host-1"
    assert usage.state(T + 14.9) == "fresh" and usage.state(T + 15) == "stale"
    row = map_document(None, usage, T + 1)["gpus"][0]
    assert (row["uuid"], row["utilization"], row["memory_used"]) == ("GPU-0", 0.0, G)


def test_a_watchdogs_homes_read_back_as_it_wrote_them():
    written = homes_read()
    read = DiskUsage.from_text(written.to_text())
    assert read == written and DiskUsage.from_json(read.to_json()) == read
    assert read.homes == (HomeReading("alice", 3 * G, 20 * G, "alice"),
                          HomeReading("bob", G, None, None))
    assert read.filesystem == Filesystem("/srv/homes", 100 * G, 30 * G, 70 * G, 20 * G)
    assert (read.node, read.at, read.mechanism, read.enforced) == ("node-a", T, "btrfs", True)
    assert read.state(T + 14.9) == "fresh" and read.state(T + 15) == "stale"
    # a later watchdog only adds fields: this one reads what it knows of them
    added = {**written.to_json(), "inodes": 7,
             "homes": [{**h.to_json(), "files": 3} for h in written.homes]}
    assert DiskUsage.from_json(added) == written


def test_the_preemptions_and_the_budget_memory_read_back():
    record = preemption()
    pending = Preemptions((record,))
    assert json.loads(pending.to_text()) == [record]
    assert Preemptions.from_text(pending.to_text()) == pending
    assert Preemptions.from_json([]) == Preemptions()
    told = Told("budget-warning", "group:cs101", 10.0, T, "alice", T + 86400)
    memory = BudgetMemory((told,))
    assert memory.to_json() == {"version": 1, "told": [{
        "event": "budget-warning", "budget": "group:cs101", "gpu_hours": 10.0, "period": T,
        "user": "alice", "resets_at": T + 86400}]}
    assert BudgetMemory.from_text(memory.to_text()) == memory


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
async def test_each_document_is_written_and_read_where_its_kind_is_kept(cls, ledger, tmp_path):
    pool = await busy_pool()
    pool.leave("quota-dave", "test")
    found = {PoolSnapshot: PoolSnapshot.from_json(pool_snapshot(pool, T)),
             GpuUsage: GpuUsage.from_json(gpu_usage_snapshot(watched(), idle_book(), 5.0)),
             Preemptions: Preemptions((preemption(),)),
             BudgetMemory: BudgetMemory((Told("budget-spent", "user:a", 1, T, "a", T + 1),)),
             DiskUsage: homes_read(),
             }[cls]
    for documents in (DatabaseDocuments(ledger.engine, "hub-1"), FolderDocuments(str(tmp_path))):
        found.write(documents)
        assert cls.read(documents) == found and cls.read_all(documents) == [found]


# --- what older writers stored -----------------------------------------------------------

# As a hub and a watchdog of 0.1 wrote them before the host figures, the queue's strategy
# and the nodes' names (their sort_keys text; the budget memory indented, the preemptions
# a list in the evictor's order).
OLD_POOL = (
    '{"gpus": [{"free_slots": 0, "holders": [{"evicting_for": null, "memory_cap": null, '
    '"mode": "exclusive", "owner": "quota-alice", "role": "solo", "since": 1699999900.0, '
    '"user": "alice"}], "index": "0", "memory": 85899345920, "name": "H200", '
    '"parent": null, "reserved_for": null, "state": "exclusive", "uuid": "GPU-0"}], '
    '"hub": "hub-1", "inventory": {"reason": "", "source": "declared"}, "queue": '
    '[{"gpus": 2, "mode": "exclusive", "owner": "quota-dave", "position": 1, '
    '"preempting": false, "priority": 10, "reserved": [], "role": "train", '
    '"since": 1700000006.0, "user": "dave", "victims": []}], "time": 1700000000.0, '
    '"usage": {"exclusive": 1, "free": 0, "shared": 0, "total": 1}, "version": 1}')
OLD_USAGE = (
    '{"gpus": {"GPU-0": {"index": 0, "lost": null, "memory_total": 85899345920, '
    '"memory_used": 1073741824, "name": "H200", "utilization": 0.0}}, '
    '"host": "gpu-host-1", "idle": [{"opened": 1699996400.0, "server": "quota-alice", '
    '"since": 1699992800.0, "user": "alice", "uuid": "GPU-0"}], "interval": 5.0, '
    '"servers": {"quota-alice": {"gpu_memory": {"GPU-0": 1073741824}, "gpus": ["GPU-0"], '
    '"role": "solo", "user": "alice"}}, "time": 1700000000.0, "version": 1}')
OLD_PREEMPTIONS = (
    '[{"version": 1, "time": 1700000000.0, "event": "preemption", "hub": "hub-1", '
    '"by": "carl", "by_role": "urgent", "by_priority": 10, "user": "bob", "role": "gpu", '
    '"priority": 0, "container": "quota-bob", "for_container": "quota-carl", '
    '"gpus": ["GPU-1"], "for_gpus": ["GPU-1"], "grace_period": 30, '
    '"deadline": 1700000030.0, "ran_for": 60.0, "reason": "carl needs 1 GPU", '
    '"server_url": "/user/bob/"}]')
OLD_BUDGETS = """{
 "version": 1,
 "told": [
  {
   "event": "budget-warning",
   "budget": "group:cs101",
   "gpu_hours": 10,
   "period": 1699920000.0,
   "user": "alice",
   "resets_at": 1700006400.0
  }
 ]
}"""


def test_an_upgraded_hub_reads_the_documents_of_01_as_before(ledger, tmp_path):
    """0.1's row in the database, or its file in the state folder where there is no
    row: the same documents either way."""
    folder = FolderDocuments(str(tmp_path))
    folder.write(GPU_USAGE, OLD_USAGE)
    folder.write(BUDGET_MEMORY, OLD_BUDGETS)
    rows = DatabaseDocuments(ledger.engine, "hub-1")
    rows.write(GPUS, OLD_POOL)
    rows.write(PREEMPTIONS, OLD_PREEMPTIONS)
    upgraded = DatabaseDocuments(ledger.engine, "hub-1", fallback=folder)
    pool = PoolSnapshot.read(upgraded)
    usage = read_usage(upgraded, T + 1)
    assert pool is not None and pool.host_state == "missing" and pool.queue_strategy is None
    assert usage is not None and usage.node == "gpu-host-1" and usage.host_totals is None
    doc = map_document(pool, usage, T + 1)
    assert doc["pool"] == {"state": "ok", "time": T, "hub": "hub-1",
                           "inventory": {"source": "declared", "reason": ""}}
    (gpu,) = doc["gpus"]
    assert (gpu["uuid"], gpu["index"], gpu["state"], gpu["utilization"], gpu["idle"],
            gpu["idle_since"]) == ("GPU-0", "0", "exclusive", 0.0, True, T - 7200)
    assert [(h["user"], h["gpu_memory"], h["idle"]) for h in gpu["holders"]] == [
        ("alice", G, True)]
    (dave,) = doc["queue"]
    assert (dave["user"], dave["gpus"], dave["cpus"], dave["waiting_for"]) == (
        "dave", 2, None, None)
    assert (doc["queue_strategy"], doc["queue_fair"]) == (None, False)
    assert doc["host"]["state"] == "missing" and doc["host"]["usage"] == "missing"
    assert [(n["node"], n["state"]) for n in doc["watchdog"]["nodes"]] == [
        ("gpu-host-1", "fresh")]
    assert hub_room(pool).gpus == GpuCapacity(1, 80 * G) and hub_room(pool).host is None
    (record,) = Preemptions.read(upgraded).records
    assert record["container"] == "quota-bob" and record["by"] == "carl"
    assert BudgetMemory.read(upgraded).told == (
        Told("budget-warning", "group:cs101", 10.0, 1699920000.0, "alice", 1700006400.0),)


# --- odd documents -------------------------------------------------------------------------


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
@pytest.mark.parametrize("text", ODD_TEXTS)
def test_an_odd_document_reads_as_unknown(cls, text):
    # a list of things that are no preemptions: none to call off
    unknown = Preemptions() if (cls, text) == (Preemptions, "[1, 2]") else None
    assert cls.from_text(text) == unknown


def test_odd_parts_read_as_unknown_and_never_fail():
    usage = GpuUsage.from_json({"version": 1, "time": T, "interval": "soon", "host": 7,
                                "gpus": {"GPU-0": {"index": "0", "utilization": "busy",
                                                   "name": ["x"]}, "GPU-1": "lost"},
                                "servers": {"a": {"user": 5, "gpu_memory": {"G": "1"}}},
                                "idle": [{"server": "a"}, "x"], "host_totals": "none"})
    assert usage.interval == 5.0 and usage.host is None and usage.node == ""
    assert usage.gpus == {"GPU-0": GpuSample("GPU-0", -1, None)}
    assert usage.servers["a"].user is None and usage.servers["a"].gpu_memory == {}
    assert usage.idle == [] and usage.host_totals.engine_cpus is None
    pool = PoolSnapshot.from_json({"version": 1, "time": "now", "gpus": [
        {"uuid": "GPU-0", "memory": "80G", "holders": ["x", {"owner": 3}]}, "GPU-1"],
        "queue": [{"position": "first", "victims": [1, "quota-a"]}], "host": "on"})
    (gpu,) = pool.gpus
    assert gpu.memory is None and [h.owner for h in gpu.holders] == [None]
    assert pool.queue[0].position is None and pool.queue[0].victims == ("quota-a",)
    assert pool.time is None and pool.host_state == "missing" and hub_room(pool) is None
    assert PoolSnapshot.from_json({"version": 1, "gpus": "three"}).gpus is None
    assert Preemptions.from_json([{"container": ""}, "x", {"container": "quota-a"}]) == \
        Preemptions(({"container": "quota-a"},))
    homes = DiskUsage.from_json({
        "version": 1, "at": T, "node": 3, "interval": -5, "mechanism": ["btrfs"],
        "enforced": "yes", "sentence": None, "filesystem": {"path": 1, "size": "100G",
                                                              "free": -1, "used": 1.5},
        "homes": [{"name": "a", "used": "1G", "limit": True, "user": 7}, {"name": ""},
                  {"used": 1}, "b", {"name": "c", "used": 5, "limit": None}]})
    assert (homes.node, homes.interval, homes.mechanism, homes.enforced, homes.sentence) == (
        "", 5.0, None, False, "")
    assert homes.filesystem == Filesystem()
    assert homes.homes == (HomeReading("a", None, None, None), HomeReading("c", 5, None))
    assert DiskUsage.from_json({"version": 1, "at": T, "homes": "all",
                                "filesystem": "x"}) == DiskUsage("", T)
    assert DiskUsage.from_json({"version": 1, "node": "n", "homes": []}) is None  # no time
    told = {"event": "budget-warning", "budget": "b", "gpu_hours": 1, "period": T,
            "user": "u", "resets_at": T}
    assert BudgetMemory.from_json({"version": 1, "told": [told]}) is not None
    # one entry that cannot be read: the whole memory is unknown, told again
    assert BudgetMemory.from_json({"version": 1, "told": [told, {**told, "user": 1}]}) is None


# --- defined once ---------------------------------------------------------------------------


def sources() -> dict[str, str]:
    return {str(p.relative_to(PACKAGE)): p.read_text() for p in PACKAGE.rglob("*.py")}


def test_each_kinds_name_and_file_is_defined_once():
    assert sorted(c.KIND.name for c in CLASSES) == sorted(k.name for k in KINDS)
    defined = [(path, node.args[0].value) for path, text in sources().items()
               for node in ast.walk(ast.parse(text)) if isinstance(node, ast.Call)
               and getattr(node.func, "id", None) == "Kind"]
    assert sorted(defined) == sorted(("usage/documents.py", k.name) for k in KINDS)
    files = {k.file for k in KINDS}
    named = [(path, node.value) for path, text in sources().items()
             for node in ast.walk(ast.parse(text))
             if isinstance(node, ast.Constant) and node.value in files]
    assert sorted(named) == sorted(("usage/documents.py", f) for f in files)


def test_each_documents_version_is_defined_once_in_its_class():
    """In every module that writes or reads a shared document, the one version constant
    is its class's VERSION, and only a class's from_json looks at a document's
    version."""
    assert all(issubclass(c, SharedDocument) and isinstance(c.__dict__.get("VERSION"), int)
               for c in CLASSES)
    names = {c.__name__ for c in CLASSES} | {k for k in ("GPUS", "GPU_USAGE", "PREEMPTIONS",
                                                          "BUDGET_MEMORY", "HOMES")}
    word = re.compile(r"\b(" + "|".join(names) + r")\b")
    found = []
    for path, text in sources().items():
        if not word.search(text):
            continue
        tree = ast.parse(text)
        for scope in [tree, *(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef))]:
            for node in scope.body:
                targets = node.targets if isinstance(node, ast.Assign) else []
                for target in targets:
                    if isinstance(target, ast.Name) and target.id.endswith("VERSION"):
                        where = scope.name if isinstance(scope, ast.ClassDef) else ""
                        found.append((path, f"{where}.{target.id}".lstrip(".")))
        for function in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
            for call in (n for n in ast.walk(function) if isinstance(n, ast.Call)):
                if getattr(call.func, "attr", None) == "get" and call.args \
                        and getattr(call.args[0], "value", None) == "version" \
                        and function.name != "from_json":
                    found.append((path, f"{function.name} reads a version"))
    assert sorted(found) == sorted(
        (path, f"{c.__name__}.VERSION") for c in CLASSES
        for path in [str(Path(c.__module__.replace(".", "/") + ".py").relative_to("spawner"))])
