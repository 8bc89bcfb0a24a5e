"""The admins' live GPU map, in the usage service (docs/gpu-map.md).

Routes under the service's prefix:

- ``GET {prefix}gpus``: the page. Every GPU of the host with its state, who holds it
  (exclusive or shared), each holder's GPU memory, the GPU's utilisation and memory
  from the watchdog, idle held GPUs marked in words, and the wait queue. It is rendered
  here first, so it reads without a script; ``static/gpus.js`` then asks the API every
  ``POLL_SECONDS`` and updates the page in place (keyboard focus stays where it is).
- ``GET {prefix}api/gpus``: the same as JSON (``map_document``).

Two files in the hub's state folder feed it (QUOTA_SPAWNER_STATE_DIR, which the hub
config hands the service): the hub's pool snapshot and the watchdog's usage file,
merged by :func:`spawner.webapp.gpu_map.gpu_map`. They are read on the service's worker
threads, never on the event loop.

Admins only (``admin`` true in the hub's OAuth user model): the map names every user
holding a GPU, across classes, so the usage page's viewers and instructors are refused,
on the page and at the API. Holders' names are chosen by users: Jinja autoescapes them
here, and the script sets them with textContent only.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from typing import Any
from urllib.parse import quote

from tornado import web

from spawner.gpu.snapshot import GPUS_FILE
from spawner.quota.units import human_duration
from spawner.webapp.app import Refused, UsageHandler
from spawner.webapp.classes import GPU_USAGE_FILE_NAME
from spawner.webapp.gpu_map import (
    DEFAULT_INTERVAL,
    MIN_STALE_AGE,
    STALE_CYCLES,
    VERSION,
    gpu_map,
    read_json_file,
    usage_state,
)
from spawner.webapp.table_page import PAGE_CSP, static_version

log = logging.getLogger("quota_spawner.usage")

POLL_SECONDS = 2.0
ADMINS_ONLY = ("The GPU map is for admins only: it names everyone who holds a GPU. "
               "Your own server's GPU is shown on the hub's home page.")
NO_STATE = ("This service was not given the hub's state folder (QUOTA_SPAWNER_STATE_DIR), "
            "where the hub and the watchdog write the GPU map's files.")
STATE_SETTING = "gpu_state_dir"  # make_app(gpu_state_dir=…) replaces the environment's


def state_dir(settings: dict[str, Any]) -> str:
    """The state folder: the app's setting when given (tests), else the environment's."""
    if STATE_SETTING in settings:
        return str(settings[STATE_SETTING] or "")
    return os.environ.get("QUOTA_SPAWNER_STATE_DIR", "")


# --- the document ----------------------------------------------------------------------------


def map_document(pool: dict[str, Any] | None, usage: dict[str, Any] | None, now: float,
                 has_state_dir: bool = True) -> dict[str, Any]:
    """What the page shows, as JSON: the merged rows, the queue, both files' freshness
    and a summary. Times are epoch seconds, memory bytes, utilisation 0 to 1."""
    pool_ok = isinstance(pool, dict) and pool.get("version") == VERSION
    pool = pool if pool_ok and pool else {}
    rows = gpu_map(pool, usage, now)
    state = usage_state(usage, now)
    watchdog: dict[str, Any] = {"state": state, "time": None, "age": None, "interval": None,
                                "stale_after": None, "host": None}
    if state != "missing" and usage:
        interval = usage.get("interval")
        interval = interval if _number(interval) and interval > 0 else DEFAULT_INTERVAL
        watchdog.update(time=usage["time"], age=max(0.0, now - usage["time"]),
                        interval=interval, host=_text(usage.get("host")),
                        stale_after=max(STALE_CYCLES * interval, MIN_STALE_AGE))
    queue = [_ticket(t) for t in _list(pool.get("queue")) if isinstance(t, dict)]
    inventory = pool.get("inventory") if isinstance(pool.get("inventory"), dict) else {}
    in_pool = [r for r in rows if r["in_pool"]]
    return {
        "generated_at": now,
        "poll_seconds": POLL_SECONDS,
        "state_dir": has_state_dir,
        "pool": {"state": "ok" if pool_ok else "missing",
                 "time": pool.get("time") if _number(pool.get("time")) else None,
                 "hub": _text(pool.get("hub")),
                 "inventory": {"source": _text(inventory.get("source")),
                               "reason": _text(inventory.get("reason"))}},
        "watchdog": watchdog,
        "summary": {
            "total": len(in_pool),
            "exclusive": sum(r["state"] == "exclusive" for r in in_pool),
            "shared": sum(r["state"] == "shared" for r in in_pool),
            "free": sum(r["state"] == "free" for r in in_pool),
            "idle": sum(bool(r["idle"]) for r in rows),
            "waiting": len(queue),
            "other": len(rows) - len(in_pool),
        },
        "gpus": rows,
        "queue": queue,
    }


def read_map(folder: str, now: float) -> dict[str, Any]:
    """Both files from the state folder, merged (blocking: run on a worker thread)."""
    if not folder:
        return map_document(None, None, now, has_state_dir=False)
    pool = read_json_file(os.path.join(folder, GPUS_FILE))
    usage = read_json_file(os.path.join(folder, GPU_USAGE_FILE_NAME))
    return map_document(pool, usage, now)


def _ticket(ticket: dict[str, Any]) -> dict[str, Any]:
    keys = ("position", "owner", "user", "role", "priority", "since", "gpus", "mode",
            "preempting")
    found = {k: ticket.get(k) for k in keys}
    found["victims"] = [v for v in _list(ticket.get("victims")) if isinstance(v, str)]
    found["reserved"] = [u for u in _list(ticket.get("reserved")) if isinstance(u, str)]
    return found


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


# --- words and numbers, as static/gpus.js writes them too -----------------------------------
# The script redraws the page from the API with the same functions (same rounding: half
# up), so the first, server-drawn page and every update read alike.


def _half_up(value: float) -> int:
    return math.floor(value + 0.5)


def duration(seconds: float | None) -> str:
    """'45s', '3m20s', '2h05m', '1d4h': the two largest units."""
    return "–" if seconds is None else human_duration(seconds)


def size(num_bytes: float | None) -> str:
    """'80 GiB', '1.5 GiB', '512 MiB'; '–' when unknown."""
    if num_bytes is None or not _number(num_bytes):
        return "–"
    value = float(num_bytes)
    unit = "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            break
        value /= 1024
    if value < 10:
        tenths = _half_up(value * 10)
        shown = str(tenths // 10) if tenths % 10 == 0 else f"{tenths // 10}.{tenths % 10}"
    else:
        shown = str(_half_up(value))
    return f"{shown} {unit}"


def percent(fraction: float | None) -> str:
    if fraction is None or not _number(fraction):
        return "–"
    return f"{_half_up(fraction * 100)}%"


def plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def mode_text(mode: Any, cap: Any) -> str:
    """'exclusive', or 'shared by up to 3, cap 8 GiB'."""
    if isinstance(mode, str) and mode.startswith("shared:"):
        text = f"shared by up to {mode.split(':', 1)[1]}"
        return text + (f", cap {size(cap)}" if _number(cap) else "")
    return str(mode or "exclusive")


def preemption_text(ticket: dict[str, Any], users: dict[str, str],
                    indexes: dict[str, str]) -> str:
    """'under way: stopping alice; GPU 0 kept for it', or '–'."""
    if not ticket.get("preempting"):
        return "–"
    text = "under way"
    if ticket["victims"]:
        text += ": stopping " + ", ".join(users.get(v, v) for v in ticket["victims"])
    if ticket["reserved"]:
        text += "; " + ", ".join(f"GPU {indexes.get(u, u)}" for u in ticket["reserved"]) \
            + " kept for it"
    return text


def user_link(prefix: str, user: str) -> str:
    """The user's usage page; quoted as the script's encodeURIComponent quotes."""
    return prefix + "user?name=" + quote(user, safe="!'()*")


# --- handlers --------------------------------------------------------------------------------


def script_version() -> str:
    return static_version("gpus.js")


class _GpuMap(UsageHandler):
    page_title = "GPU map"

    def admin(self, what: str) -> str:
        """The admin's name, or Refused: only ``admin`` true counts."""
        model = self.current_user
        if model.get("admin") is not True:
            log.info("GPU map %s: refused %s, not an admin", what, model.get("name"))
            raise Refused(ADMINS_ONLY)
        return str(model["name"])

    async def document(self) -> dict[str, Any]:
        return await self.reader.call(read_map, state_dir(self.settings), time.time())


