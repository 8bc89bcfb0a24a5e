"""The hub's REST API, as the web app calls it (through spawner/common/hub_client.py, the one
client every process uses), and the hub's user models.

Calls go with a token: a visitor's own OAuth token for what they do on a page (the
class dashboard: the hub's RBAC has the last word), or the service's own token
(``service_token``, JUPYTERHUB_API_TOKEN) for what nobody is there to do: the table
editor's preview, the requesters' groups, the scheduled pre-warms. Its role
(``webapp_service`` in app.py) holds ``list:users``, ``read:users:groups``,
``read:servers`` and the classes' ``servers!group=``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from spawner.common.hub_client import NO_ANSWER, HubClient, message_of
from spawner.webapp.access import Refused
from spawner.webapp.formatting import isolate

STARTS_AT_ONCE = 8  # concurrent start requests to the hub
# Concurrent stop requests to the hub: a class's stops all at once, as the hub runs them
# side by side (c.QuotaSpawner.engine_threads at its engine), but no more requests than
# tornado's HTTP client sends at once (max_clients, 10): one queued there would spend its
# wait out of its own timeout and come back failed.
STOPS_AT_ONCE = 10
# The hub refuses a server outside the token's filters with 404 ("No access to resources
# or resources not found"), not 403, when the token holds the scope for some servers: an
# instructor's token always does (their own, from "self"), so 404 is how the hub says no
# to another class's member (checked on a real hub by tests/browser/test_browser_classes.py).
REFUSALS = {403: "refused", 404: "refused"}


@dataclass(frozen=True)
class HubApi:
    """The hub's API at ``url`` (JUPYTERHUB_API_URL), and the service's own token."""

    url: str
    service_token: str = ""

    def require(self, sentence: str) -> HubApi:
        """This, when the service knows where the hub's API is; else Refused (503) with
        the caller's sentence. Every caller asks before its first call."""
        if not self.url:
            raise Refused(sentence, 503)
        return self

    @property
    def client(self) -> HubClient:
        return HubClient(self.url, self.service_token, timeout=60)

    async def call(self, token: str, method: str, path: str,
                   body: Any = None) -> tuple[int, Any]:
        """One request with ``token``: (status, JSON or None); NO_ANSWER when the hub
        did not answer (spawner/common/hub_client.py: a GET is tried again first)."""
        return await self.client.call(method, path, body, token=token)

    async def users(self, token: str) -> list[dict[str, Any]]:
        """Every user the token may list, with groups and servers; HubRefused otherwise."""
        return await self.client.users(token=token)

    async def start_server(self, token: str, name: str, options: dict[str, str]
                           ) -> dict[str, Any]:
        """Start ``name``'s default server with ``options``: a result with the outcome
        in a word (started, starting, skipped, busy, refused, failed)."""
        code, found = await self.call(token, "POST", _server_path(name), options)
        return _result(name, code, found, {201: "started", 202: "starting", 400: "skipped",
                                           429: "busy", **REFUSALS})

    async def stop_server(self, token: str, name: str) -> dict[str, Any]:
        """Stop ``name``'s default server (stopped, stopping, skipped, refused, failed)."""
        code, found = await self.call(token, "DELETE", _server_path(name))
        return _result(name, code, found, {204: "stopped", 202: "stopping", 400: "skipped",
                                           **REFUSALS})

    async def start_servers(self, token: str, users: Sequence[dict[str, Any]],
                            options: dict[str, str]) -> list[dict[str, Any]]:
        """Starts the stopped servers of ``users`` with ``options``, a few at once;
        running and starting ones are skipped. One result per user, in their order."""
        gate = asyncio.Semaphore(STARTS_AT_ONCE)

        async def one(user: dict[str, Any]) -> dict[str, Any]:
            state = server_state(user)
            if state != "stopped":
                return {"user": user["name"], "outcome": "skipped",
                        "message": f"The server is {state} already."}
            async with gate:
                return await self.start_server(token, str(user["name"]), options)

        return list(await asyncio.gather(*(one(u) for u in users)))


    async def stop_servers(self, token: str, names: Sequence[str]) -> list[dict[str, Any]]:
        """Stop the default servers of ``names``, STOPS_AT_ONCE at a time; one result per
        name, in their order."""
        gate = asyncio.Semaphore(STOPS_AT_ONCE)

        async def one(name: str) -> dict[str, Any]:
            async with gate:
                return await self.stop_server(token, name)

        return list(await asyncio.gather(*(one(n) for n in names)))


def _server_path(name: str) -> str:
    return f"users/{quote(name, safe='')}/server"


def _result(name: str, code: int, found: Any, outcomes: dict[int, str]) -> dict[str, Any]:
    message = "The hub did not answer." if code == NO_ANSWER else message_of(found)
    return {"user": name, "outcome": outcomes.get(code, "failed"), "message": message}


def summary(results: Sequence[dict[str, Any]]) -> str:
    """The results of starts or stops, a line per user, whose name is isolated (the line
    is shown as text: a pre-warm schedule's result)."""
    return "\n".join(f"{isolate(r['user'])}: {r['outcome']}" + (f" ({r['message']})" if r["message"]
                                                        else "") for r in results)


# --- the hub's user models -------------------------------------------------------------------


def groups_of(users: Iterable[dict[str, Any]]) -> list[str]:
    """Every group these users belong to."""
    return sorted({g for user in users for g in (user.get("groups") or [])})


def members(users: Iterable[dict[str, Any]], group: str) -> list[dict[str, Any]]:
    """The users of ``group``, by name."""
    return sorted((u for u in users if group in (u.get("groups") or [])),
                  key=lambda u: str(u.get("name")))


def default_server(user: dict[str, Any]) -> dict[str, Any] | None:
    return (user.get("servers") or {}).get("")


def server_state(user: dict[str, Any]) -> str:
    """"running", "starting", "stopping" or "stopped": the user's default server."""
    server = default_server(user)
    if not server:
        return "stopped"
    pending = server.get("pending")
    if pending == "stop":
        return "stopping"
    if pending or not server.get("ready"):
        return "starting"
    return "running"
