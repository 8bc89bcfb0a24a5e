"""The home's use, as the server sees it where its home has a size (docs/disk.md#what-a-user-sees).

The hub (at the start) and the watchdog (each cycle) write ``home.json`` into a folder
bound read-only into the container; ``HOME_USE_FILE`` names it, and ``DISK_LIMIT`` is
set only where the home has a size. btrfs's statfs does not show a qgroup's limit, so
the file is the only way a notebook learns how full its home is.

``read_home`` reads it in the monitor's sampling thread (an open, an fstat and one
small, non-blocking read) and never raises: a file that is missing, partly written,
not JSON, of another version or with numbers out of range gives a reading of status
"unknown" with a sentence that says why, never an error page. ``home_report`` adds what
depends on the moment (``stale``) for the API.
"""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Mapping
from typing import Any, TypedDict

from spawner.contract import (
    DISK_LIMIT,
    HOME_OVER_SIZE,
    HOME_USE_FILE,
    HOME_USE_VERSION,
    home_is_full,
)

MAX_FILE_BYTES = 4096  # the watchdog's file is about 100 bytes
MAX_BYTES = 2**63 - 1  # what a filesystem can count; anything above is not a real use


class HomeReading(TypedDict):
    """What ``read_home`` found; ``used``, ``full`` and ``at`` are None unless "ok"."""

    status: str  # "ok" or "unknown"
    message: str  # "" when ok, else one sentence
    used: int | None
    limit: int  # the file's, else DISK_LIMIT
    full: bool | None
    at: float | None
    over_size: str | None  # HOME_OVER_SIZE: the hub's sentence at the start, when over


class HomeReport(HomeReading):
    """The API's ``home`` (docs/gpu-metrics.schema.json)."""

    fraction: float | None
    stale: bool


def disk_limit(env: Mapping[str, str]) -> int | None:
    """DISK_LIMIT in bytes; None when unset, unreadable or not positive: no size."""
    try:
        value = int(env.get(DISK_LIMIT, ""))
    except ValueError:
        return None
    return value if 0 < value <= MAX_BYTES else None


def _size(value: Any) -> int | None:
    """A byte count the file may hold: a whole number from 0 to MAX_BYTES (no bool)."""
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if 0 <= value <= MAX_BYTES else None


def _unknown(limit: int, over_size: str | None, why: str) -> HomeReading:
    return HomeReading(status="unknown", message=f"The home's use is unknown: {why}.",
                       used=None, limit=limit, full=None, at=None, over_size=over_size)


def parse_home(data: bytes | str, limit: int, over_size: str | None = None) -> HomeReading:
    """The reading in ``data`` (the file's bytes); ``limit``: DISK_LIMIT, used where the
    file's own is missing."""
    try:
        raw = json.loads(data)
    except ValueError:  # also UnicodeDecodeError; a partial write is not JSON either
        return _unknown(limit, over_size, "its file is not JSON")
    if not isinstance(raw, dict):
        return _unknown(limit, over_size, "its file is not a JSON object")
    if raw.get("version") != HOME_USE_VERSION:
        return _unknown(limit, over_size,
                        f"its file is not of version {HOME_USE_VERSION} "
                        f"({str(raw.get('version'))[:20]!r})")
    used, size = _size(raw.get("used")), _size(raw.get("limit"))
    if used is None or size is None or size == 0:
        return _unknown(limit, over_size, "its file's used or limit is not a size in bytes")
    at = raw.get("at")
    if isinstance(at, bool) or not isinstance(at, int | float) or not 0 <= at < 1e11:
        return _unknown(limit, over_size, "its file's time is not a time")
    full = raw.get("full")
    return HomeReading(status="ok", message="", used=used, limit=size,
                       # the file's word where it has one; the numbers otherwise
                       full=full if isinstance(full, bool) else home_is_full(used, size),
                       at=float(at), over_size=over_size)


def not_read_yet(env: Mapping[str, str]) -> HomeReading | None:
    """The monitor's home before its first tick: unknown where the home has a size."""
    limit = disk_limit(env)
    if limit is None:
        return None
    return _unknown(limit, env.get(HOME_OVER_SIZE) or None, "not read yet")


def read_home(env: Mapping[str, str]) -> HomeReading | None:
    """This server's home; None when it has no size (no DISK_LIMIT). Blocking, cheap,
    never raises."""
    limit = disk_limit(env)
    if limit is None:
        return None
    over_size = env.get(HOME_OVER_SIZE) or None
    path = env.get(HOME_USE_FILE, "")
    if not path:
        return _unknown(limit, over_size, f"{HOME_USE_FILE} is not set")
    try:  # non-blocking: a FIFO at the path cannot hang the sampling thread
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as error:
        return _unknown(limit, over_size, f"{path} cannot be read ({error.strerror})")
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return _unknown(limit, over_size, f"{path} is not a file")
        data = os.read(fd, MAX_FILE_BYTES + 1)
    except OSError as error:
        return _unknown(limit, over_size, f"{path} cannot be read ({error.strerror})")
    finally:
        os.close(fd)
    if len(data) > MAX_FILE_BYTES:
        return _unknown(limit, over_size, f"{path} is too large")
    return parse_home(data, limit, over_size)


def home_report(reading: HomeReading | None, stale_after: float,
                now: float | None = None) -> HomeReport | None:
    """``reading`` for the API: its share of the size, and whether it is older than
    ``stale_after`` seconds (the watchdog rewrites the file at least every minute)."""
    if reading is None:
        return None
    used, at = reading["used"], reading["at"]
    now = time.time() if now is None else now
    return HomeReport(**reading, fraction=None if used is None else used / reading["limit"],
                      stale=at is not None and now - at > stale_after)
