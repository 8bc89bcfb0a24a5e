"""The watchdogs' ``gpu-usage`` documents (spawner/usage/documents.py; one per node, written by
spawner/watchdog/app.py) as their readers judge them: how fresh a node's readings are,
which of several nodes' readings of one GPU is shown, their merge for the host map and
the class dashboard, and which GPUs another node's watchdog holds, so that a watchdog
does not call those lost.

Pure functions on the documents' text and JSON objects: no I/O.
"""

from __future__ import annotations

import json
from typing import Any

STALE_CYCLES = 3  # a watchdog's readings older than this many of its intervals are stale
# ... and at least this old: they carry their cycle's start and are written at the
# cycle's end, so with a short interval a slow cycle would flicker between fresh and stale
MIN_STALE_AGE = 10.0
DEFAULT_INTERVAL = 5.0  # the watchdog's default, when its readings do not say
VERSION = 1  # the documents' version: these, and the hub's pool snapshot (gpu/snapshot.py)


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


def as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def interval_of(usage: dict[str, Any]) -> float:
    """The watchdog's interval, as its document says, else its default."""
    interval = usage.get("interval")
    return interval if number(interval) and interval > 0 else DEFAULT_INTERVAL


def stale_after(interval: float) -> float:
    return max(STALE_CYCLES * interval, MIN_STALE_AGE)


def usage_state(usage: dict[str, Any] | None, now: float) -> str:
    """"fresh", "stale" or "missing": how far the watchdog's numbers can be trusted."""
    if not usage or usage.get("version") != VERSION or not number(usage.get("time")):
        return "missing"
    return "fresh" if now - usage["time"] < stale_after(interval_of(usage)) else "stale"


def node_of(usage: dict[str, Any]) -> str:
    """The node whose watchdog wrote the readings (its host, in older documents)."""
    return str(usage.get("node") or usage.get("host") or "")


# --- one GPU, several readings ----------------------------------------------------------------


def holds(gpu: dict[str, Any]) -> bool:
    """Whether the node that wrote this reading of a GPU holds the GPU: its NVML reads it
    (``lost`` is null), or listed it and now cannot read it (``lost``, with an
    ``index``). A lost reading without an index is of a GPU its NVML never listed: one
    that a container on its engine holds, which may be another node's."""
    return gpu.get("lost") is None or gpu.get("index") is not None


def reading_rank(gpu: dict[str, Any], time: float, node: str) -> tuple[int, float, str]:
    """How one fresh node's reading of a GPU ranks among the readings of the same GPU
    (by UUID) by every fresh node; the highest is the one shown:

    1. a live reading (``lost`` null: utilisation, memory, processes) over a lost one;
    2. a lost reading of a node that holds the GPU (``holds``) over an unseen one;
    3. of two readings of the same kind, the fresher (its document's ``time``);
    4. at the same time, the node whose name sorts last.

    So a GPU read on its own node is never replaced by "lost" from a node that merely
    sees a container holding it, and the choice never depends on the order in which the
    documents were read or written."""
    kind = 2 if gpu.get("lost") is None else 1 if holds(gpu) else 0
    return kind, time, node


def merge_usage(readings: list[dict[str, Any]], now: float) -> dict[str, Any] | None:
    """The watchdogs' readings as one, as the pages read a single watchdog's: from every
    fresh node, each GPU's best reading (``reading_rank``), servers by name (each the
    freshest node's, with its GPU memory on each GPU from the node whose reading of that
    GPU is shown, where that node sees the server too), their idle incidents together;
    the time, interval, host and host totals of the freshest. ``nodes``: every node's
    ``node``, ``time`` and ``state``, by node name, for the freshness line. None when
    there are no readings."""
    valid = [u for u in readings if u.get("version") == VERSION and number(u.get("time"))]
    if not valid:
        return None
    # by node name, then time: nothing below depends on the order the rows were read
    valid.sort(key=lambda u: (node_of(u), u["time"]))
    merged = dict(max(valid, key=lambda u: (u["time"], node_of(u))))
    fresh = [u for u in valid if usage_state(u, now) == "fresh"]
    if fresh:
        best: dict[str, tuple[tuple[int, float, str], dict[str, Any], dict[str, Any]]] = {}
        for usage in fresh:
            for uuid, gpu in as_dict(usage.get("gpus")).items():
                if not isinstance(uuid, str) or not isinstance(gpu, dict):
                    continue
                rank = reading_rank(gpu, usage["time"], node_of(usage))
                if uuid not in best or rank > best[uuid][0]:
                    best[uuid] = (rank, gpu, usage)
        servers: dict[str, Any] = {}
        for usage in sorted(fresh, key=lambda u: (u["time"], node_of(u))):
            servers.update(as_dict(usage.get("servers")))  # the freshest last: it wins
        for name, server in servers.items():
            if isinstance(server, dict):
                servers[name] = _gpu_memory_of_shown(name, server, best)
        merged.update(gpus={u: best[u][1] for u in sorted(best)}, servers=servers,
                      idle=[i for u in fresh for i in as_list(u.get("idle"))
                            if isinstance(i, dict)])
    merged["nodes"] = [{"node": node_of(u), "time": u["time"], "state": usage_state(u, now)}
                       for u in valid]
    return merged


def _gpu_memory_of_shown(name: str, server: dict[str, Any],
                         best: dict[str, tuple[Any, dict[str, Any], dict[str, Any]]]
                         ) -> dict[str, Any]:
    """The server with its memory on each GPU from the node whose reading of the GPU is
    shown (its processes are in that node's NVML), when that node sees the server."""
    memory = dict(as_dict(server.get("gpu_memory")))
    for uuid, (_, _, usage) in best.items():
        theirs = as_dict(usage.get("servers")).get(name)
        if isinstance(theirs, dict):
            value = as_dict(theirs.get("gpu_memory")).get(uuid)
            if value is None:
                memory.pop(uuid, None)
            else:
                memory[uuid] = value
    if memory == as_dict(server.get("gpu_memory")):
        return server
    return {**server, "gpu_memory": memory}


def held_elsewhere(readings: list[dict[str, Any]], node: str, now: float,
                   any_age: bool = False) -> dict[str, str]:
    """GPU UUID -> the other node whose fresh readings (of any age with ``any_age``) show
    it holds the GPU (``holds``): the GPUs that ``node``'s watchdog leaves to that node's
    when its own NVML does not list them. The first such node by name, where several
    do."""
    found: dict[str, str] = {}
    for usage in sorted(readings, key=node_of):
        other = node_of(usage)
        state = usage_state(usage, now)
        if other == node or state == "missing" or (state == "stale" and not any_age):
            continue
        for uuid, gpu in as_dict(usage.get("gpus")).items():
            if isinstance(uuid, str) and isinstance(gpu, dict) and holds(gpu):
                found.setdefault(uuid, other)
    return found
