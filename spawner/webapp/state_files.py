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

from typing import Any

from spawner.gpu.snapshot import HubRoom, hub_room
from spawner.state import GPU_USAGE, GPUS, Document, Documents
from spawner.usage.gpu_readings import (
    VERSION,
    as_dict,
    as_list,
    interval_of,
    json_object,
    merge_usage,
    number,
    stale_after,
    usage_state,
)

# the pages read the freshness and the merge of the watchdogs' readings from here
__all__ = ["VERSION", "as_dict", "as_list", "interval_of", "json_object", "merge_usage",
           "number", "read_pool", "read_usage", "stale_after", "usage_state"]


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
