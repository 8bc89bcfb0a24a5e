"""The admins' live host map (docs/gpu-map.md): the page, its JSON API, and the merge of
the hub's pool snapshot with the watchdog's numbers behind both.

- ``GET {prefix}gpus``: the page. The host's CPUs and memory: what the servers reserve
  of the notebooks' share (host admission, docs/deployment.md#host-capacity) and what
  they use (the watchdog), each server's room; every GPU of the host with its state, who
  holds it (exclusive or shared), each holder's GPU memory, the GPU's utilisation and
  memory from the watchdog, idle held GPUs marked in words; and the wait queue, GPU
  starts and starts waiting for room on the host. It is drawn here only, so it reads
  without a script; ``static/gpus.js`` then asks the API for it again every
  ``POLL_SECONDS``, as HTML, and patches what changed into the page in place
  (``static/live.js``; keyboard focus stays where it is).
- ``GET {prefix}api/gpus``: the same as JSON (``map_document``); asked with
  ``Accept: text/html`` only, the page's drawing of it (base.py's ``reply_html``).

Two files in the hub's state folder feed it (usage/documents.py): the hub's pool snapshot and
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

``host_view`` gives the host's part: the pool's ``host`` section (``state`` "on"; "off"
when host admission is off; "missing" without one) with each server's room, and the
watchdog's figures when fresh (``usage`` says "fresh", "stale" or "missing", as for a
GPU): ``used`` (the servers' CPUs and memory working set, together), ``engine`` (what
the engine has) and each server's ``cpu_used`` and ``memory_used``.

Admins only (``admin`` true in the hub's OAuth user model): the map names every user
holding a GPU or room on the host, across classes, so the usage page's viewers and
instructors are refused, on the page and at the API. Holders' names are chosen by
users: Jinja autoescapes them here; each stands isolated in its line (dir="auto", <bdi>),
so its bidi controls stay inside it.
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import quote

from tornado import web

from spawner.gpu.queue import ORDER, STRATEGIES, STRICT_FIFO
from spawner.usage.documents import GPU_USAGE, GPUS, Documents, read_pool, read_usage
from spawner.usage.gpu_readings import VERSION, interval_of, number, stale_after, usage_state
from spawner.usage.gpu_readings import as_dict as _dict
from spawner.usage.gpu_readings import as_list as _list
from spawner.webapp.base import LIVE_SCRIPT, ApiHandler, BaseHandler, PageHandler
from spawner.webapp.formatting import duration, half_up, isolate, size

POLL_SECONDS = 2.0
ADMINS_ONLY = ("The host map is for admins only: it names everyone who holds a GPU or "
               "room on the host. Your own server's GPU is shown on the hub's home page.")
NO_STATE = ("This service was given neither the ledger's database (QUOTA_SPAWNER_USAGE_DB) "
            "nor the hub's state folder (QUOTA_SPAWNER_STATE_DIR), where the hub and the "
            "watchdogs publish what the host map shows.")
# where the map's documents are, in the sentences that say one is missing
IN_DATABASE = ("the hub's snapshot in the ledger's database",
               "the watchdogs' readings in the ledger's database")
IN_FOLDER = (f"{GPUS.file} in the state folder", f"{GPU_USAGE.file} in the state folder")
FAILED = ("The host map could not be read because of an error; the service's log has the "
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


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _number(value: Any) -> float | None:
    return value if number(value) else None


def _pair(value: Any) -> dict[str, Any] | None:
    """A ``{"cpus", "memory"}`` object; None when it is not one."""
    if not isinstance(value, dict):
        return None
    return {"cpus": _number(value.get("cpus")), "memory": _number(value.get("memory"))}


def host_view(pool: dict[str, Any] | None, usage: dict[str, Any] | None,
              now: float) -> dict[str, Any]:
    """The host's CPUs and memory: the hub's reservations, the watchdog's use (module doc)."""
    pool = pool if isinstance(pool, dict) and pool.get("version") == VERSION else {}
    section = pool.get("host", "")  # an older hub writes none
    state = "off" if section is None else "on" if isinstance(section, dict) else "missing"
    host = section if isinstance(section, dict) else {}
    usage_seen = usage_state(usage, now)
    fresh = usage if usage_seen == "fresh" and usage else {}
    totals = _dict(fresh.get("host_totals")) if "host_totals" in fresh else None
    watched = _dict(fresh.get("servers"))
    servers = []
    for row in _list(host.get("servers")):
        if not isinstance(row, dict):
            continue
        owner = _text(row.get("owner"))
        seen = _dict(watched.get(owner)) if owner is not None else {}
        servers.append({
            "owner": owner,
            # a server adopted after a hub restart is named by its labels, as the
            # watchdog reads them
            "user": _text(row.get("user")) or _text(seen.get("user")),
            "role": _text(row.get("role")) or _text(seen.get("role")),
            "cpus": _number(row.get("cpus")), "memory": _number(row.get("memory")),
            "cpu_used": _number(seen.get("cpu_used")),
            "memory_used": _number(seen.get("memory_used")),
        })
    engine = None
    if totals is not None and number(totals.get("engine_cpus")):
        engine = {"cpus": totals["engine_cpus"], "memory": _number(totals.get("engine_memory"))}
    return {
        "state": state,
        "cpus": _number(host.get("cpus")), "memory": _number(host.get("memory")),
        "kept_cpus": _number(host.get("kept_cpus")),
        "kept_memory": _number(host.get("kept_memory")),
        "cpu_ratio": _number(host.get("cpu_ratio")),
        "memory_ratio": _number(host.get("memory_ratio")),
        "share": _pair(host.get("share")), "reserved": _pair(host.get("reserved")),
        "usage": usage_seen if usage_seen != "fresh" or totals is not None else "missing",
        "used": None if totals is None else {
            "cpus": _number(totals.get("cpu_used")),
            "memory": _number(totals.get("memory_used")),
            "servers": _number(totals.get("servers"))},
        "engine": engine,
        "servers": servers,
    }


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
    # each watchdog's node (one per node on a cluster), in the freshness line
    watchdog["nodes"] = [{"node": _text(n.get("node")), "state": _text(n.get("state")),
                          "age": max(0.0, now - n["time"]) if number(n.get("time")) else None}
                         for n in _list((usage or {}).get("nodes")) if isinstance(n, dict)]
    queue = [_ticket(t) for t in _list(pool.get("queue")) if isinstance(t, dict)]
    inventory = pool.get("inventory") if isinstance(pool.get("inventory"), dict) else {}
    in_pool = [r for r in rows if r["in_pool"]]
    for_room = sum(t["waiting_for"] is not None for t in queue)
    strategy = pool.get("queue_strategy")
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
            # a GPU start waiting for room on the host waits for the room first
            "waiting_for_gpu": sum(number(t["gpus"]) and t["gpus"] > 0
                                   and t["waiting_for"] is None for t in queue),
            "waiting_for_room": for_room,
            "other": len(rows) - len(in_pool),
        },
        "host": host_view(pool, usage, now),
        "gpus": rows,
        "queue_strategy": strategy if strategy in STRATEGIES else None,  # None: an older hub
        "queue_fair": pool.get("queue_fair") is True,
        "queue": queue,
    }


