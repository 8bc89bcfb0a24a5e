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

Three documents feed it (usage/documents.py), read on the service's worker threads, never
on the event loop: the hub's pool snapshot (``PoolSnapshot``, gpu/snapshot.py), the
watchdogs' readings (``GpuUsage``, usage/gpu_readings.py, every node's merged into one)
and their homes (``DiskUsage``, one per node), each read as its class's ``from_json``
reads it. ``gpu_map`` returns one row per GPU:
the pool's, in its order, then any other GPU the watchdog sees on the host. Each row has
the pool's fields (``uuid``, ``index``, ``name``, ``memory``, ``state``, ``free_slots``,
``reserved_for``, ``in_pool``) and:

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

``disk_view`` gives the disk: for each node whose watchdog reads the homes, how fresh its
figures are, the mechanism's sentence, the filesystem that holds the homes (its size,
what is used and free, what the homes' sizes reserve of it) and each home (its user
where a server of theirs runs there, what it holds, its size, its share), the figures
only while fresh.

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

from spawner.contract import home_is_full
from spawner.gpu.queue import ORDER, STRATEGIES, STRICT_FIFO
from spawner.gpu.snapshot import OFF, ON, PoolGpu, PoolSnapshot, Waiting
from spawner.usage.documents import (
    GPU_USAGE,
    GPUS,
    HOMES,
    DiskUsage,
    Documents,
    HomeReading,
    number,
)
from spawner.usage.gpu_readings import (
    GpuSample,
    GpuUsage,
    ServerReading,
    read_usage,
    stale_after,
    usage_state,
)
from spawner.webapp.base import LIVE_SCRIPT, ApiHandler, BaseHandler, PageHandler
from spawner.webapp.formatting import duration, half_up, isolate, percent, size

POLL_SECONDS = 2.0
ADMINS_ONLY = ("The host map is for admins only: it names everyone who holds a GPU or "
               "room on the host. Your own server's GPU is shown on the hub's home page.")
NO_STATE = ("This service was given neither the ledger's database (QUOTA_SPAWNER_USAGE_DB) "
            "nor the hub's state folder (QUOTA_SPAWNER_STATE_DIR), where the hub and the "
            "watchdogs publish what the host map shows.")
# where the map's documents are, in the sentences that say one is missing
IN_DATABASE = ("the hub's snapshot in the ledger's database",
               "the watchdogs' readings in the ledger's database",
               "the watchdogs' homes in the ledger's database")
IN_FOLDER = (f"{GPUS.file} in the state folder", f"{GPU_USAGE.file} in the state folder",
             f"{HOMES.file} in the state folder")
NEARLY_FULL = 0.90  # a home's share at or above which the map marks it, as the watchdog tells
FAILED = ("The host map could not be read because of an error; the service's log has the "
          "details.")


# --- the merge -------------------------------------------------------------------------------


def gpu_map(pool: PoolSnapshot | dict[str, Any] | None,
            usage: GpuUsage | dict[str, Any] | None, now: float) -> list[dict[str, Any]]:
    """One row per GPU, the pool's holders with the watchdog's numbers (module doc); each
    document as read (``PoolSnapshot``, ``GpuUsage``) or as its JSON."""
    found = PoolSnapshot.from_json(pool)
    watched = GpuUsage.from_json(usage)
    state = usage_state(watched, now)
    data = watched if state == "fresh" else None
    numbers = data.gpus if data is not None else {}
    servers = data.servers if data is not None else {}
    idle: dict[str, dict[str, float | None]] = {}  # uuid -> server -> since
    for incident in data.idle if data is not None else []:
        idle.setdefault(incident.uuid, {})[incident.server or ""] = incident.since
    rows = []
    seen = set()
    for gpu in (found.gpus or ()) if found is not None else ():
        seen.add(gpu.uuid)
        rows.append(_row(gpu, True, numbers.get(gpu.uuid or ""), servers,
                         idle.get(gpu.uuid or "", {}), state))
    for uuid, sample in sorted(numbers.items(), key=lambda kv: _index_key(kv[1])):
        if uuid in seen or uuid.startswith("unknown:"):
            continue
        gpu = PoolGpu(uuid, None if sample.index < 0 else str(sample.index), sample.name,
                      sample.memory_total, state="unknown")
        rows.append(_row(gpu, False, sample, servers, idle.get(uuid, {}), state))
    return rows


