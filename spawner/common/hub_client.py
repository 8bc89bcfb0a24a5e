"""The hub's REST API, as every process of the product calls it.

The web app (its pages, the table editor's preview, the pre-warms) and the watchdog
(routing by group, the zombie check) each talk to the hub only through ``HubClient``:
one place for the token, JupyterHub's pagination (``Accept:
application/jupyterhub-pagination+json``, then ``_pagination.next``; a hub that
ignores the header answers with a plain list), timeouts, retries and errors.

- A call answers (status, JSON or None). ``NO_ANSWER`` (599, as tornado's client
  says) means the hub did not answer: refused, unreachable or timed out.
- A GET that got no answer, or 502, 503 or 504 (the proxy's while the hub
  restarts), is tried again ``retries`` times, ``backoff`` seconds apart, doubling.
  Nothing else is retried: a POST or DELETE may have been done already.
- ``pages`` and ``users`` raise ``HubRefused`` (with the hub's status and message)
  when a page is not 200.

Asynchronous, on the caller's event loop (tornado's AsyncHTTPClient).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

PAGINATION = "application/jupyterhub-pagination+json"
NO_ANSWER = 599  # as tornado's client says: the hub did not answer
RETRIED = frozenset({NO_ANSWER, 502, 503, 504})
IDEMPOTENT = frozenset({"GET", "HEAD"})
PAGE = 200  # users per page


class HubRefused(Exception):
    """The hub answered with an error; ``status`` and its message."""

    def __init__(self, status: int, message: str):
        super().__init__(message or f"the hub answered {status}")
        self.status = status
        self.message = message


def message_of(found: Any) -> str:
    """The hub's own sentence in an error body, or ""."""
    return str(found.get("message", "")) if isinstance(found, dict) else ""


@dataclass(frozen=True)
class HubClient:
    """The hub's API at ``url`` (JUPYTERHUB_API_URL, ending in /hub/api), called with
    ``token`` unless a call names another (a visitor's own OAuth token)."""

    url: str
    token: str = ""
    timeout: float = 30.0  # seconds per request
    retries: int = 2  # more tries of a GET that got no answer or 502-504
    backoff: float = 0.5  # seconds before the first retry; doubled each time

    async def call(self, method: str, path: str, body: Any = None, *,
                   token: str | None = None) -> tuple[int, Any]:
        """One request: (status, JSON or None); NO_ANSWER when the hub did not answer."""
        tries = 1 + (self.retries if method in IDEMPOTENT else 0)
        code, found = NO_ANSWER, None
        for attempt in range(tries):
            if attempt:
                await asyncio.sleep(self.backoff * 2 ** (attempt - 1))
            code, found = await self._once(method, path, body, token)
            if code not in RETRIED:
                break
        return code, found

    async def _once(self, method: str, path: str, body: Any,
                    token: str | None) -> tuple[int, Any]:
        request = HTTPRequest(
            f"{self.url.rstrip('/')}/{path.lstrip('/')}", method=method,
            headers={"Authorization": f"token {self.token if token is None else token}",
                     "Accept": PAGINATION, "Content-Type": "application/json"},
            body=None if method in ("GET", "HEAD", "DELETE") else json.dumps(body or {}),
            request_timeout=self.timeout)
        try:
            response = await AsyncHTTPClient().fetch(request, raise_error=False)
        except (OSError, HTTPClientError):  # refused, unreachable, timed out
            return NO_ANSWER, None
        if response.code == NO_ANSWER:  # tornado's own timeout or connection error
            return NO_ANSWER, None
        try:
            found = json.loads(response.body) if response.body else None
        except ValueError:
            found = None
        return response.code, found

    async def pages(self, path: str, *, token: str | None = None,
                    limit: int = PAGE) -> list[dict[str, Any]]:
        """Every item of a paginated list (``users``, ``groups``); HubRefused when a page
        is refused or not answered."""
        items: list[dict[str, Any]] = []
        offset = 0
        while True:
            code, page = await self.call(
                "GET", f"{path}?" + urlencode({"offset": offset, "limit": limit}),
                token=token)
            if code != 200:
                raise HubRefused(code, "The hub did not answer." if code == NO_ANSWER
                                 else message_of(page))
            found = page if isinstance(page, list) else (page or {}).get("items", [])
            items += [i for i in found if isinstance(i, dict)]
            following = None if isinstance(page, list) else (
                ((page or {}).get("_pagination") or {}).get("next"))
            if not following:
                return items
            offset = int(following.get("offset", offset + limit))

    async def users(self, *, token: str | None = None) -> list[dict[str, Any]]:
        """Every user the token may list, with their groups and servers."""
        return [u for u in await self.pages("users", token=token) if u.get("name")]
