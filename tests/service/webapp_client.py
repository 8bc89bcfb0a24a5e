"""The web app served in the test's process, and fetched as a visitor would.

A test module makes the app with its own fake hub login (which reads the visitor's name
from ``X-Test-User``), serves it with ``serve`` and reads its pages with a ``PageSite``.
"""

from __future__ import annotations

import html
import re
from typing import Any

from tornado.httpclient import AsyncHTTPClient, HTTPResponse
from tornado.httpserver import HTTPServer
from tornado.testing import bind_unused_port
from tornado.web import Application

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
