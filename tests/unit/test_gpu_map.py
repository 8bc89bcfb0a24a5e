"""The data behind the admins' host map: the pool's snapshot, the watchdogs' readings
(as files of a state folder here; tests/unit/test_state_docs.py has the database's rows),
and their merge."""

from __future__ import annotations

import asyncio
import json
import os

from map_states import HUB, G, T, busy_pool, idle_book, make_pool, watched

from spawner.docker.reconcile import Reconciler
from spawner.gpu.allocator import GpuRequest
from spawner.gpu.pool import Server
from spawner.gpu.snapshot import pool_snapshot
from spawner.quota.model import Role
from spawner.usage.documents import (
    GPU_USAGE,
    GPUS,
    DatabaseDocuments,
    json_object,
)
from spawner.usage.gpu_readings import usage_state
from spawner.usage.ledger import Ledger
from spawner.watchdog.app import QuotaWatchdog, gpu_usage_snapshot
from spawner.webapp.gpus import gpu_map

GPUS_FILE = GPUS.file


def read_json_file(path: str) -> dict | None:
    try:
        with open(path, encoding="utf-8") as f:
            return json_object(f.read())
    except OSError:
        return None


async def test_pool_snapshot_lists_gpus_holders_and_queue():
    pool = await busy_pool()
    snap = pool_snapshot(pool, T + 10, monotonic_now=pool.queue.ticket("quota-dave").arrived + 4)
    json.dumps(snap)  # serialisable as it is
    assert snap["version"] == 1 and snap["hub"] == HUB and snap["time"] == T + 10
    assert snap["usage"] == {"total": 3, "exclusive": 1, "shared": 1, "free": 1}
    g0, g1, g2 = snap["gpus"]
    assert (g0["uuid"], g0["index"], g0["name"], g0["memory"]) == ("GPU-0", "0", "H200", 80 * G)
    assert g0["state"] == "exclusive" and g0["free_slots"] == 0
    assert g0["holders"] == [{"owner": "quota-alice", "user": "alice", "role": "solo",
                              "mode": "exclusive", "memory_cap": None, "since": T - 100,
                              "evicting_for": None}]
    assert g1["state"] == "shared" and g1["free_slots"] == 1
    assert [(h["user"], h["mode"], h["memory_cap"]) for h in g1["holders"]] == [
        ("bob", "shared:3", 8 * G), ("carol", "shared:3", 8 * G)]
    assert g2["state"] == "free" and g2["free_slots"] is None and g2["holders"] == []
    assert snap["queue"] == [{
        "position": 1, "owner": "quota-dave", "user": "dave", "role": "train",
        "priority": 10, "since": T + 6, "gpus": 2, "mode": "exclusive",
        "preempting": False, "victims": [], "reserved": [], "user_servers": 0,
        "cpus": None, "memory": None, "waiting_for": None,  # no host admission here
        "behind": None}]
    assert (snap["queue_strategy"], snap["queue_fair"]) == ("BestEffortFIFO", True)
    assert snap["host"] is None
    pool.leave("quota-dave", "test")
    assert pool_snapshot(pool, T)["queue"] == []


async def test_a_preemption_under_way_shows_in_the_queue_and_on_the_victim():
    pool = await busy_pool()
    ticket = pool.queue.ticket("quota-dave")
    pool.allocator.reserve("quota-dave", ["GPU-0"])
    pool.queue.evicting["quota-alice"] = "quota-dave"
    ticket.plan = type("Plan", (), {"victims": ("quota-alice",), "uuids": ("GPU-0",)})()
    snap = pool_snapshot(pool, T)
    assert snap["gpus"][0]["reserved_for"] == "quota-dave"
    assert snap["gpus"][0]["holders"][0]["evicting_for"] == "quota-dave"
    (waiting,) = snap["queue"]
    assert waiting["preempting"] and waiting["victims"] == ["quota-alice"]
    assert waiting["reserved"] == ["GPU-0"]
    ticket.plan = None
    pool.leave("quota-dave", "test")


