"""The host's room on the admins' host map: the pool snapshot's ``host`` section and its
CPU-only queue rows (spawner/gpu/snapshot.py), the watchdog's host figures in its usage
file (spawner/watchdog/app.py), and their merge (spawner/webapp/gpus.py ``host_view``)."""

from __future__ import annotations

import json

from map_states import G, T, busy_host, join, leave_all, pool, role
from map_states import host_watched as watched

from spawner.gpu.allocator import GpuRequest
from spawner.gpu.pool import Server
from spawner.gpu.snapshot import pool_snapshot
from spawner.host.admission import Reservation
from spawner.watchdog.app import gpu_usage_snapshot
from spawner.watchdog.model import Snapshot
from spawner.watchdog.rules import IncidentBook
from spawner.webapp.gpus import host_view, map_document


async def test_a_cpu_only_start_in_the_queue_asks_for_no_gpu_and_says_what_is_full():
    p = await busy_host()
    snap = pool_snapshot(p, T)
    json.dumps(snap)
    carol, dave = snap["queue"]
    assert (carol["user"], carol["gpus"], carol["mode"]) == ("carol", 0, "")
    assert (carol["cpus"], carol["memory"]) == (0.5, 2 * G)
    assert carol["waiting_for"] == "the host's memory is fully reserved: 61 GiB of 60 GiB"
    assert not carol["preempting"] and carol["victims"] == [] and carol["reserved"] == []
    # dave does not fit either (his own figures, the same as hers); a GPU comes after room
    assert (dave["gpus"], dave["mode"], dave["cpus"]) == (1, "exclusive", 0.5)
    assert dave["waiting_for"] == carol["waiting_for"]
    leave_all(p)


async def test_the_host_section_sums_the_reservations_by_server():
    p = await busy_host()
    host = pool_snapshot(p, T)["host"]
    assert host == {
        "cpus": 16, "memory": 64 * G, "kept_cpus": 1, "kept_memory": 4 * G,
        "cpu_ratio": 4.0, "memory_ratio": 1.0,
        "share": {"cpus": 60, "memory": 60 * G},
        "reserved": {"cpus": 0.75, "memory": 59 * G},
        "servers": [
            {"owner": "quota-alice", "user": "alice", "role": "solo", "cpus": 0.5,
             "memory": 2 * G},
            {"owner": "quota-bob", "user": "bob", "role": "big", "cpus": 0.25,
             "memory": 57 * G}]}
    # a stop frees its room, and the queue's first start takes it
    p.release("quota-bob", "stopped")
    host = pool_snapshot(p, T)["host"]
    assert [s["user"] for s in host["servers"]] == ["alice", "carol", "dave"]
    assert host["reserved"] == {"cpus": 1.5, "memory": 6 * G}
    assert pool_snapshot(p, T)["queue"] == []


async def test_room_found_on_a_running_container_has_no_user_until_the_pool_knows_it():
    p = pool()
    p.adopt_room("quota-eve", Reservation(0.1 + 0.2, G))  # a restart: from docker inspect
    (eve,) = pool_snapshot(p, T)["host"]["servers"]
    assert eve == {"owner": "quota-eve", "user": None, "role": None, "cpus": 0.3,
                   "memory": G}


async def test_with_admission_off_there_is_no_host_and_no_room_in_the_queue():
    p = pool(admission=False)
    p.servers["quota-alice"] = Server("alice", "solo", T)
    p.acquire("quota-alice", GpuRequest(1))
    join(p, "quota-dave", "dave", role("solo", 0.5, 2, gpus=1))
    snap = pool_snapshot(p, T)
    assert snap["host"] is None
    (dave,) = snap["queue"]
    assert (dave["gpus"], dave["cpus"], dave["memory"], dave["waiting_for"]) == (
        1, None, None, None)
    leave_all(p)


# --- the watchdog's host figures --------------------------------------------------------


