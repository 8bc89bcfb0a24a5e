"""The hub's responsiveness while the shared state is written and read: the state folder's
files (as before the ledger held them), SQLite and PostgreSQL, in one run.

The scenario: 200 running servers on 8 GPUs, two watchdogs sending the readings of 4
GPUs each every 5 s, the usage service drawing the host map every 2 s, and a client
asking the hub's REST API 20 times a second. Per backend, five processes:

- the hub: one asyncio/tornado event loop holding a real ``GpuPool`` (8 DECLARED GPUs,
  no NVML; host admission on) with 200 servers holding room, 8 of them a whole GPU each
  and the rest CPU-only, a real ``EventLog`` (the ledger's ``events`` table through
  ``event_store.append_one``, or the state folder's ``quota-spawner-events.jsonl``) and
  the pool publishing its snapshot through ``EventLog.save(documents, GPUS, text)``, as
  spawner/docker/runtime.py wires them. A churn task on the loop stops a server and
  starts another user's in its place every 200 ms (``release``, ``join``, ``leave``, as
  the spawner does), appending the two events of a start that waited in the queue (``queued``,
  ``queue-granted``), so the snapshot is published about once a second and events flow.
  On the same loop a tornado handler stands for ``GET /hub/api/users``: it builds the
  200 user models (JupyterHub's shape, with each user's server) as JSON per request;
- two watchdogs (``FakeReadings``: no NVML, no engine): every 5 s each writes its node's
  ``GPU_USAGE`` document, shaped like ``gpu_usage_snapshot``'s output (4 GPUs, the 100
  servers of its node: 200 between them), and reads the hub's new events as the real
  one does (``read_new_rows``, which claims them with ``claim_after``; ``read_new`` on
  the file). The two start half a cycle apart;
- the usage service: ``read_map`` (the pool's snapshot and every node's readings,
  merged) every 2 s through the backend's ``Documents``;
- the client: ``GET /hub/api/users`` 20 times a second on a fixed schedule (a slow
  answer does not delay the next request), one connection per request.

Everything runs from the start; what counts is a window after a warm-up. Reported per
backend: the API's p50, p99 and max (ms) and the p99's ratio to the files'; snapshot
publishes and events written per second; the watchdogs' write time p99 and the map's
read time p99 (and their ratios to the files'). Below that, the details: the hub
loop's lag (a 50 ms timer, how late), the pool's snapshot write on the event log's
thread, the watchdogs' event reads, and what the last map saw (GPUs, fresh nodes,
servers). With the files, both watchdogs write the one ``quota-spawner-gpu-usage.json``
(``FolderDocuments`` keeps one file per kind), so the map sees one node at a time, as
before the ledger held the readings; and each watchdog reads every event of the file,
where in the table each event is claimed by one. On a machine shared with other work the
p99s move from run to run by as much as the backends differ: run it more than once
before reading a ratio.

The SQLite ledger and the files live in a temporary folder; PostgreSQL is a fresh
database in the private test server (scripts/test-postgres.sh; its URL in
/run/quota-spawner-test/postgres/url, or $QUOTA_SPAWNER_TEST_POSTGRES, or --postgres),
dropped at the end. Without a server that answers, its column is skipped.

    .venv/bin/python bench/state_bench.py              # 40 s per backend: under 2.5 minutes
    .venv/bin/python bench/state_bench.py --quick      # 6 s per backend: under 30 s
    .venv/bin/python bench/state_bench.py --backends files,sqlite --window 60
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import logging
import multiprocessing
import os
import platform
import queue
import random
import shutil
import sqlite3
import sys
import tempfile
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sqlalchemy import create_engine, func, select, text  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402

from spawner.gpu.inventory import declared_inventory  # noqa: E402
from spawner.gpu.pool import GpuPool, Server  # noqa: E402
from spawner.host.admission import HostBook, HostCapacity  # noqa: E402
from spawner.quota.model import Role  # noqa: E402
from spawner.usage import event_store  # noqa: E402
from spawner.usage.documents import (  # noqa: E402
    GPU_USAGE,
    GPUS,
    DatabaseDocuments,  # noqa: E402
    Document,
    Documents,
    FolderDocuments,
    Kind,
)
from spawner.usage.event_log import EVENTS_FILE, EventLog  # noqa: E402
from spawner.usage.ledger import Ledger  # noqa: E402
from spawner.usage.schema import event_claims, events  # noqa: E402
from spawner.watchdog.hub_events import read_new, read_new_rows  # noqa: E402
from spawner.webapp.gpus import read_map  # noqa: E402

HUB_ID = "state-bench"
GiB = 2**30
GPU_MEMORY = 80 * GiB
URL_FILE = Path("/run/quota-spawner-test/postgres/url")
BACKENDS = ("files", "sqlite", "postgresql")
CPU_ROLE = Role(name="cpu", cpus=1, memory=2 * GiB, images=("base",))
GPU_ROLE = Role(name="gpu", cpus=8, memory=32 * GiB, images=("pytorch",), gpus=1)
HOST = HostCapacity(cpus=128, memory=1 << 40)  # room for the 200 with some to spare
LAG_TICK = 0.05  # seconds: the hub loop's lag timer
log = logging.getLogger("state_bench")


def pct(values: list[float], q: float) -> float:
    """The q-quantile, nearest rank (bench/baseline.py's, without its DockerSpawner import)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else 0.0


def owner_of(slot: int) -> str:
    return f"jupyter-user{slot:03d}"


def gpu_uuid(index: int) -> str:
    return f"GPU-{index:08d}-bench-0000-0000-000000000000"


# --- the hub ---------------------------------------------------------------------------


class TimedDocuments:
    """The hub's ``Documents``, each write timed (on the event log's thread)."""

    def __init__(self, documents: Documents):
        self.documents = documents
        self.writes: list[tuple[float, float, str]] = []  # (end, seconds, kind)

    def write(self, kind: Kind, text: str, node: str = "") -> None:
        began = time.perf_counter()
        self.documents.write(kind, text, node)
        self.writes.append((time.time(), time.perf_counter() - began, kind.name))

    def read(self, kind: Kind, node: str = "") -> Document | None:
        return self.documents.read(kind, node)

    def read_all(self, kind: Kind) -> list[Document]:
        return self.documents.read_all(kind)


def iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat().replace("+00:00", "Z")


def user_models(pool: GpuPool) -> list[dict[str, Any]]:
    """What ``GET /hub/api/users`` answers: one model per user, with its default server."""
    now = time.time()
    found = []
    for owner, server in sorted(pool.servers.items()):
        url = f"/user/{server.user}/"
        found.append({
            "kind": "user", "name": server.user, "admin": False, "roles": ["user"],
            "groups": ["class-a" if hash(server.user) % 2 else "class-b"],
            "server": url, "pending": None, "created": iso(server.started - 86400),
            "last_activity": iso(now - 30),
            "servers": {"": {
                "name": "", "ready": True, "stopped": False, "pending": None, "url": url,
                "progress_url": f"/hub/api/users/{server.user}/server/progress",
                "started": iso(server.started), "last_activity": iso(now - 30),
                "state": {"object_name": owner, "object_id": owner[-12:]},
                "user_options": {"role": server.role, "image": "base"}}},
        })
    return found


async def hub(url: str, folder: str, args: argparse.Namespace,
              ready: Any, results: Any, stop: Any) -> None:
    from tornado.httpserver import HTTPServer
    from tornado.netutil import bind_sockets
    from tornado.web import Application, RequestHandler

    ledger = Ledger(url, log) if url else None  # creates the schema, as the hub does
    if ledger is not None:
        documents: Documents = DatabaseDocuments(ledger.engine, HUB_ID,
                                                 fallback=FolderDocuments(folder))
        event_log = EventLog("", log, store=functools.partial(event_store.append_one,
                                                              ledger.engine))
    else:
        documents = FolderDocuments(folder)
        event_log = EventLog(os.path.join(folder, EVENTS_FILE), log)
    timed = TimedDocuments(documents)
    inventory = declared_inventory([{"uuid": gpu_uuid(i), "name": "NVIDIA H100 80GB HBM3",
                                     "memory": str(GPU_MEMORY)} for i in range(args.gpus)])
    pool = GpuPool(inventory, HUB_ID, log, events=event_log,
                   publish=functools.partial(event_log.save, timed, GPUS))
    pool.set_host(HostBook(HOST))
    pool.roles = {CPU_ROLE.name: CPU_ROLE, GPU_ROLE.name: GPU_ROLE}

    def start(slot: int, user: int) -> tuple[str, ...]:
        """User ``user``'s server in ``slot`` (a GPU holder's below ``--gpus``): its GPUs."""
        owner, role = owner_of(user), GPU_ROLE if slot < args.gpus else CPU_ROLE
        ticket = pool.join(owner, Server(f"user{user:03d}", role.name, time.time()), role)
        assert ticket.grant.done(), f"{owner} was not served at once"
        pool.leave(owner, "served")
        return ticket.grant.result()

    running = list(range(args.servers))  # slot -> the user whose server runs there
    for slot, user in enumerate(running):
        start(slot, user)
    appended: list[float] = []
    lags: list[tuple[float, float]] = []

    async def churn() -> None:
        """A server stops and another user's starts in its place, every ``--churn``."""
        rng = random.Random(7)
        while True:
            await asyncio.sleep(args.churn)
            slot = rng.randrange(args.servers)
            pool.release(owner_of(running[slot]), "stopped by its user")
            user = running[slot] = max(running) + 1
            role = GPU_ROLE if slot < args.gpus else CPU_ROLE
            common = dict(hub=HUB_ID, user=f"user{user:03d}", role=role.name,
                          priority=role.priority, container=owner_of(user))
            event_log.append("queued", **common, position=1)
            uuids = start(slot, user)
            event_log.append("queue-granted", **common, waited=round(rng.random(), 1),
                             gpus=list(uuids))
            appended.extend((time.time(), time.time()))

    async def lag() -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + LAG_TICK
            await asyncio.sleep(LAG_TICK)
            lags.append((time.time(), loop.time() - due))

    class Users(RequestHandler):
        def get(self) -> None:
            self.set_header("Content-Type", "application/json")
            self.finish(json.dumps(user_models(pool)))

    sockets = bind_sockets(0, "127.0.0.1")
    server = HTTPServer(Application([(r"/hub/api/users", Users)]))
    server.add_sockets(sockets)
    tasks = [asyncio.ensure_future(churn()), asyncio.ensure_future(lag())]
    ready.put(("hub", sockets[0].getsockname()[1]))
    await asyncio.to_thread(stop.wait)  # the multiprocessing Event, on a thread
    for task in tasks:
        task.cancel()
    server.stop()
    pool.close()
    await asyncio.to_thread(event_log.flush)
    stored, claimed = await asyncio.to_thread(count_events, ledger, folder)
    results.put(("hub", {"writes": timed.writes, "appended": appended, "lags": lags,
                         "stored": stored, "claimed": claimed,
                         "total_appended": len(appended)}))


def count_events(ledger: Ledger | None, folder: str) -> tuple[int, int | None]:
    """The events the log holds at the end, and how many the watchdogs claimed."""
    if ledger is None:
        with open(os.path.join(folder, EVENTS_FILE), "rb") as f:
            return sum(1 for _ in f), None
    with ledger.engine.connect() as c:
        stored = c.execute(select(func.count()).select_from(events)).scalar() or 0
        claimed = c.execute(select(func.count()).select_from(event_claims)).scalar()
    ledger.dispose()
    return stored, claimed


def run_hub(*a: Any) -> None:
    asyncio.run(hub(*a))


# --- the watchdogs -------------------------------------------------------------------


class FakeReadings:
    """One node's readings, shaped like watchdog/app.py's ``gpu_usage_snapshot``: its
    GPUs (declared, as the hub's) and its servers, with numbers that move."""

    def __init__(self, node: int, args: argparse.Namespace):
        per = args.gpus // args.watchdogs
        self.node = f"gpu-node-{node}"
        self.gpus = list(range(node * per, (node + 1) * per))
        self.slots = [s for s in range(args.servers)
                      if (s // per if s < args.gpus else s % args.watchdogs) == node]
        self.holders = args.gpus  # slots 0..gpus-1 hold a GPU each (the one of their number)
        self.interval = args.interval
        self.rng = random.Random(node)

    def text(self) -> str:
        r = self.rng
        servers = {}
        for slot in self.slots:
            gpus = [gpu_uuid(slot)] if slot < self.holders else []
            role = GPU_ROLE if gpus else CPU_ROLE
            servers[owner_of(slot)] = {
                "user": f"user{slot:03d}", "role": role.name, "gpus": gpus,
                "gpu_memory": {u: r.randrange(GPU_MEMORY) for u in gpus},
                "cpus": role.cpus, "memory": role.memory,
                "cpu_used": round(r.random() * role.cpus, 3),
                "memory_used": r.randrange(role.memory)}
        cpu_used = sum(s["cpu_used"] for s in servers.values())
        memory_used = sum(s["memory_used"] for s in servers.values())
        data = {
            "version": 1, "time": time.time(), "host": self.node, "interval": self.interval,
            "gpus": {gpu_uuid(i): {"index": i, "name": "NVIDIA H100 80GB HBM3",
                                   "utilization": round(r.random(), 2),
                                   "memory_used": r.randrange(GPU_MEMORY),
                                   "memory_total": GPU_MEMORY, "lost": None}
                     for i in self.gpus},
            "servers": servers,
            "idle": [],
            "host_totals": {"servers": len(servers),
                            "cpus": sum(s["cpus"] for s in servers.values()),
                            "memory": sum(s["memory"] for s in servers.values()),
                            "cpu_used": round(cpu_used, 3), "memory_used": memory_used,
                            "engine_cpus": 64, "engine_memory": 512 * GiB},
            "node": self.node,
        }
        return json.dumps(data, sort_keys=True)


def run_watchdog(node: int, url: str, folder: str, args: argparse.Namespace,
                 ready: Any, results: Any, stop: Any) -> None:
    readings = FakeReadings(node, args)
    if url:
        engine = Ledger(url, log, create=False).engine  # as the watchdog opens it
        documents: Documents = DatabaseDocuments(engine, HUB_ID)
        where = f"the events table of {make_url(url).render_as_string()}"

        def read(cursor: Any) -> tuple[list[dict[str, Any]], Any]:
            return read_new_rows(engine, where, cursor, readings.node)
    else:
        documents = FolderDocuments(folder)  # quota-spawner-gpu-usage.json: one file

        def read(cursor: Any) -> tuple[list[dict[str, Any]], Any]:
            return read_new(os.path.join(folder, EVENTS_FILE), cursor)

    _, cursor = read(None)  # the first read: a cursor at the end, as a starting watchdog's
    ready.put(("watchdog", node))
    writes, reads = [], []
    due = time.monotonic() + node * args.interval / args.watchdogs
    while not stop.wait(max(0.0, due - time.monotonic())):
        due += args.interval
        began = time.perf_counter()
        found, cursor = read(cursor)
        reads.append((time.time(), time.perf_counter() - began, len(found)))
        text_ = readings.text()
        began = time.perf_counter()
        documents.write(GPU_USAGE, text_, node=readings.node)
        writes.append((time.time(), time.perf_counter() - began, len(text_)))
    results.put(("watchdog", {"writes": writes, "reads": reads}))


# --- the usage service and the client --------------------------------------------------


def run_webapp(url: str, folder: str, args: argparse.Namespace, ready: Any,
                      results: Any, stop: Any) -> None:
    folder_docs = FolderDocuments(folder)
    documents: Documents = folder_docs
    if url:
        engine = Ledger(url, log, create=False).engine
        documents = DatabaseDocuments(engine, HUB_ID, fallback=folder_docs)
    ready.put(("usage", 0))
    maps = []
    due = time.monotonic()
    while not stop.wait(max(0.0, due - time.monotonic())):
        due += args.map_interval
        began = time.perf_counter()
        drawn = read_map(documents, time.time())
        took = time.perf_counter() - began
        fresh = sum(n["state"] == "fresh" for n in drawn["watchdog"]["nodes"]) or \
            int(drawn["watchdog"]["state"] == "fresh")
        maps.append((time.time(), took, drawn["summary"]["total"], fresh,
                     len(drawn["host"]["servers"])))
    results.put(("usage", {"maps": maps}))


async def client(port: int, args: argparse.Namespace, ready: Any, results: Any,
                 stop: Any) -> None:
    from tornado.httpclient import AsyncHTTPClient

    http = AsyncHTTPClient(force_instance=True, max_clients=50)
    target = f"http://127.0.0.1:{port}/hub/api/users"
    latencies: list[tuple[float, float, int]] = []
    pending: set[asyncio.Task[None]] = set()

    async def one() -> None:
        sent, began = time.time(), time.perf_counter()
        try:
            response = await http.fetch(target, raise_error=False, request_timeout=30)
            size = len(json.loads(response.body)) if response.code == 200 else -response.code
        except OSError:  # the hub already gone at the end (after the window)
            size = -1
        latencies.append((sent, time.perf_counter() - began, size))

    ready.put(("client", 0))
    loop = asyncio.get_running_loop()
    due = loop.time()
    while not stop.is_set():
        task = asyncio.ensure_future(one())
        pending.add(task)
        task.add_done_callback(pending.discard)
        due += 1 / args.rate
        await asyncio.sleep(max(0.0, due - loop.time()))
    if pending:
        await asyncio.wait(pending, timeout=30)
    http.close()
    results.put(("client", {"latencies": latencies}))


def run_client(*a: Any) -> None:
    asyncio.run(client(*a))


# --- one backend -----------------------------------------------------------------------


def postgres_server(given: str) -> str:
    return given or os.environ.get("QUOTA_SPAWNER_TEST_POSTGRES") or (
        URL_FILE.read_text().strip() if URL_FILE.exists() else "")


def postgres_versions(server: str) -> str:
    engine = create_engine(server)
    try:
        with engine.connect() as c:
            version = c.execute(text("SHOW server_version")).scalar()
            fsync = c.execute(text("SHOW fsync")).scalar()
            sync = c.execute(text("SHOW synchronous_commit")).scalar()
        return f"PostgreSQL {version} (fsync {fsync}, synchronous_commit {sync})"
    finally:
        engine.dispose()


def create_database(server: str) -> tuple[str, str]:
    """A new database in the server, as tests/postgres.py makes one: (its URL, its name)."""
    name = f"qs_bench_{uuid.uuid4().hex[:12]}"
    admin = create_engine(make_url(server), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as c:
            c.execute(text(f'CREATE DATABASE "{name}"'))
    finally:
        admin.dispose()
    return make_url(server).set(database=name).render_as_string(hide_password=False), name


def drop_database(server: str, name: str) -> None:
    admin = create_engine(make_url(server), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()


def run_backend(backend: str, url: str, args: argparse.Namespace) -> dict[str, Any]:
    """Start the five processes, let them run the warm-up and the window, and gather what
    each measured; the figures are those of the window."""
    folder = tempfile.mkdtemp(prefix=f"state-bench-{backend}-")
    if backend == "sqlite":
        url = f"sqlite:///{folder}/quota-spawner-usage.sqlite"
    ctx = multiprocessing.get_context("fork")  # nothing runs in this process's threads
    ready, results, stop = ctx.Queue(), ctx.Queue(), ctx.Event()
    processes = []

    def start(target: Any, *a: Any) -> None:
        process = ctx.Process(target=target, args=a, daemon=True)
        process.start()
        processes.append(process)

    try:
        start(run_hub, url, folder, args, ready, results, stop)
        ((_, port),) = wait_for(ready, processes, 1)
        for node in range(args.watchdogs):
            start(run_watchdog, node, url, folder, args, ready, results, stop)
        start(run_webapp, url, folder, args, ready, results, stop)
        start(run_client, port, args, ready, results, stop)
        wait_for(ready, processes, args.watchdogs + 2)
        time.sleep(args.warmup)
        t0 = time.time()
        time.sleep(args.window)
        t1 = time.time()
        stop.set()
        found: dict[str, list[dict[str, Any]]] = {}
        for kind, data in wait_for(results, processes, len(processes)):
            found.setdefault(kind, []).append(data)
        for process in processes:
            process.join(timeout=30)
    finally:
        stop.set()
        for process in processes:
            if process.is_alive():
                process.terminate()
                process.join(timeout=10)
        shutil.rmtree(folder, ignore_errors=True)
    return summarize(found, t0, t1)


def wait_for(messages: Any, processes: list[Any], count: int) -> list[Any]:
    """``count`` messages from the processes; fails when one of them died first."""
    got: list[Any] = []
    deadline = time.monotonic() + 120
    while len(got) < count:
        try:
            got.append(messages.get(timeout=0.5))
        except queue.Empty:
            dead = [p.name for p in processes if p.exitcode not in (None, 0)]
            if dead or time.monotonic() > deadline:
                raise RuntimeError(f"the bench's processes failed ({', '.join(dead)}) "
                                   "or never answered; their errors are above") from None
    return got


def summarize(found: dict[str, list[dict[str, Any]]], t0: float,
              t1: float) -> dict[str, Any]:
    def inside(rows: list[tuple]) -> list[tuple]:
        return [r for r in rows if t0 <= r[0] <= t1]

    span = t1 - t0
    hub_ = found["hub"][0]
    api = inside(found["client"][0]["latencies"])
    wd_writes = [r for w in found["watchdog"] for r in inside(w["writes"])]
    wd_reads = [r for w in found["watchdog"] for r in inside(w["reads"])]
    maps = inside(found["usage"][0]["maps"])
    gpus_writes = [r for r in inside(hub_["writes"]) if r[2] == GPUS.name]
    return {
        "api": [r[1] for r in api],
        "api_bad": sum(r[2] < 0 for r in api),
        "api_users": min((r[2] for r in api), default=0),
        "publishes": len(gpus_writes) / span,
        "publish_write": [r[1] for r in gpus_writes],
        "events": len(inside([(t,) for t in hub_["appended"]])) / span,
        "stored": hub_["stored"], "total_appended": hub_["total_appended"],
        "claimed": hub_["claimed"],
        "lag": [r[1] for r in inside(hub_["lags"])],
        "wd_write": [r[1] for r in wd_writes],
        "wd_size": max((r[2] for r in wd_writes), default=0),
        "wd_read": [r[1] for r in wd_reads],
        "wd_told": sum(r[2] for r in wd_reads) / span,
        "map_read": [r[1] for r in maps],
        "map_last": maps[-1][2:] if maps else (0, 0, 0),  # GPUs, fresh nodes, servers
        "span": span,
    }


# --- the report ------------------------------------------------------------------------


def filesystem(path: str) -> str:
    """The file system type of the folder ``path`` is in (from /proc/mounts)."""
    best, kind = "", "?"
    try:
        with open("/proc/mounts", encoding="utf-8") as f:
            for line in f:
                parts = line.split()
                if len(parts) > 2 and path.startswith(parts[1]) and len(parts[1]) > len(best):
                    best, kind = parts[1], parts[2]
    except OSError:
        pass
    return kind


def ms(value: float) -> str:
    return f"{value * 1000:.1f}"


def ratio(value: float, base: float | None) -> str:
    return f"{value / base:.2f}x" if base else "–"


def report(done: dict[str, dict[str, Any]]) -> None:
    names = list(done)
    base = done.get("files")

    def row(label: str, values: list[str]) -> None:
        print(f"  {label:<42}" + "".join(f"{v:>15}" for v in values))

    def p99(key: str, name: str) -> float:
        return pct(done[name][key], 0.99)

    row("", names)
    row("hub API requests in the window", [str(len(done[n]["api"])) for n in names])
    row("hub API p50 ms", [ms(pct(done[n]["api"], 0.50)) for n in names])
    row("hub API p99 ms", [ms(p99("api", n)) for n in names])
    row("hub API max ms", [ms(max(done[n]["api"], default=0)) for n in names])
    row("hub API p99 / files' p99", [ratio(p99("api", n), base and pct(base["api"], 0.99))
                                     for n in names])
    row("snapshot publishes /s", [f"{done[n]['publishes']:.2f}" for n in names])
    row("events written /s", [f"{done[n]['events']:.1f}" for n in names])
    row("watchdog write p99 ms", [ms(p99("wd_write", n)) for n in names])
    row("  / files' p99", [ratio(p99("wd_write", n), base and pct(base["wd_write"], 0.99))
                           for n in names])
    row("map read p99 ms", [ms(p99("map_read", n)) for n in names])
    row("  / files' p99", [ratio(p99("map_read", n), base and pct(base["map_read"], 0.99))
                           for n in names])
    print("  details")
    row("hub loop lag p99 ms (50 ms timer)", [ms(p99("lag", n)) for n in names])
    row("hub loop lag max ms", [ms(max(done[n]["lag"], default=0)) for n in names])
    row("snapshot write p99 ms (log thread)", [ms(p99("publish_write", n)) for n in names])
    row("events appended/stored/claimed, in all",
        [f"{done[n]['total_appended']}/{done[n]['stored']}/"
         f"{'-' if done[n]['claimed'] is None else done[n]['claimed']}" for n in names])
    row("watchdog event read p99 ms", [ms(p99("wd_read", n)) for n in names])
    row("events read by watchdogs /s", [f"{done[n]['wd_told']:.1f}" for n in names])
    row("watchdog writes, readings KiB", [f"{len(done[n]['wd_write'])}, "
                                          f"{done[n]['wd_size'] / 1024:.0f}" for n in names])
    row("map reads; last: GPUs, fresh nodes, servers",
        [f"{len(done[n]['map_read'])}; " + ", ".join(map(str, done[n]["map_last"]))
         for n in names])
    row("failed API answers", [str(done[n]["api_bad"]) for n in names])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="a 6 s window after a 3 s warm-up per backend (about 30 s)")
    parser.add_argument("--window", type=float, default=40.0, help="seconds measured")
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds before the window")
    parser.add_argument("--backends", default=",".join(BACKENDS),
                        help="a comma-separated list of " + ", ".join(BACKENDS))
    parser.add_argument("--postgres", default="", help="a PostgreSQL server's SQLAlchemy URL "
                        "(default: the private test server's)")
    parser.add_argument("--servers", type=int, default=200)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--watchdogs", type=int, default=2)
    parser.add_argument("--interval", type=float, default=5.0, help="the watchdogs' cycle")
    parser.add_argument("--map-interval", type=float, default=2.0)
    parser.add_argument("--rate", type=float, default=20.0, help="hub API requests a second")
    parser.add_argument("--churn", type=float, default=0.2,
                        help="seconds between a server stopping and starting again")
    args = parser.parse_args()
    if args.quick:
        args.window, args.warmup = 6.0, 3.0  # both watchdogs have written once
    backends = [b for b in args.backends.split(",") if b]
    unknown = set(backends) - set(BACKENDS)
    if unknown:
        parser.error(f"unknown backends: {', '.join(sorted(unknown))}")
    if args.gpus % args.watchdogs or args.servers <= args.gpus:
        parser.error("--gpus must be a multiple of --watchdogs, and --servers more than --gpus")

    server, postgres, skipped = postgres_server(args.postgres), "", ""
    if "postgresql" in backends:
        why = "no URL (start it: scripts/test-postgres.sh, or give --postgres)"
        try:
            postgres = postgres_versions(server) if server else ""
        except Exception as error:
            cause = getattr(error, "orig", None) or error  # the driver's, not SQLAlchemy's
            why = f"{type(cause).__name__}: {str(cause).strip().splitlines()[0]}"
        if not postgres:
            skipped = f"  PostgreSQL skipped, no server answers: {why}"
            backends.remove("postgresql")
    folder = tempfile.gettempdir()
    print(f"\n== shared state: {args.servers} servers, {args.gpus} GPUs, {args.watchdogs} "
          f"watchdogs every {args.interval:g} s, the map every {args.map_interval:g} s, "
          f"the hub API {args.rate:g}/s, a stop and start every {args.churn * 1000:.0f} ms")
    print(f"  machine: {os.cpu_count()} CPUs, {platform.machine()}, Linux "
          f"{platform.release()}, load average {os.getloadavg()[0]:.2f} at the start; "
          f"Python {platform.python_version()}")
    print(f"  versions: SQLite {sqlite3.sqlite_version} (WAL); "
          f"{postgres or 'PostgreSQL: not run'}; files in {folder} "
          f"({filesystem(folder)})")
    if skipped:
        print(skipped)
    if not backends:
        return
    print(f"  {args.warmup:g} s warm-up, then {args.window:g} s measured, per backend")
    done = {}
    for backend in backends:
        began = time.perf_counter()
        name = ""
        url = ""
        try:
            if backend == "postgresql":
                url, name = create_database(server)
            done[backend] = run_backend(backend, url, args)
        finally:
            if name:
                drop_database(server, name)
        print(f"  {backend}: done in {time.perf_counter() - began:.0f} s", flush=True)
    print(f"  load average {os.getloadavg()[0]:.2f} at the end")
    report(done)


if __name__ == "__main__":
    main()
