"""Two readings of one GPU (spawner/usage/gpu_readings.py): which node's reading the host
map shows, whatever order the watchdogs wrote their rows in, and the nodes listed in one
stable order from one refresh to the next.

Two watchdogs on one engine (or a node that moved) both see the container that holds a
GPU; only one of them has the GPU in its NVML. The other's reading says "lost", with no
index and no numbers."""

from __future__ import annotations

import itertools
import logging
import random

from spawner.gpu.allocator import GpuRequest
from spawner.gpu.inventory import declared_inventory
from spawner.gpu.pool import GpuPool, Server
from spawner.gpu.snapshot import pool_snapshot
from spawner.usage.gpu_readings import (
    held_elsewhere,
    merge_usage,  # as the pages read the rows
    reading_rank,
)
from spawner.webapp.gpus import map_document, nodes_text

G = 2**30
T = 1_700_000_000.0
LIVE = {"index": 0, "name": "H200", "utilization": 0.61, "memory_used": 6 * G,
        "memory_total": 80 * G, "lost": None}
UNSEEN = {"index": None, "name": "GPU", "utilization": None, "memory_used": None,
          "memory_total": None, "lost": "Not Found"}  # listed by no NVML of this node
ANN = {"user": "ann", "role": "gpu", "gpus": ["GPU-a"], "cpus": 1.0, "memory": 4 * G,
       "cpu_used": 0.5, "memory_used": G}


def reading(node: str, time: float, gpus: dict, servers: dict | None = None) -> dict:
    return {"version": 1, "time": time, "interval": 1.0, "host": node, "node": node,
            "gpus": gpus, "servers": servers or {}, "idle": [], "host_totals": {}}


def node_a(time: float) -> dict:
    """The node whose NVML lists GPU-a: 61% busy, ann's processes hold 6 GiB."""
    return reading("node-a", time, {"GPU-a": LIVE},
                   {"quota-ann": {**ANN, "gpu_memory": {"GPU-a": 6 * G}}})


def node_b(time: float) -> dict:
    """Its neighbour on the same engine: sees ann's container, not GPU-a; has GPU-b."""
    return reading("node-b", time, {"GPU-a": UNSEEN, "GPU-b": {**LIVE, "utilization": 0.2}},
                   {"quota-ann": {**ANN, "gpu_memory": {}}})


def pool_with_ann() -> dict:
    pool = GpuPool(declared_inventory([{"uuid": u, "name": "H200", "memory": "80G"}
                                       for u in ("GPU-a", "GPU-b")]), "hub",
                   logging.getLogger("test.gpu_readings"))
    pool.servers["quota-ann"] = Server("ann", "gpu", T - 100)
    assert pool.acquire("quota-ann", GpuRequest(1)) == ("GPU-a",)
    return pool_snapshot(pool, T)


def test_a_live_reading_wins_over_a_lost_one_from_a_node_without_the_gpu():
    """Whichever wrote last, and in whichever order the rows are read: GPU-a shows node
    a's 61% and 6 GiB, and ann's 6 GiB on it, never "lost"."""
    pool = pool_with_ann()
    for a_time, b_time in ((T, T + 0.5), (T + 0.5, T)):  # both write orders
        for rows in ([node_a(a_time), node_b(b_time)], [node_b(b_time), node_a(a_time)]):
            doc = map_document(pool, merge_usage(rows, T + 1), T + 1)
            a, b = doc["gpus"]
            assert (a["uuid"], a["lost"], a["utilization"], a["memory_used"]) == (
                "GPU-a", None, 0.61, 6 * G)
            (ann,) = a["holders"]
            assert ann["user"] == "ann" and ann["gpu_memory"] == 6 * G
            assert b["utilization"] == 0.2


def test_the_rule_between_two_readings():
    lost_here = {**UNSEEN, "index": 0, "lost": "GPU is lost"}  # its NVML listed it
    # live over lost, even a lost one of a node that listed the GPU (a GPU that moved)
    assert reading_rank(LIVE, T, "x") > reading_rank(lost_here, T + 9, "y")
    assert reading_rank(lost_here, T, "x") > reading_rank(UNSEEN, T + 9, "y")
    # of two of a kind, the fresher; at the same time, the node's name decides
    assert reading_rank(LIVE, T + 1, "a") > reading_rank(LIVE, T, "b")
    assert reading_rank(LIVE, T, "b") > reading_rank(LIVE, T, "a")
    fresher = {**LIVE, "utilization": 0.9}
    for rows in ([node_a(T), reading("node-c", T + 2, {"GPU-a": fresher})],
                 [reading("node-c", T + 2, {"GPU-a": fresher}), node_a(T)]):
        assert merge_usage(rows, T + 3).gpus["GPU-a"].utilization == 0.9
    # a stale node's reading is left out, whatever it says
    assert merge_usage([node_a(T - 60), node_b(T)], T + 1).gpus["GPU-a"].to_json() == UNSEEN


def test_the_nodes_and_gpus_keep_their_order_from_one_refresh_to_the_next():
    """Every refresh a different node is the freshest, the rows come in another order
    and each document's dicts in another order: the nodes line, the API's nodes and the
    map's rows stay the same."""
    pool = pool_with_ann()
    shuffle = random.Random(33)
    seen = set()
    for refresh in range(24):
        times = [T + (refresh + i) % 3 for i in range(3)]
        rows = [node_b(times[0]), node_a(times[1]),
                reading("gpu-0", times[2], {"GPU-z": {**LIVE, "index": 0},
                                            "GPU-y": {**LIVE, "index": 0}})]
        shuffle.shuffle(rows)
        for row in rows:
            for key in ("gpus", "servers"):
                items = list(row[key].items())
                shuffle.shuffle(items)
                row[key] = dict(items)
        doc = map_document(pool, merge_usage(rows, T + 5), T + 5)
        nodes = doc["watchdog"]["nodes"]
        seen.add((tuple(n["node"] for n in nodes), nodes_text(nodes),
                  tuple(g["uuid"] for g in doc["gpus"])))
    assert seen == {(("gpu-0", "node-a", "node-b"),
                     "Readings from 3 watchdogs: gpu-0 (fresh), node-a (fresh), "
                     "node-b (fresh).",
                     ("GPU-a", "GPU-b", "GPU-y", "GPU-z"))}


def test_the_gpus_another_node_holds():
    lost_there = {**UNSEEN, "index": 3, "lost": "GPU is lost"}  # theirs, and lost
    rows = [node_a(T), node_b(T), reading("node-c", T, {"GPU-c": lost_there}),
            reading("node-d", T - 60, {"GPU-d": LIVE})]  # stale: says nothing now
    assert held_elsewhere(rows, "node-b", T + 1) == {"GPU-a": "node-a", "GPU-c": "node-c"}
    # node b's unseen GPU-a is no claim on it: node a keeps its own
    assert held_elsewhere(rows, "node-a", T + 1) == {"GPU-b": "node-b", "GPU-c": "node-c"}
    assert held_elsewhere([], "node-a", T) == {}


def test_the_merge_does_not_depend_on_the_order_of_the_rows():
    """Three rows written in the same moment: the same merge, read in any order."""
    rows = [node_a(T), node_b(T), reading("node-c", T, {"GPU-c": LIVE})]
    merged = [merge_usage(list(order), T + 1) for order in itertools.permutations(rows)]
    assert all(m == merged[0] for m in merged)
