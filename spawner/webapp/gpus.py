"""The admins' live GPU map (docs/gpu-map.md): the page, its JSON API, and the merge of
the hub's pool snapshot with the watchdog's numbers behind both.

- ``GET {prefix}gpus``: the page. Every GPU of the host with its state, who holds it
  (exclusive or shared), each holder's GPU memory, the GPU's utilisation and memory
  from the watchdog, idle held GPUs marked in words, and the wait queue. It is rendered
  here first, so it reads without a script; ``static/gpus.js`` then asks the API every
  ``POLL_SECONDS`` and updates the page in place (keyboard focus stays where it is).
- ``GET {prefix}api/gpus``: the same as JSON (``map_document``).

Two files in the hub's state folder feed it (state_files.py): the hub's pool snapshot and
the watchdog's usage file, read on the service's worker threads, never on the event loop.
``gpu_map`` returns one row per GPU: the pool's, in its order, then any other GPU the
watchdog sees on the host. Each row has the pool's fields (``uuid``, ``index``, ``name``,
``memory``, ``state``, ``free_slots``, ``reserved_for``, ``in_pool``) and:

- ``usage``: "fresh", "stale" (the watchdog's file is older than ``STALE_CYCLES`` of its
  intervals, and at least ``MIN_STALE_AGE`` seconds) or "missing" (no file, or not this
  GPU);
- ``utilization`` (0 to 1), ``memory_used``, ``memory_total``, ``lost``: the watchdog's,
  when fresh, else None;
- ``idle``: the GPU is held and the watchdog's ``gpu_idle`` rule has an open incident for
  one of its holders on it (fresh only; an incident of a server that no longer holds it,
  which the watchdog closes a cycle later, does not count); ``idle_since``: the earliest;
- ``holders``: the pool's holders, each with ``gpu_memory`` (its own processes' memory on
  this GPU, when fresh: 0 when the watchdog sees the server and no process of it there,
  None when it does not see the server) and ``idle`` (its incident).

Admins only (``admin`` true in the hub's OAuth user model): the map names every user
holding a GPU, across classes, so the usage page's viewers and instructors are refused,
on the page and at the API. Holders' names are chosen by users: Jinja autoescapes them
here, and the script sets them with textContent only.
"""

from __future__ import annotations

import os
import time
from typing import Any
from urllib.parse import quote

from tornado import web

from spawner.gpu.snapshot import GPUS_FILE
from spawner.webapp.base import FORMAT_SCRIPT, ApiHandler, BaseHandler, PageHandler
from spawner.webapp.formatting import size
from spawner.webapp.state_files import (
    GPU_USAGE_FILE_NAME,
    VERSION,
    interval_of,
    number,
    read_json_file,
    stale_after,
    usage_state,
)

POLL_SECONDS = 2.0
ADMINS_ONLY = ("The GPU map is for admins only: it names everyone who holds a GPU. "
               "Your own server's GPU is shown on the hub's home page.")
NO_STATE = ("This service was not given the hub's state folder (QUOTA_SPAWNER_STATE_DIR), "
            "where the hub and the watchdog write the GPU map's files.")
FAILED = ("The GPU map could not be read because of an error; the service's log has the "
          "details.")


# --- the merge -------------------------------------------------------------------------------


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
    since = [s for s in held_idle.values() if number(s)]
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


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _index_key(sample: Any) -> tuple[int, str]:
    index = sample.get("index") if isinstance(sample, dict) else None
    return (index if isinstance(index, int) else 1 << 30, str(index))


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
        interval = interval_of(usage)
        watchdog.update(time=usage["time"], age=max(0.0, now - usage["time"]),
                        interval=interval, host=_text(usage.get("host")),
                        stale_after=stale_after(interval))
    queue = [_ticket(t) for t in _list(pool.get("queue")) if isinstance(t, dict)]
    inventory = pool.get("inventory") if isinstance(pool.get("inventory"), dict) else {}
    in_pool = [r for r in rows if r["in_pool"]]
    return {
        "generated_at": now,
        "poll_seconds": POLL_SECONDS,
        "state_dir": has_state_dir,
        "pool": {"state": "ok" if pool_ok else "missing",
                 "time": pool.get("time") if number(pool.get("time")) else None,
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


# --- the map's words, as static/gpus.js writes them too ---------------------------------------
# Sizes, durations and shares are formatting.py's (static/format.js in the script).


def plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def mode_text(mode: Any, cap: Any) -> str:
    """'exclusive', or 'shared by up to 3, cap 8 GiB'."""
    if isinstance(mode, str) and mode.startswith("shared:"):
        text = f"shared by up to {mode.split(':', 1)[1]}"
        return text + (f", cap {size(cap)}" if number(cap) else "")
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


def holder_users(doc: dict[str, Any]) -> dict[str, str]:
    """Owner (container) -> user, from the holders and the queue: names for the owners a
    preemption names."""
    found = {t["owner"]: t["user"] for t in doc["queue"]
             if isinstance(t.get("owner"), str) and isinstance(t.get("user"), str)}
    for row in doc["gpus"]:
        for h in row["holders"]:
            if isinstance(h.get("owner"), str) and isinstance(h.get("user"), str):
                found[h["owner"]] = h["user"]
    return found


# --- the page and the API --------------------------------------------------------------------


class GpuMap(BaseHandler):
    """Shared by the page and the API: admins only, the two files read on the threads."""

    refused = ADMINS_ONLY

    async def document(self) -> dict[str, Any]:
        return await self.blocking(read_map, self.setup.state_dir, time.time())


class GpuPage(GpuMap, PageHandler):
    """GET {prefix}gpus: the map, drawn here, kept live by static/gpus.js."""

    page_title = "GPU map"
    scripts = (FORMAT_SCRIPT, "gpus.js")

    @web.authenticated
    async def get(self) -> None:
        self.require_admin(ADMINS_ONLY, "GPU map page")
        doc = await self.document()
        users = holder_users(doc)
        indexes = {r["uuid"]: str(r["index"]) for r in doc["gpus"]
                   if isinstance(r.get("uuid"), str) and r.get("index") is not None}
        self.render_page(
            "gpus.html", title="GPU map", doc=doc, now=doc["generated_at"],
            no_state=NO_STATE, gpus_file=GPUS_FILE, usage_file=GPU_USAGE_FILE_NAME,
            plural=plural, mode_text=mode_text,
            user_link=lambda user: user_link(self.prefix, user), holder_users=users,
            preemption_text=lambda t: preemption_text(t, users, indexes), xsrf=self.xsrf(),
            api=self.prefix + "api/gpus", user_page=self.prefix + "user?name=")


class GpuApi(GpuMap, ApiHandler):
    """GET {prefix}api/gpus: the map as JSON (map_document)."""

    unreadable = failed = FAILED

    @web.authenticated
    async def get(self) -> None:
        self.require_admin(ADMINS_ONLY, "GPU map API")
        self.reply(await self.document())


def routes(prefix: str) -> list[tuple[str, type[web.RequestHandler]]]:
    return [(prefix + "gpus", GpuPage), (prefix + "api/gpus", GpuApi)]
