"""The files the hub and the watchdog write in the hub's state folder, as the host map
and the class dashboard read them: the hub's ``quota-spawner-gpus.json`` (who holds which
GPU, the host room reserved, the queue: spawner/gpu/snapshot.py) and the watchdog's
``quota-spawner-gpu-usage.json`` (each GPU's utilisation and memory, each server's GPU
memory, CPUs and memory reserved and used, the host's totals, the idle incidents:
spawner/watchdog/app.py).

Either may be missing, half-written, old, or from another version: that reads as
missing or stale, never as an error, so a page never fails on one odd file.
"""

from __future__ import annotations

import json
from typing import Any

GPU_USAGE_FILE_NAME = "quota-spawner-gpu-usage.json"  # the watchdog's
STALE_CYCLES = 3  # a watchdog file older than this many of its intervals is stale
# ... and at least this old: the file carries its cycle's start and is written at the
# cycle's end, so with a short interval a slow cycle would flicker between fresh and stale
MIN_STALE_AGE = 10.0
DEFAULT_INTERVAL = 5.0  # the watchdog's default, when its file does not say
VERSION = 1  # the versions of both files this reads


def number(value: Any) -> bool:
    """A JSON number, not a boolean."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def read_json_file(path: str) -> dict[str, Any] | None:
    """The JSON object in ``path``; None when it is missing, unreadable, half-written
    or not an object (blocking: run it on the worker threads)."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


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
