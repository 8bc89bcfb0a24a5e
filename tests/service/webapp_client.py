"""The web app served in the test's process, and fetched as a visitor would.

A test module makes the app with a fake hub login, ``FakeHubAuth`` (``PageHubAuth`` for
the pages that set an XSRF cookie), which reads the visitor's name from ``X-Test-User``
and hands over the user model a real JupyterHub would (``ADMIN``, ``INSTRUCTOR``,
``PLAIN``, ``VIEWER``); serves it with ``serve`` and reads its pages with a ``PageSite``
(``Text`` for what a browser shows of them). The hub's REST API, where the app calls it,
is a small tornado app (``FakeHubUsers``); ``TableApi`` calls the table editor's API.
"""

from __future__ import annotations

import html
import json
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from jupyterhub.services.auth import check_scopes
from tornado import web
from tornado.httpclient import AsyncHTTPClient, HTTPResponse
from tornado.httpserver import HTTPServer
from tornado.testing import bind_unused_port
from tornado.web import Application

from spawner.hubconfig.rbac import USAGE_SCOPE

PREFIX = "/services/usage/"


def serve(app: Application) -> tuple[HTTPServer, int]:
    """``app`` listening on a free local port; stop the server when done."""
    sock, port = bind_unused_port()
    server = HTTPServer(app)
    server.add_sockets([sock])
    return server, port


class PageSite:
    """The service's pages at ``port``: ``get(path, who)`` as the visitor ``who``."""

    def __init__(self, port: int, prefix: str = PREFIX):
        self.base = f"http://127.0.0.1:{port}{prefix}"
        self.client = AsyncHTTPClient()

    async def get(self, path: str, who: str = "", headers: dict[str, str] | None = None,
                  **kwargs: Any) -> HTTPResponse:
        headers = {**({"X-Test-User": who} if who else {}), **(headers or {})}
        return await self.client.fetch(self.base + path, headers=headers, raise_error=False,
                                       follow_redirects=False, **kwargs)


def attribute(page: str, name: str) -> str:
    """The unescaped value of the first ``name="…"`` attribute in ``page``."""
    found = re.search(rf'\b{name}="([^"]*)"', page)
    assert found, name
    return html.unescape(found.group(1))


def drawn(text: str) -> str:
    """A page's drawing with its numbers (ages, times) as N and its XSRF token left out, so
    that two drawings a moment apart read alike."""
    text = re.sub(r'data-xsrf="[^"]*"', 'data-xsrf=""', text)
    return re.sub(r"[0-9]+(\.[0-9]+)?", "N", text)


class Text(HTMLParser):
    """The page's text, and the tags it holds, as a browser would parse them."""

    def __init__(self, page: str):
        super().__init__()
        self.text: list[str] = []
        self.tags: list[str] = []
        self.feed(page)

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)

    def handle_data(self, data):
        self.text.append(data)

    @property
    def words(self) -> str:
        return " ".join(" ".join(self.text).split())


# --- the hub's login: the visitors' user models, as JupyterHub 6 hands them over ------------

ADMIN = {"kind": "user", "name": "admin", "admin": True,
         "scopes": ["access:services!service=usage", "read:users:name!user=admin"]}
INSTRUCTOR = {"kind": "user", "name": "prof-ada", "admin": False,
              "scopes": ["access:services!service=usage", f"{USAGE_SCOPE}!group=cs101",
                         "read:users:name!user=prof-ada"]}
PLAIN = {"kind": "user", "name": "carol", "admin": False,
         "scopes": ["access:services!service=usage", "read:users:name!user=carol"]}
VIEWER = {"kind": "user", "name": "finance", "admin": False,
          "scopes": ["access:services!service=usage", USAGE_SCOPE]}
MODELS = {"admin": ADMIN, "prof-ada": INSTRUCTOR, "carol": PLAIN, "finance": VIEWER}


class FakeHubAuth:
    """Stands in for HubOAuth: the user model named by the X-Test-User header."""

    login_url = "/hub/login"
    access_scopes = {"access:services", "access:services!service=usage"}

    def __init__(self, models: dict[str, dict]):
        self.models = models

    def get_user(self, handler, *, sync=True):
        model = self.models.get(handler.request.headers.get("X-Test-User", ""))
        model = json.loads(json.dumps(model)) if model else None

        async def later():
            return model

        return model if sync else later()

    def check_scopes(self, required, model):
        return check_scopes(required, set(model["scopes"]))

    def _persist_url_token_if_set(self, handler):
        pass


class PageHubAuth(FakeHubAuth):
    base_url = "/"  # where HubOAuth sets its XSRF cookie


# --- the hub's REST API, as the app calls it with its token ----------------------------------

HUB_TOKEN = "service-token"

# The hub's users: alice runs a gpu-lab server
HUB_USERS = [
    {"name": "alice", "groups": ["cs101"],
     "servers": {"": {"ready": True, "user_options": {"profile": "gpu-lab",
                                                      "image": "pytorch"}}}},
    {"name": "student1", "groups": ["cs101"], "servers": {}},
    {"name": "bob", "groups": ["ml-platform"], "servers": {}},
]


class FakeHubUsers(web.RequestHandler):
    """GET /hub/api/users, two users a page, as JupyterHub paginates."""

    def get(self) -> None:
        self.application.settings["seen_tokens"].append(
            self.request.headers.get("Authorization"))
        offset = int(self.get_argument("offset", "0"))
        page = HUB_USERS[offset:offset + 2]
        following = {"offset": offset + 2} if offset + 2 < len(HUB_USERS) else None
        self.finish({"items": page, "_pagination": {"offset": offset, "next": following}})


class TableApi:
    """The table editor's JSON API, as a visitor calls it."""

    def __init__(self, port: int, quota: Path, hub_tokens: list):
        self.base = f"http://127.0.0.1:{port}/services/usage/api/table"
        self.client = AsyncHTTPClient()
        self.quota = quota
        self.hub_tokens = hub_tokens

    async def call(self, method: str, path: str = "", who: str = "admin", body=None,
                   content_type: str = "application/json"):
        headers = {"X-Test-User": who, "Content-Type": content_type}
        data = None if body is None else (
            body if isinstance(body, (bytes, str)) else json.dumps(body))
        if method == "POST" and data is None:
            data = "{}"
        r = await self.client.fetch(self.base + path, method=method, headers=headers,
                                    body=data, raise_error=False, follow_redirects=False)
        return r.code, json.loads(r.body) if r.body else None

    async def get(self, path: str = "", who: str = "admin"):
        return await self.call("GET", path, who)

    async def post(self, path: str = "", body=None, who: str = "admin", **kwargs):
        return await self.call("POST", path, who, body, **kwargs)