def read_map(documents: Documents | None, now: float) -> dict[str, Any]:
    """The hub's pool and the watchdogs' readings, merged (blocking: run on a worker
    thread)."""
    if documents is None:
        return map_document(None, None, now, has_state_dir=False)
    return map_document(read_pool(documents), read_usage(documents, now), now)


def _ticket(ticket: dict[str, Any]) -> dict[str, Any]:
    keys = ("position", "owner", "user", "role", "priority", "since", "gpus", "mode",
            "preempting")
    found = {k: ticket.get(k) for k in keys}
    found["victims"] = [v for v in _list(ticket.get("victims")) if isinstance(v, str)]
    found["reserved"] = [u for u in _list(ticket.get("reserved")) if isinstance(u, str)]
    found["cpus"] = _number(ticket.get("cpus"))
    found["memory"] = _number(ticket.get("memory"))
    found["waiting_for"] = _text(ticket.get("waiting_for"))
    return found


# --- the map's words, for the template; sizes, durations and shares are formatting.py's ------


def plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def nodes_text(nodes: list[dict[str, Any]]) -> str:
    """Which watchdogs the figures come from, when more than one measures: "Readings
    from 2 watchdogs: gpu-a (fresh), gpu-b (stale, 2 min old)."; "" for one."""
    if len(nodes) < 2:
        return ""
    parts = [f"{n['node'] or 'a watchdog'} ({n['state']}" + (
        f", {duration(n['age'])} old)" if n["state"] == "stale" and n["age"] is not None
        else ")") for n in nodes]
    return f"Readings from {len(nodes)} watchdogs: {', '.join(parts)}."


def cpus_text(value: Any) -> str:
    """CPUs to two decimals at most, half up: '0.25', '1.5', '60'; '–' when unknown."""
    if not number(value):
        return "–"
    return f"{half_up(value * 100) / 100:.2f}".rstrip("0").rstrip(".")


def amount_text(key: str, value: Any) -> str:
    """A host figure: CPUs for "cpus", a size for "memory"."""
    return cpus_text(value) if key == "cpus" else size(value)


def attr_number(value: Any) -> str:
    """A number for a meter's attributes: a whole number without '.0'."""
    return str(int(value)) if number(value) and value == int(value) else str(value)