def _row(gpu: PoolGpu, in_pool: bool, sample: GpuSample | None,
         servers: dict[str, ServerReading], idle: dict[str, float | None],
         state: str) -> dict[str, Any]:
    uuid = gpu.uuid or ""
    holders = []
    held_idle: dict[str, float | None] = {}  # the incidents of this GPU's holders
    for holder in gpu.holders:
        owner = holder.owner
        server = servers.get(owner) if owner is not None else None
        memory = server.gpu_memory.get(uuid, 0) if server is not None else None
        if owner in idle:
            held_idle[owner] = idle[owner]
        holders.append({**holder.to_json(), "gpu_memory": memory, "idle": owner in idle})
    since = [s for s in held_idle.values() if number(s)]
    return {
        "uuid": gpu.uuid, "index": gpu.index, "name": gpu.name,
        "memory": gpu.memory, "state": gpu.state,
        "free_slots": gpu.free_slots, "reserved_for": gpu.reserved_for,
        "in_pool": in_pool,
        "usage": state if sample is not None or state != "fresh" else "missing",
        "utilization": sample.utilization if sample else None,
        "memory_used": sample.memory_used if sample else None,
        "memory_total": sample.memory_total if sample else None,
        "lost": sample.lost if sample else None,
        "idle": bool(held_idle),
        "idle_since": min(since) if since else None,
        "holders": holders,
    }


def host_view(pool: PoolSnapshot | dict[str, Any] | None,
              usage: GpuUsage | dict[str, Any] | None, now: float) -> dict[str, Any]:
    """The host's CPUs and memory: the hub's reservations, the watchdog's use (module doc);
    each document as read, or as its JSON."""
    found = PoolSnapshot.from_json(pool)
    host = found.host if found is not None else None
    state = found.host_state if found is not None else "missing"
    watched = GpuUsage.from_json(usage)
    usage_seen = usage_state(watched, now)
    fresh = watched if usage_seen == "fresh" else None
    totals = fresh.host_totals if fresh is not None else None
    seen_by_name = fresh.servers if fresh is not None else {}
    servers = []
    for row in host.servers if host is not None else ():
        seen = seen_by_name.get(row.owner) if row.owner is not None else None
        servers.append({
            "owner": row.owner,
            # a server adopted after a hub restart is named by its labels, as the
            # watchdog reads them
            "user": row.user or (seen.user if seen else None),
            "role": row.role or (seen.role if seen else None),
            "cpus": row.cpus, "memory": row.memory,
            "cpu_used": seen.cpu_used if seen else None,
            "memory_used": seen.memory_used if seen else None,
        })
    engine = None
    if totals is not None and totals.engine_cpus is not None:
        engine = {"cpus": totals.engine_cpus, "memory": totals.engine_memory}
    return {
        "state": state if state in (ON, OFF) else "missing",
        "cpus": host.cpus if host else None, "memory": host.memory if host else None,
        "kept_cpus": host.kept_cpus if host else None,
        "kept_memory": host.kept_memory if host else None,
        "cpu_ratio": host.cpu_ratio if host else None,
        "memory_ratio": host.memory_ratio if host else None,
        "share": host.share.to_json() if host and host.share else None,
        "reserved": host.reserved.to_json() if host and host.reserved else None,
        "usage": usage_seen if usage_seen != "fresh" or totals is not None else "missing",
        "used": None if totals is None else {
            "cpus": totals.cpu_used, "memory": totals.memory_used,
            "servers": totals.servers},
        "engine": engine,
        "servers": servers,
    }


def disk_view(homes: list[DiskUsage | dict[str, Any]], now: float) -> dict[str, Any]:
    """The homes and their filesystems, one entry per node by name (module doc); each
    node's document as read (``DiskUsage``), or as its JSON. ``state``: "fresh" when some
    node's figures are, "stale" when none is, "missing" without any."""
    nodes = []
    for usage in sorted((u for u in map(DiskUsage.from_json, homes) if u is not None),
                        key=lambda u: u.node):
        state = usage.state(now)
        fresh = state == "fresh"
        filesystem = usage.filesystem if fresh else None
        nodes.append({
            "node": usage.node, "state": state, "time": usage.at,
            "age": max(0.0, now - usage.at), "interval": usage.interval,
            "stale_after": stale_after(usage.interval), "mechanism": usage.mechanism,
            "enforced": usage.enforced, "sentence": usage.sentence,
            "filesystem": filesystem.to_json() if filesystem is not None else None,
            "homes": [home_row(h) for h in usage.homes] if fresh else [],
        })
    state = "missing" if not nodes else "fresh" if any(
        n["state"] == "fresh" for n in nodes) else "stale"
    return {"state": state, "nodes": nodes}


def home_row(home: HomeReading) -> dict[str, Any]:
    """One home as the map and the API show it: what its document says, and its
    ``share`` of its size (None without a size), ``full`` and ``nearly_full``."""
    share = home.used / home.limit if home.used is not None and home.limit else None
    full = share is not None and home_is_full(home.used, home.limit)
    return {**home.to_json(), "share": share, "full": full,
            "nearly_full": share is not None and not full and share >= NEARLY_FULL}


def _index_key(sample: GpuSample) -> tuple[int, str]:
    return (sample.index if sample.index >= 0 else 1 << 30,
            str(sample.index if sample.index >= 0 else None))


# --- the document ----------------------------------------------------------------------------