async def test_the_file_is_written_on_change_and_coalesced(tmp_path):
    path = tmp_path / GPUS_FILE
    pool = make_pool(tmp_path)
    pool.snapshots.interval = 0.2
    pool.acquire("quota-alice", GpuRequest(1))
    await asyncio.sleep(0.05)  # the first change is written at once
    pool.events.flush()
    assert [h["owner"] for h in read_json_file(str(path))["gpus"][0]["holders"]] == \
        ["quota-alice"]
    assert pool.snapshots.written == 1
    for i in range(5):  # a burst: one more write, after the interval
        pool.acquire(f"quota-{i}", GpuRequest(1, "shared", 8))
    pool.release("quota-0", "test")
    await asyncio.sleep(0.05)
    assert pool.snapshots.written == 1
    await asyncio.sleep(0.3)
    pool.events.flush()
    assert pool.snapshots.written == 2
    snap = read_json_file(str(path))
    assert [h["owner"] for h in snap["gpus"][1]["holders"]] == [f"quota-{i}" for i in (1, 2, 3, 4)]
    pool.dispatch()  # nothing changed: nothing written
    await asyncio.sleep(0.3)
    assert pool.snapshots.written == 2
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".")]


async def test_queue_join_leave_and_sync_adoption_are_written(tmp_path):
    pool = make_pool(tmp_path, n=1)
    pool.snapshots.interval = 0.0
    pool.acquire("quota-alice", GpuRequest(1))
    pool.join("quota-dave", Server("dave", "train", T), Role("train", 1, G, ("x",), gpus=1))
    await asyncio.sleep(0.05)
    pool.events.flush()
    assert [t["user"] for t in read_json_file(str(tmp_path / GPUS_FILE))["queue"]] == ["dave"]
    pool.leave("quota-dave", "cancelled")
    pool.release("quota-alice", "stopped")
    await asyncio.sleep(0.05)
    pool.events.flush()
    snap = read_json_file(str(tmp_path / GPUS_FILE))
    assert snap["queue"] == [] and snap["gpus"][0]["holders"] == []
    sync = Reconciler(pool, None, pool.log)  # the pool's sync, given the engine's list
    sync._reconcile([{"Names": ["/quota-eve"], "State": "running",
                      "Labels": {"quota-spawner.gpus": "GPU-0", "quota-spawner.user": "eve",
                                 "quota-spawner.role": "solo"}}], 0.0)
    await asyncio.sleep(0.05)
    pool.events.flush()
    (holder,) = read_json_file(str(tmp_path / GPUS_FILE))["gpus"][0]["holders"]
    assert (holder["owner"], holder["user"], holder["role"]) == ("quota-eve", "eve", "solo")


def test_no_path_no_file(tmp_path):
    pool = make_pool()
    pool.acquire("quota-alice", GpuRequest(1))
    assert pool.snapshots.written == 0 and os.listdir(tmp_path) == []


# --- the watchdog's side -------------------------------------------------------------------


def test_the_watchdog_usage_snapshot():
    data = gpu_usage_snapshot(watched(), idle_book(), 5.0)
    assert json.loads(json.dumps(data)) == data
    assert data["version"] == 1 and data["time"] == T and data["interval"] == 5.0
    assert data["gpus"]["GPU-1"] == {"index": 1, "name": "H200", "utilization": 0.75,
                                     "memory_used": 30 * G, "memory_total": 80 * G,
                                     "lost": None}
    assert data["gpus"]["GPU-2"]["lost"] == "GPU is lost"
    assert data["servers"]["quota-bob"] == {"user": "bob", "role": "lab", "gpus": ["GPU-1"],
                                            "gpu_memory": {"GPU-1": 6 * G}, "cpus": None,
                                            "memory": None, "cpu_used": None,
                                            "memory_used": None}
    assert data["idle"] == [{"uuid": "GPU-0", "server": "quota-alice", "user": "alice",
                             "since": T - 7200, "opened": T - 3600}]