class GpuPage(_GpuMap):
    """GET {prefix}gpus: the map, drawn here, kept live by static/gpus.js."""

    def set_default_headers(self) -> None:
        super().set_default_headers()
        self.set_header("Content-Security-Policy", PAGE_CSP)

    @web.authenticated
    async def get(self) -> None:
        self.admin("page")
        doc = await self.document()
        prefix = self.settings["usage_prefix"]
        users = _holder_users(doc)
        indexes = {r["uuid"]: str(r["index"]) for r in doc["gpus"]
                   if isinstance(r.get("uuid"), str) and r.get("index") is not None}
        self.render_page(
            "gpus.html", title="GPU map", doc=doc, now=doc["generated_at"],
            no_state=NO_STATE, gpus_file=GPUS_FILE, usage_file=GPU_USAGE_FILE_NAME,
            duration=duration, size=size, percent=percent, plural=plural,
            mode_text=mode_text, user_link=lambda user: user_link(prefix, user),
            holder_users=users,
            preemption_text=lambda t: preemption_text(t, users, indexes),
            xsrf=self.xsrf(),
            api=prefix + "api/gpus", user_page=prefix + "user?name=",
            script=f"{prefix}static/gpus.js?v={script_version()}")


def _holder_users(doc: dict[str, Any]) -> dict[str, str]:
    """Owner (container) -> user, from the holders and the queue: names for the owners a
    preemption names."""
    found = {t["owner"]: t["user"] for t in doc["queue"]
             if isinstance(t.get("owner"), str) and isinstance(t.get("user"), str)}
    for row in doc["gpus"]:
        for h in row["holders"]:
            if isinstance(h.get("owner"), str) and isinstance(h.get("user"), str):
                found[h["owner"]] = h["user"]
    return found


class GpuApi(_GpuMap):
    """GET {prefix}api/gpus: the map as JSON (map_document)."""

    def set_default_headers(self) -> None:
        super().set_default_headers()
        self.set_header("Content-Type", "application/json; charset=utf-8")

    @web.authenticated
    async def get(self) -> None:
        self.admin("API")
        self.finish(json.dumps(await self.document()))

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        error = kwargs.get("exc_info", (None, None, None))[1]
        sentence = getattr(error, "sentence", None)
        if sentence is None:
            sentence = {403: ADMINS_ONLY, 404: "There is no such endpoint here."}.get(
                status_code, "The GPU map could not be read because of an error; the "
                "service's log has the details.")
        self.set_header("Content-Type", "application/json; charset=utf-8")
        self.finish(json.dumps({"message": sentence}))


def routes(prefix: str) -> list[tuple[Any, ...]]:
    """The page's routes, for make_app; its script is served by table_page's static route."""
    prefix = prefix if prefix.endswith("/") else prefix + "/"
    return [
        (prefix + "gpus", GpuPage),
        (prefix + "api/gpus", GpuApi),
    ]