def map_document(pool: PoolSnapshot | dict[str, Any] | None,
                 usage: GpuUsage | dict[str, Any] | None, now: float,
                 has_state_dir: bool = True,
                 homes: list[DiskUsage | dict[str, Any]] | None = None) -> dict[str, Any]:
    """What the page shows, as JSON: the merged rows, the queue, the documents'
    freshness and a summary, and the disk (``homes``: every node's homes document); each
    document as read, or as its JSON. Times are epoch seconds, memory and disk bytes,
    utilisation 0 to 1."""
    found = PoolSnapshot.from_json(pool)
    watched = GpuUsage.from_json(usage)
    rows = gpu_map(found, watched, now)
    state = usage_state(watched, now)
    watchdog: dict[str, Any] = {"state": state, "time": None, "age": None, "interval": None,
                                "stale_after": None, "host": None}
    if watched is not None:
        watchdog.update(time=watched.time, age=max(0.0, now - watched.time),
                        interval=watched.interval, host=watched.host,
                        stale_after=stale_after(watched.interval))
    # each watchdog's node (one per node on a cluster), in the freshness line
    watchdog["nodes"] = [{"node": n.node, "state": n.state, "age": max(0.0, now - n.time)}
                         for n in (watched.nodes if watched is not None else [])]
    queue = [_ticket(t) for t in found.queue] if found is not None else []
    in_pool = [r for r in rows if r["in_pool"]]
    for_room = sum(t["waiting_for"] is not None for t in queue)
    strategy = found.queue_strategy if found is not None else None
    return {
        "generated_at": now,
        "poll_seconds": POLL_SECONDS,
        "state_dir": has_state_dir,
        "pool": {"state": "ok" if found is not None else "missing",
                 "time": found.time if found is not None else None,
                 "hub": found.hub if found is not None else None,
                 "inventory": {"source": found.source if found is not None else None,
                               "reason": found.reason if found is not None else None}},
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
        "host": host_view(found, watched, now),
        "disk": disk_view(homes or [], now),
        "gpus": rows,
        "queue_strategy": strategy if strategy in STRATEGIES else None,  # None: an older hub
        "queue_fair": found.queue_fair if found is not None else False,
        "queue": queue,
    }


def read_map(documents: Documents | None, now: float) -> dict[str, Any]:
    """The hub's pool and the watchdogs' readings, merged (blocking: run on a worker
    thread)."""
    if documents is None:
        return map_document(None, None, now, has_state_dir=False)
    return map_document(PoolSnapshot.read(documents), read_usage(documents, now), now,
                        homes=DiskUsage.read_all(documents))


def _ticket(ticket: Waiting) -> dict[str, Any]:
    """A queue row as the page and the API show it."""
    found = ticket.to_json()
    for key in ("user_servers", "behind"):
        del found[key]
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


def disk_text(node: dict[str, Any]) -> str:
    """A node's first line of the disk: how fresh, and the homes' marks."""
    where = f"{node['node']}: the" if node["node"] else "The"
    if node["state"] == "stale":
        return (f"{where} watchdog's figures of the homes are {duration(node['age'])} old, too "
                f"old to trust (more than {duration(node['stale_after'])}): the homes' use "
                "and the filesystem are left out until it reads them again. Is the watchdog "
                "running?")
    homes = node["homes"]
    full = sum(h["full"] for h in homes)
    nearly = sum(h["nearly_full"] for h in homes)
    marks = "".join(
        f"; {count} {what}" for count, what in ((full, "full"), (nearly, "nearly full (90% "
                                                 "or more of its size)")) if count)
    return (f"{where} watchdog's figures of the homes are {duration(node['age'])} old (it "
            f"reads them every {duration(node['interval'])}). {plural(len(homes), 'home')}"
            f"{marks}.")


def reserved_text(filesystem: dict[str, Any]) -> str:
    """'2.5 TiB (125% of the filesystem)', or '–'."""
    reserved, size_of = filesystem.get("reserved"), filesystem.get("size")
    if not number(reserved):
        return "–"
    return size(reserved) + (f" ({percent(reserved / size_of)} of the filesystem)"
                             if number(size_of) and size_of else "")


def home_text(home: dict[str, Any]) -> str:
    """'3 GiB of 20 GiB (15%)', '3 GiB (no size)', or '–'."""
    if not number(home.get("used")):
        return "–"
    if not number(home.get("limit")):
        return f"{size(home['used'])} (no size)"
    return f"{size(home['used'])} of {size(home['limit'])} ({percent(home['share'])})"


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
        gpus_where, usage_where, homes_where = IN_DATABASE if self.setup.database \
            else IN_FOLDER
        users = holder_users(doc)
        indexes = {r["uuid"]: str(r["index"]) for r in doc["gpus"]
                   if isinstance(r.get("uuid"), str) and r.get("index") is not None}
        return dict(
            title="Host map", doc=doc, now=doc["generated_at"],
            no_state=NO_STATE, gpus_file=gpus_where, usage_file=usage_where,
            homes_file=homes_where, nodes_text=nodes_text, disk_text=disk_text,
            reserved_text=reserved_text, home_text=home_text,
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
