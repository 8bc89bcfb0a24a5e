"""A GPU server that is still starting is never named a zombie.

The hub records a server before its container starts; a container is a
zombie only when the hub's answer that lacks its server was asked for after
the container started (with a margin for the clocks). An answer from before,
which a forced read the 2-second limit did not allow leaves in place, is not
enough: such a container is judged on a later cycle.

Fakes for the hub (``FakeHub``) and a real ``HubDirectory`` against a local
HTTP server that answers as the hub's ``/users`` does.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from spawner.watchdog.app import ZOMBIE_CLOCK_MARGIN, QuotaWatchdog
from spawner.watchdog.hub_api import HubDirectory
from spawner.watchdog.model import Server, ServerSample, Snapshot

T = 1_795_000_000.0
UUID = "GPU-8f3c2a4e-1b7d-4c55-9e0a-2d6f4b1c9a77"


def container(user: str, started: float | None, gpus: tuple[str, ...] = (UUID,)) -> Server:
    return Server(container_id=f"id-{user}", name=f"quota-{user}", user=user, role="gpu",
                  image="pytorch", hub_id="hub", gpus=gpus, started=started)


def snapshot(*servers: Server, at: float = T) -> Snapshot:
    return Snapshot(time=at, host="h", servers={s.container_id: ServerSample(s) for s in servers})


class FakeHub:
    """The hub as the watchdog sees it: its servers, and when it answered last.

    ``refresh(force=True)`` answers again only when ``allowed`` (the real one reads
    at most every 2 s), as of ``clock``, with the servers the hub has then.
    """

    def __init__(self, servers: set[str], read_at: float | None, clock: float):
        self.servers, self.read_at, self.clock = servers, read_at, clock
        self.known = read_at is not None
        self.allowed = False
        self.forced = 0

    def has_server(self, user: str) -> bool:
        return user in self.servers

    async def refresh(self, force: bool = False) -> None:
        self.forced += force
        if force and self.allowed:
            self.read_at, self.known = self.clock, True


def watchdog(hub: FakeHub) -> QuotaWatchdog:
    app = QuotaWatchdog(hub_id="hub")
    app.hub = hub
    return app


async def test_a_container_started_after_the_last_answer_is_not_a_zombie():
    # the hub answered at T, the container started at T + 1: the answer cannot know it
    hub = FakeHub(servers=set(), read_at=T, clock=T + 1.5)
    app = watchdog(hub)
    assert await app.zombies(snapshot(container("rt", started=T + 1), at=T + 1.5)) == []
    assert hub.forced == 1  # it asked, and the 2 s limit said not yet
    # the next cycle's answer, asked for after the start, names its server: a normal start
    hub.servers, hub.allowed, hub.clock = {"rt"}, True, T + 6.5
    assert await app.zombies(snapshot(container("rt", started=T + 1), at=T + 6.5)) == []


async def test_a_container_no_answer_after_its_start_claims_is_a_zombie():
    hub = FakeHub(servers=set(), read_at=T, clock=T + 1.5)
    app = watchdog(hub)
    late = container("late", started=T + 1)
    assert await app.zombies(snapshot(late, at=T + 1.5)) == []
    hub.allowed, hub.clock = True, T + 6.5  # a later cycle: still no server
    assert await app.zombies(snapshot(late, at=T + 6.5)) == [late]


async def test_a_container_started_well_before_the_answer_is_a_zombie_at_once():
    hub = FakeHub(servers={"alice"}, read_at=T, clock=T + 1)
    app = watchdog(hub)
    old = container("zed", started=T - 600)
    alice = container("alice", started=T - 600)
    cpu = container("cpu", started=T - 600, gpus=())
    assert await app.zombies(snapshot(old, alice, cpu, at=T + 1)) == [old]
    assert hub.forced == 0  # the answer it has is recent enough to judge


async def test_the_margin_covers_the_clocks():
    hub = FakeHub(servers=set(), read_at=T, clock=T)
    app = watchdog(hub)
    # started a moment before the answer, by the engine's clock: too close to judge
    near = container("near", started=T - ZOMBIE_CLOCK_MARGIN / 2)
    assert await app.zombies(snapshot(near)) == []
    far = container("far", started=T - ZOMBIE_CLOCK_MARGIN - 0.1)
    assert await app.zombies(snapshot(far)) == [far]


async def test_a_container_of_unknown_start_counts_from_when_it_was_first_seen():
    hub = FakeHub(servers=set(), read_at=T, clock=T)
    app = watchdog(hub)
    unknown = container("unknown", started=None)
    assert await app.zombies(snapshot(unknown, at=T + 1)) == []  # first seen at T + 1
    hub.allowed, hub.clock = True, T + 6
    assert await app.zombies(snapshot(unknown, at=T + 6)) == [unknown]


async def test_no_answer_from_the_hub_yet_no_zombie():
    hub = FakeHub(servers=set(), read_at=None, clock=T)
    assert await watchdog(hub).zombies(snapshot(container("x", started=T - 600))) == []


# --- the real directory: when its answer was asked for ----------------------------------------


class HubApi:
    """A local HTTP server that answers GET /hub/api/users as the hub does."""

    def __init__(self) -> None:
        self.servers: dict[str, dict[str, Any]] = {}
        self.asked: list[float] = []
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                api.asked.append(time.time())
                items = [{"name": user, "groups": [], "servers": servers}
                         for user, servers in api.servers.items()]
                data = json.dumps({"items": items, "_pagination": {"next": None}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hub/api"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


async def test_the_directory_keeps_when_its_answer_was_asked_for():
    api = HubApi()
    try:
        hub = HubDirectory(api.url, "token", logging.getLogger("t"))
        assert hub.read_at is None and not hub.known
        before = time.time()
        await hub.refresh()
        assert hub.known and before <= hub.read_at <= api.asked[0]
        first = hub.read_at
        # a GPU server starts now; a forced read under 2 s after the last is not made
        api.servers["rt"] = {"": {"ready": False, "pending": "spawn"}}
        started = time.time()
        await hub.refresh(force=True)
        assert hub.read_at == first and not hub.has_server("rt") and len(api.asked) == 1
        app = QuotaWatchdog(hub_id="hub")
        app.hub = hub
        rt = container("rt", started=started)
        assert await app.zombies(snapshot(rt, at=started)) == []  # not judged on that answer
        hub._read_at -= 2.0  # two seconds on: the next forced read is allowed
        assert await app.zombies(snapshot(rt, at=started + 2)) == []
        assert hub.has_server("rt") and hub.read_at > first and len(api.asked) == 2
    finally:
        api.close()