def host_text(host: dict[str, Any], waiting: int) -> str:
    """The host section's first line."""
    if host["state"] == "off":
        return ("Host admission is off: the hub starts servers without counting the host's "
                "CPUs and memory, so nothing is reserved; what the servers use is the "
                "watchdog's.")
    if host["state"] != "on":
        return ("No host figures from the hub yet: it writes them with its pool once it "
                "counts the host's CPUs and memory.")
    n = len(host["servers"])
    return (f"{plural(n, 'server')} {'holds' if n == 1 else 'hold'} room on the host; "
            f"{plural(waiting, 'start')} waiting for room.")


def room_text(cpus: Any, memory: Any) -> str:
    """'0.5 CPUs, 512 MiB', or '–'."""
    if not number(cpus):
        return "–"
    return f"{cpus_text(cpus)} CPU{'' if cpus == 1 else 's'}, {size(memory)}"


def queue_text(doc: dict[str, Any]) -> str:
    """The queue's strategy and order, as the spawn page says them: 'Queue: BestEffortFIFO,
    fair between users. Served by priority, then …'; "" when the hub does not say."""
    strategy = doc.get("queue_strategy")
    if not strategy:
        return ""
    fair = doc.get("queue_fair") is True
    order = ORDER if fair else "by priority, then arrival"
    rule = ("nobody behind takes room on the host while a start ahead waits for room, nor "
            "a GPU a start ahead could use" if strategy == STRICT_FIFO else
            "a start that fits is not held up by an older one that does not")
    return (f"Queue: {strategy}{', fair between users' if fair else ''}. Served "
            f"{order}; {rule}.")


def waiting_for_text(ticket: dict[str, Any]) -> str:
    """'room on the host (the host's memory is fully reserved: …)', '2 GPUs' or '–'."""
    if ticket.get("waiting_for"):
        return f"room on the host ({ticket['waiting_for']})"
    gpus = ticket.get("gpus")
    return plural(gpus, "GPU") if number(gpus) and gpus > 0 else "–"


def gpus_text(ticket: dict[str, Any]) -> str:
    """'2 GPUs, exclusive', or 'none' for a CPU-only start."""
    gpus = ticket.get("gpus")
    if not number(gpus) or gpus <= 0:
        return "none"
    return f"{plural(gpus, 'GPU')}, {mode_text(ticket.get('mode'), None)}"


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
        text += ": stopping " + ", ".join(isolate(users.get(v, v)) for v in ticket["victims"])
    if ticket["reserved"]:
        text += "; " + ", ".join(f"GPU {indexes.get(u, u)}" for u in ticket["reserved"]) \
            + " kept for it"
    return text


def user_link(prefix: str, user: str) -> str:
    """The user's usage page; quoted as encodeURIComponent quotes."""
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
    """Shared by the page and the API: admins only, the two files read on the threads, and
    what the template draws the map with."""

    refused = ADMINS_ONLY

    async def document(self) -> dict[str, Any]:
        return await self.blocking(
            lambda: read_map(self.setup.documents(), time.time()))

    def drawing(self, doc: dict[str, Any]) -> dict[str, Any]:
        """The values gpus.html draws ``doc`` with."""
        gpus_where, usage_where = IN_DATABASE if self.setup.database else IN_FOLDER
        users = holder_users(doc)
        indexes = {r["uuid"]: str(r["index"]) for r in doc["gpus"]
                   if isinstance(r.get("uuid"), str) and r.get("index") is not None}
        return dict(
            title="Host map", doc=doc, now=doc["generated_at"],
            no_state=NO_STATE, gpus_file=gpus_where, usage_file=usage_where,
            nodes_text=nodes_text,
            plural=plural, mode_text=mode_text, cpus_text=cpus_text,
            amount_text=amount_text, attr_number=attr_number, host_text=host_text,
            room_text=room_text, waiting_for_text=waiting_for_text, gpus_text=gpus_text,
            queue_text=queue_text,
            user_link=lambda user: user_link(self.prefix, user), holder_users=users,
            preemption_text=lambda t: preemption_text(t, users, indexes), xsrf=self.xsrf(),
            api=self.prefix + "api/gpus")


class GpuPage(GpuMap, PageHandler):
    """GET {prefix}gpus: the map, drawn here, kept live by static/gpus.js."""

    page_title = "Host map"
    scripts = (LIVE_SCRIPT, "gpus.js")

    @web.authenticated
    async def get(self) -> None:
        self.require_admin(ADMINS_ONLY, "host map page")
        self.render_page("gpus.html", **self.drawing(await self.document()))


class GpuApi(GpuMap, ApiHandler):
    """GET {prefix}api/gpus: the map as JSON (map_document), or as the page draws it."""

    unreadable = failed = FAILED

    @web.authenticated
    async def get(self) -> None:
        self.require_admin(ADMINS_ONLY, "host map API")
        doc = await self.document()
        if self.wants_html():
            self.reply_html("gpus.html", **self.drawing(doc))
        else:
            self.reply(doc)


def routes(prefix: str) -> list[tuple[str, type[web.RequestHandler]]]:
    return [(prefix + "gpus", GpuPage), (prefix + "api/gpus", GpuApi)]