def test_the_usage_file_carries_the_hosts_reserved_and_used_figures():
    data = gpu_usage_snapshot(watched(), IncidentBook(), 5.0)
    assert json.loads(json.dumps(data)) == data and data["version"] == 1
    assert data["host"] == "gpu-host-1"  # the host's name, as before
    assert data["host_totals"] == {"servers": 2, "cpus": 0.75, "memory": 59 * G,
                            "cpu_used": 0.25, "memory_used": G + G // 2,
                            "engine_cpus": 16.0, "engine_memory": 64 * G}
    assert data["servers"]["quota-bob"] == {
        "user": "bob", "role": "r", "gpus": [], "gpu_memory": {}, "cpus": 0.25,
        "memory": 57 * G, "cpu_used": None, "memory_used": G // 2}
    empty = gpu_usage_snapshot(Snapshot(time=T, host="h"), IncidentBook(), 5.0)
    assert empty["host_totals"] == {"servers": 0, "cpus": 0, "memory": 0, "cpu_used": 0,
                             "memory_used": 0, "engine_cpus": None, "engine_memory": None}


# --- the merge ----------------------------------------------------------------------------


async def test_the_map_shows_the_hubs_reservations_with_the_watchdogs_use():
    p = await busy_host()
    usage = gpu_usage_snapshot(watched(), IncidentBook(), 5.0)
    doc = map_document(pool_snapshot(p, T), usage, T + 2)
    host = doc["host"]
    assert host["state"] == "on" and host["usage"] == "fresh"
    assert (host["cpus"], host["memory"], host["kept_cpus"], host["kept_memory"]) == (
        16, 64 * G, 1, 4 * G)
    assert host["share"] == {"cpus": 60, "memory": 60 * G}
    assert host["reserved"] == {"cpus": 0.75, "memory": 59 * G}
    assert host["used"] == {"cpus": 0.25, "memory": G + G // 2, "servers": 2}
    assert [(s["user"], s["cpus"], s["cpu_used"], s["memory_used"]) for s in host["servers"]] \
        == [("alice", 0.5, 0.25, G), ("bob", 0.25, None, G // 2)]
    summary = doc["summary"]
    assert (summary["waiting"], summary["waiting_for_room"], summary["waiting_for_gpu"]) == (
        2, 2, 0)
    carol, dave = doc["queue"]
    assert carol["gpus"] == 0 and carol["waiting_for"].startswith("the host's memory")
    assert dave["cpus"] == 0.5 and dave["memory"] == 2 * G
    leave_all(p)


async def test_stale_or_missing_use_is_left_out_and_the_reservations_stay():
    p = await busy_host()
    snap = pool_snapshot(p, T)
    leave_all(p)
    usage = gpu_usage_snapshot(watched(), IncidentBook(), 5.0)
    for found, state in ((usage, "stale"), (None, "missing")):
        host = host_view(snap, found, T + 60)
        assert host["state"] == "on" and host["usage"] == state
        assert host["used"] is None and host["engine"] is None
        assert host["reserved"] == {"cpus": 0.75, "memory": 59 * G}
        assert all(s["cpu_used"] is None and s["memory_used"] is None
                   for s in host["servers"])
    # a watchdog from before the host figures: fresh, but nothing to show
    old = {k: v for k, v in usage.items() if k != "host_totals"}
    assert host_view(snap, old, T + 1)["usage"] == "missing"


async def test_a_server_the_pool_does_not_name_is_named_by_the_watchdog():
    p = pool()
    p.adopt_room("quota-alice", Reservation(0.5, 2 * G))
    usage = gpu_usage_snapshot(watched(), IncidentBook(), 5.0)
    (alice,) = host_view(pool_snapshot(p, T), usage, T + 1)["servers"]
    assert (alice["owner"], alice["user"], alice["role"]) == ("quota-alice", "alice", "r")


def test_admission_off_shows_the_watchdogs_figures_only():
    p = pool(admission=False)
    usage = gpu_usage_snapshot(watched(), IncidentBook(), 5.0)
    host = host_view(pool_snapshot(p, T), usage, T + 1)
    assert host["state"] == "off" and host["servers"] == [] and host["reserved"] is None
    assert host["share"] is None and host["cpus"] is None
    assert host["used"] == {"cpus": 0.25, "memory": G + G // 2, "servers": 2}
    assert host["engine"] == {"cpus": 16.0, "memory": 64 * G}


def test_no_pool_or_an_odd_host_section_reads_as_missing():
    assert host_view(None, None, T)["state"] == "missing"
    assert host_view({"version": 1}, None, T)["state"] == "missing"  # a hub from before
    odd = {"version": 1, "host": {"cpus": "many", "share": [], "servers": ["x", {"cpus": 1}]}}
    host = host_view(odd, None, T)
    assert host["state"] == "on" and host["cpus"] is None and host["share"] is None
    assert host["servers"] == [{"owner": None, "user": None, "role": None, "cpus": 1,
                                "memory": None, "cpu_used": None, "memory_used": None}]
    assert host_view({"version": 1, "host": "on"}, None, T)["state"] == "missing"
