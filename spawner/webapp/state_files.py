"""The documents the hub and the watchdogs publish, as the host map and the class dashboard
read them (spawner/state.py: rows of the ledger's database, or the files of a state
folder): the hub's ``GPUS`` (who holds which GPU, the host room reserved, the queue:
spawner/gpu/snapshot.py) and each watchdog's ``GPU_USAGE`` (each GPU's utilisation and
memory, each server's GPU memory, CPUs and memory reserved and used, the host's totals,
the idle incidents: spawner/watchdog/app.py), one per node. The table editor reads the
hub's GPU inventory and host share from the first (``read_room``).

Any may be missing, half-written, old, or from another version: that reads as
missing or stale, never as an error, so a page never fails on one odd document.
"""

from __future__ import annotations

import json
from typing import Any

from spawner.gpu.snapshot import HubRoom, hub_room
from spawner.state import GPU_USAGE, GPUS, Document, Documents

STALE_CYCLES = 3  # a watchdog's readings older than this many of its intervals are stale
# ... and at least this old: they carry their cycle's start and are written at the
# cycle's end, so with a short interval a slow cycle would flicker between fresh and stale
MIN_STALE_AGE = 10.0
DEFAULT_INTERVAL = 5.0  # the watchdog's default, when its readings do not say
VERSION = 1  # the versions of both documents this reads


def number(value: Any) -> bool:
    """A JSON number, not a boolean."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def json_object(text: str | None) -> dict[str, Any] | None:
    """The JSON object in ``text``; None when it is missing, half-written or not one."""
    try:
        data = json.loads(text) if text is not None else None
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def read_pool(documents: Documents | None) -> dict[str, Any] | None:
    """The hub's pool snapshot (blocking: run it on the worker threads)."""
    found = documents.read(GPUS) if documents is not None else None
    return json_object(found.text) if found is not None else None


def read_room(documents: Documents | None) -> HubRoom | None:
    """What the hub checks the quota table against, from its pool snapshot: its GPU
    inventory and its host's share; None while it has published none (blocking)."""
    return hub_room(read_pool(documents))


def read_usage(documents: Documents | None, now: float) -> dict[str, Any] | None:
    """Every watchdog's readings merged into one (``merge_usage``; blocking)."""
    found: list[Document] = documents.read_all(GPU_USAGE) if documents is not None else []
    return merge_usage([u for u in (json_object(d.text) for d in found) if u], now)


def merge_usage(readings: list[dict[str, Any]], now: float) -> dict[str, Any] | None:
    """The watchdogs' readings as one, as the pages read a single watchdog's: GPUs by UUID
    and servers by name from every fresh node (both are unique across nodes), their idle
    incidents together; the time, interval and host of the freshest, whose host totals are
    kept. ``nodes``: every node's ``node``, ``time`` and ``state``, for the freshness line.
    None when there are no readings."""
    valid = [u for u in readings if u.get("version") == VERSION and number(u.get("time"))]
    if not valid:
        return None
    valid.sort(key=lambda u: u["time"], reverse=True)
    merged = dict(valid[0])
    fresh = [u for u in valid if usage_state(u, now) == "fresh"]
    gpus: dict[str, Any] = {}
    servers: dict[str, Any] = {}
    idle: list[Any] = []
    for usage in reversed(fresh):  # the freshest last: its numbers win a clash
        gpus.update(as_dict(usage.get("gpus")))
        servers.update(as_dict(usage.get("servers")))
        idle += [i for i in as_list(usage.get("idle")) if isinstance(i, dict)]
    if fresh:
        merged.update(gpus=gpus, servers=servers, idle=idle)
    merged["nodes"] = [{"node": str(u.get("node") or u.get("host") or ""), "time": u["time"],
                        "state": usage_state(u, now)} for u in valid]
    return merged


def as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def interval_of(usage: dict[str, Any]) -> float:
    """The watchdog's interval, as its file says, else its default."""
    interval = usage.get("interval")
    return interval if number(interval) and interval > 0 else DEFAULT_INTERVAL


def stale_after(interval: float) -> float:
    return max(STALE_CYCLES * interval, MIN_STALE_AGE)


def usage_state(usage: dict[str, Any] | None, now: float) -> str:
    """"fresh", "stale" or "missing": how far the watchdog's numbers can be trusted."""
    if not usage or usage.get("version") != VERSION or not number(usage.get("time")):
        return "missing"
    return "fresh" if now - usage["time"] < stale_after(interval_of(usage)) else "stale"