def test_the_watchdog_writes_its_file_only_in_a_state_folder(tmp_path, monkeypatch):
    monkeypatch.delenv("QUOTA_SPAWNER_STATE_DIR", raising=False)
    monkeypatch.setenv("QUOTA_SPAWNER_USAGE_DB", "none")
    assert QuotaWatchdog().gpu_usage_file == ""
    monkeypatch.setenv("QUOTA_SPAWNER_STATE_DIR", str(tmp_path))
    watchdog = QuotaWatchdog()
    assert watchdog.gpu_usage_file == str(tmp_path / "quota-spawner-gpu-usage.json")
    watchdog.book = idle_book()
    watchdog.write_gpu_usage(watched())
    assert read_json_file(watchdog.gpu_usage_file)["servers"]["quota-alice"]["user"] == "alice"
    assert os.listdir(tmp_path) == ["quota-spawner-gpu-usage.json"]
    watchdog.gpu_usage_file = str(tmp_path / "missing" / "x.json")
    watchdog.write_gpu_usage(watched())  # logged, not raised
    assert watchdog._gpu_usage_lapse.error


def test_with_a_ledger_the_watchdog_writes_its_node_row_and_no_file(tmp_path, monkeypatch,
                                                                    ledger_url):
    monkeypatch.setenv("QUOTA_SPAWNER_STATE_DIR", str(tmp_path))
    Ledger(ledger_url).dispose()  # the hub made it
    watchdog = QuotaWatchdog(usage_db=ledger_url, hub_id=HUB, node_name="gpu-a")
    assert watchdog.gpu_usage_file == "" and watchdog.node == "gpu-a"
    watchdog.book = idle_book()
    watchdog.write_gpu_usage(watched())
    ledger = Ledger(ledger_url, create=False)
    try:
        (row,) = DatabaseDocuments(ledger.engine, HUB).read_all(GPU_USAGE)
        data = json.loads(row.text)
        assert row.node == "gpu-a" and data["node"] == "gpu-a"
        assert data["servers"]["quota-alice"]["user"] == "alice"
    finally:
        ledger.dispose()
    assert not (tmp_path / GPU_USAGE.file).exists()
    assert QuotaWatchdog(usage_db=ledger_url).node == QuotaWatchdog().host_name


# --- the merge --------------------------------------------------------------------------


async def test_the_map_merges_fresh_numbers_and_marks_idle():
    pool = await busy_pool()
    rows = gpu_map(pool_snapshot(pool, T), gpu_usage_snapshot(watched(), idle_book(), 5.0),
                   T + 5)
    assert [r["uuid"] for r in rows] == ["GPU-0", "GPU-1", "GPU-2", "GPU-9"]
    g0, g1, g2, g9 = rows
    assert g0["usage"] == "fresh" and g0["utilization"] == 0.0 and g0["idle"]
    assert g0["idle_since"] == T - 7200
    (alice,) = g0["holders"]
    assert alice["gpu_memory"] == 1 * G and alice["idle"] and alice["mode"] == "exclusive"
    assert g1["utilization"] == 0.75 and not g1["idle"]
    assert [(h["user"], h["gpu_memory"]) for h in g1["holders"]] == [("bob", 6 * G),
                                                                      ("carol", None)]
    assert g2["lost"] == "GPU is lost" and g2["state"] == "free"
    assert not g9["in_pool"] and g9["state"] == "unknown" and g9["memory"] == 40 * G
    assert all(r["in_pool"] for r in rows[:3])
    pool.leave("quota-dave", "test")


