"""The one client of the hub's REST API (spawner/common/hub_client.py), against a small hub API
served in the test's process: JupyterHub's pagination, a hub that ignores it, retries of
a GET (never of a POST), time-outs, and the hub's refusals as HubRefused."""

from __future__ import annotations

import asyncio
import json

import pytest
from tornado.testing import bind_unused_port
from tornado.web import Application, RequestHandler
from webapp_client import serve

from spawner.common.hub_client import NO_ANSWER, PAGINATION, HubClient, HubRefused

USERS = [{"name": f"u{i:03d}", "groups": ["lab"] if i % 2 else [], "servers": {}}
         for i in range(450)]


class Hub:
    """What the fake hub was asked, and how it answers."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, str, str]] = []  # (method, uri, token)
        self.fail_next: list[int] = []  # statuses to answer first, one per request
        self.plain = False  # a hub that ignores the pagination header
        self.slow = 0.0


class UsersHandler(RequestHandler):
    def initialize(self, hub: Hub) -> None:
        self.hub = hub

    async def get(self) -> None:
        self.hub.asked.append(("GET", self.request.uri, self.request.headers.get(
            "Authorization", "")))
        await asyncio.sleep(self.hub.slow)
        if self.hub.fail_next:
            self.set_status(self.hub.fail_next.pop(0))
            self.finish({"status": self.get_status(), "message": "Not now."})
            return
        if self.request.headers.get("Authorization") == "token wrong":
            self.set_status(403)
            self.finish({"status": 403, "message": "Action is not authorized with current "
                                                   "scopes; requires any of [list:users]"})
            return
        offset = int(self.get_argument("offset", "0"))
        limit = int(self.get_argument("limit", "200"))
        items = USERS[offset:offset + limit]
        if self.hub.plain or self.request.headers.get("Accept") != PAGINATION:
            self.finish(json.dumps(USERS))
            return
        following = offset + limit
        self.finish({"items": items, "_pagination": {
            "offset": offset, "limit": limit, "total": len(USERS),
            "next": {"offset": following, "limit": limit} if following < len(USERS)
            else None}})

    def post(self) -> None:
        self.hub.asked.append(("POST", self.request.uri, ""))
        self.set_status(self.hub.fail_next.pop(0) if self.hub.fail_next else 201)
        self.finish({"message": "done"})


@pytest.fixture
async def hub():
    found = Hub()
    server, port = serve(Application([(r"/hub/api/users", UsersHandler, {"hub": found})]))
    found.url = f"http://127.0.0.1:{port}/hub/api"
    yield found
    server.stop()


async def test_every_page_is_read_with_the_token(hub):
    users = await HubClient(hub.url, "secret").users()
    assert [u["name"] for u in users] == [u["name"] for u in USERS]
    assert [uri for _, uri, _ in hub.asked] == [
        "/hub/api/users?offset=0&limit=200", "/hub/api/users?offset=200&limit=200",
        "/hub/api/users?offset=400&limit=200"]
    assert {token for _, _, token in hub.asked} == {"token secret"}


async def test_a_call_may_name_another_token(hub):
    await HubClient(hub.url, "service").users(token="visitor")
    assert hub.asked[0][2] == "token visitor"


async def test_a_hub_that_ignores_pagination_answers_one_list(hub):
    hub.plain = True
    assert len(await HubClient(hub.url).users()) == len(USERS)
    assert len(hub.asked) == 1


async def test_a_get_is_tried_again_while_the_hub_restarts(hub):
    hub.fail_next = [503, 502]
    users = await HubClient(hub.url, backoff=0.01).users()
    assert len(users) == len(USERS)
    assert [uri for _, uri, _ in hub.asked][:3] == ["/hub/api/users?offset=0&limit=200"] * 3


async def test_retries_end_and_the_refusal_says_so(hub):
    hub.fail_next = [503, 503, 503]
    with pytest.raises(HubRefused) as raised:
        await HubClient(hub.url, backoff=0.01).users()
    assert (raised.value.status, raised.value.message) == (503, "Not now.")
    assert len(hub.asked) == 3  # one try and two retries


async def test_a_post_is_never_tried_twice(hub):
    hub.fail_next = [503]
    code, found = await HubClient(hub.url, backoff=0.01).call("POST", "users", {"a": 1})
    assert (code, found) == (503, {"message": "done"})
    assert [m for m, _, _ in hub.asked] == ["POST"]


async def test_a_refusal_is_the_hubs_sentence(hub):
    with pytest.raises(HubRefused) as raised:
        await HubClient(hub.url, "wrong").users()
    assert raised.value.status == 403
    assert "requires any of [list:users]" in raised.value.message
    assert len(hub.asked) == 1  # a refusal is not retried


async def test_a_hub_that_does_not_answer_in_time(hub):
    hub.slow = 1.0
    code, found = await HubClient(hub.url, timeout=0.2, retries=0).call("GET", "users")
    assert (code, found) == (NO_ANSWER, None)


async def test_a_hub_that_is_not_there():
    sock, port = bind_unused_port()
    sock.close()  # nothing listens there now
    client = HubClient(f"http://127.0.0.1:{port}/hub/api", retries=1, backoff=0.01)
    assert await client.call("GET", "users") == (NO_ANSWER, None)
    with pytest.raises(HubRefused) as raised:
        await client.users()
    assert (raised.value.status, raised.value.message) == (NO_ANSWER,
                                                          "The hub did not answer.")
