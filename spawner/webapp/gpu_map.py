"""The admins' GPU map: the hub's pool snapshot merged with the watchdog's numbers.

Two files feed it, both in the state folder: the hub's ``quota-spawner-gpus.json``
(who holds which GPU, the queue: spawner/gpu/snapshot.py) and the watchdog's
``quota-spawner-gpu-usage.json`` (each GPU's utilisation and memory, each
server's GPU memory, the idle incidents: spawner/watchdog/app.py). Either may
be missing, old, or from another version.

``gpu_map`` returns one row per GPU: the pool's, in its order, then any other
GPU the watchdog sees on the host. Each row has the pool's fields (``uuid``,
``index``, ``name``, ``memory``, ``state``, ``free_slots``, ``reserved_for``,
``in_pool``) and:

- ``usage``: "fresh", "stale" (the watchdog's file is older than
  ``STALE_CYCLES`` of its intervals, and at least ``MIN_STALE_AGE`` seconds) or
  "missing" (no file, or not this GPU);
- ``utilization`` (0 to 1), ``memory_used``, ``memory_total``, ``lost``: the
  watchdog's, when fresh, else None;
- ``idle``: the GPU is held and the watchdog's ``gpu_idle`` rule has an open
  incident for one of its holders on it (fresh only; an incident of a server that
  no longer holds it, which the watchdog closes a cycle later, does not count);
  ``idle_since``: the earliest such incident;
- ``holders``: the pool's holders, each with ``gpu_memory`` (its own
  processes' memory on this GPU, when fresh: 0 when the watchdog sees the server
  and no process of it there, None when it does not see the server) and ``idle``
  (its incident).

Parts of a file that do not have the expected shape are left out, never raised on:
the page that shows the map must not fail on one odd file.
"""

from __future__ import annotations

import json
from typing import Any

STALE_CYCLES = 3  # a watchdog file older than this many of its intervals is stale
# ... and at least this old: the file carries its cycle's start and is written at the
# cycle's end, so with a short interval a slow cycle would flicker between fresh and stale
MIN_STALE_AGE = 10.0
DEFAULT_INTERVAL = 5.0  # the watchdog's default, when its file does not say
VERSION = 1  # the versions of both files this reads


def read_json_file(path: str) -> dict[str, Any] | None:
    """The JSON object in ``path``; None when it is missing, unreadable, half-written
    or not an object."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def usage_state(usage: dict[str, Any] | None, now: float) -> str:
    """"fresh", "stale" or "missing": how far the watchdog's numbers can be trusted."""
    if not usage or usage.get("version") != VERSION or not _number(usage.get("time")):
        return "missing"
    interval = usage.get("interval")
    interval = interval if _number(interval) and interval > 0 else DEFAULT_INTERVAL
    limit = max(STALE_CYCLES * interval, MIN_STALE_AGE)
    return "fresh" if now - usage["time"] < limit else "stale"


def gpu_map(pool: dict[str, Any] | None, usage: dict[str, Any] | None,
            now: float) -> list[dict[str, Any]]:
    """One row per GPU, the pool's holders with the watchdog's numbers (module doc)."""
    state = usage_state(usage, now)
    fresh = state == "fresh"
    data = usage if fresh and usage else {}
    numbers = {u: g for u, g in _dict(data.get("gpus")).items()
               if isinstance(u, str) and isinstance(g, dict)}
    servers = _dict(data.get("servers"))
    idle: dict[str, dict[str, float | None]] = {}  # uuid -> server -> since
    for incident in _list(data.get("idle")):
        if isinstance(incident, dict) and incident.get("uuid"):
            idle.setdefault(incident["uuid"], {})[incident.get("server") or ""] = \
                incident.get("since")
    pool = pool if isinstance(pool, dict) and pool.get("version") == VERSION else {}
    pool_gpus = [g for g in _list(pool.get("gpus")) if isinstance(g, dict)]
    rows = []
    seen = set()
    for gpu in pool_gpus:
        uuid = gpu.get("uuid")
        seen.add(uuid)
        rows.append(_row(gpu, True, numbers.get(uuid), servers, idle.get(uuid, {}), state))
    for uuid, sample in sorted(numbers.items(), key=lambda kv: _index_key(kv[1])):
        if uuid in seen or uuid.startswith("unknown:"):
            continue
        index = sample.get("index")
        gpu = {"uuid": uuid, "index": None if index is None else str(index),
               "name": sample.get("name"),
               "memory": sample.get("memory_total"), "state": "unknown", "free_slots": None,
               "reserved_for": None, "holders": []}
        rows.append(_row(gpu, False, sample, servers, idle.get(uuid, {}), state))
    return rows


def _row(gpu: dict[str, Any], in_pool: bool, sample: dict[str, Any] | None,
         servers: dict[str, Any], idle: dict[str, float | None], state: str) -> dict[str, Any]:
    uuid = gpu.get("uuid")
    sample = sample if isinstance(sample, dict) else None
    holders = []
    held_idle: dict[str, float | None] = {}  # the incidents of this GPU's holders
    for holder in _list(gpu.get("holders")):
        if not isinstance(holder, dict):
            continue
        owner = holder.get("owner")
        server = servers.get(owner) if isinstance(owner, str) else None
        memory = _dict(server.get("gpu_memory")).get(uuid, 0) \
            if isinstance(server, dict) else None
        if owner in idle:
            held_idle[owner] = idle[owner]
        holders.append({**holder, "gpu_memory": memory, "idle": owner in idle})
    since = [s for s in held_idle.values() if _number(s)]
    return {
        "uuid": uuid, "index": gpu.get("index"), "name": gpu.get("name"),
        "memory": gpu.get("memory"), "state": gpu.get("state"),
        "free_slots": gpu.get("free_slots"), "reserved_for": gpu.get("reserved_for"),
        "in_pool": in_pool,
        "usage": state if sample is not None or state != "fresh" else "missing",
        "utilization": sample.get("utilization") if sample else None,
        "memory_used": sample.get("memory_used") if sample else None,
        "memory_total": sample.get("memory_total") if sample else None,
        "lost": sample.get("lost") if sample else None,
        "idle": bool(held_idle),
        "idle_since": min(since) if since else None,
        "holders": holders,
    }


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _index_key(sample: Any) -> tuple[int, str]:
    index = sample.get("index") if isinstance(sample, dict) else None
    return (index if isinstance(index, int) else 1 << 30, str(index))