async def test_stale_or_missing_watchdog_numbers_are_not_shown():
    pool = await busy_pool()
    snap = pool_snapshot(pool, T)
    usage = gpu_usage_snapshot(watched(), idle_book(), 5.0)
    assert usage_state(usage, T + 14.9) == "fresh"
    assert usage_state(usage, T + 15) == "stale"
    rows = gpu_map(snap, usage, T + 60)
    assert len(rows) == 3  # the host's other GPUs come from the watchdog only when fresh
    for row in rows:
        assert row["usage"] == "stale" and row["utilization"] is None and not row["idle"]
        assert all(h["gpu_memory"] is None for h in row["holders"])
    rows = gpu_map(snap, None, T)
    assert [r["usage"] for r in rows] == ["missing"] * 3
    assert rows[0]["holders"][0]["user"] == "alice"
    assert gpu_map(None, None, T) == []
    assert usage_state({"version": 2, "time": T}, T) == "missing"
    pool.leave("quota-dave", "test")


def test_a_document_that_is_missing_or_half_written_reads_as_none():
    assert json_object(None) is None
    assert json_object('{"version": 1, "gpus": [') is None
    assert json_object("[1, 2]") is None
    assert json_object('{"version": 1}') == {"version": 1}


async def test_an_idle_incident_of_a_former_holder_does_not_mark_the_gpu():
    """The watchdog closes an incident a cycle after its server let the GPU go: until
    then the GPU, free or held by someone else, is not idle."""
    pool = await busy_pool()
    usage = gpu_usage_snapshot(watched(), idle_book(), 5.0)
    pool.leave("quota-dave", "test")  # else the queue takes the GPU alice lets go
    pool.release("quota-alice", "stopped")
    rows = gpu_map(pool_snapshot(pool, T), usage, T + 5)
    assert rows[0]["state"] == "free" and not rows[0]["idle"]
    assert rows[0]["idle_since"] is None
    pool.servers["quota-erin"] = Server("erin", "solo", T)
    pool.acquire("quota-erin", GpuRequest(1))
    (row, *_) = gpu_map(pool_snapshot(pool, T), usage, T + 5)
    assert row["holders"][0]["user"] == "erin" and not row["idle"]
    assert not row["holders"][0]["idle"]


async def test_a_holder_the_watchdog_sees_without_processes_uses_no_memory():
    pool = await busy_pool()
    usage = gpu_usage_snapshot(watched(), idle_book(), 5.0)
    usage["servers"]["quota-carol"] = {"user": "carol", "role": "lab", "gpus": ["GPU-1"],
                                       "gpu_memory": {}}
    g1 = gpu_map(pool_snapshot(pool, T), usage, T + 5)[1]
    assert [(h["user"], h["gpu_memory"]) for h in g1["holders"]] == [("bob", 6 * G),
                                                                      ("carol", 0)]
    pool.leave("quota-dave", "test")


async def test_odd_shapes_in_either_file_are_left_out():
    pool = await busy_pool()
    snap = pool_snapshot(pool, T)
    snap["gpus"][0]["holders"].append("not a holder")
    snap["gpus"].append(["not", "a", "gpu"])
    usage = {"version": 1, "time": T, "interval": 5.0, "gpus": ["GPU-0"],
             "servers": "nobody", "idle": {"GPU-0": 1}}
    rows = gpu_map(snap, usage, T + 1)
    assert [r["uuid"] for r in rows] == ["GPU-0", "GPU-1", "GPU-2"]
    assert [h["user"] for h in rows[0]["holders"]] == ["alice"]
    assert all(r["usage"] == "missing" and not r["idle"] for r in rows)
    assert gpu_map({"version": 1, "gpus": "none"}, None, T) == []
    assert gpu_map(["not", "a", "pool"], None, T) == []  # type: ignore[arg-type]
    pool.leave("quota-dave", "test")


def test_a_short_interval_is_not_stale_before_ten_seconds():
    usage = {"version": 1, "time": T, "interval": 0.5}
    assert usage_state(usage, T + 9.9) == "fresh"
    assert usage_state(usage, T + 10) == "stale"
