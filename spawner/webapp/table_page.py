"""The quota table editor's page, for admins only, in the usage service.

``GET {prefix}table`` shows the table in a browser editor (CodeMirror 6 with the table's
JSON Schema, bundled into ``static/editor.js`` from ``editor/`` by ``make editor``; no
asset from the network). The page only shows; it reads, checks, previews and saves
through the JSON API of :mod:`spawner.webapp.table`, with the service's XSRF token,
which the page carries. ``{prefix}static/…`` serves the bundle.

Only admins (``admin`` true in the hub's user model) get the page; everyone else is
refused with the API's sentence. Its Content-Security-Policy allows scripts from this
service only (``script-src 'self'``) and requests to this service only.
"""

from __future__ import annotations

import hashlib
import json
import logging
from functools import cache
from importlib.resources import files
from typing import Any

from tornado import web

from spawner.quota.editing import TableFile
from spawner.webapp.app import Refused, UsageHandler
from spawner.webapp.table import ADMINS_ONLY, NO_TABLE, problems_json, table_schema

log = logging.getLogger("quota_spawner.usage")

PAGE_CSP = ("default-src 'none'; script-src 'self'; style-src 'unsafe-inline'; "
            "img-src 'self' data:; connect-src 'self'; form-action 'self'; "
            "frame-ancestors 'self'; base-uri 'none'")
STATIC = str(files(__package__).joinpath("static"))


@cache
def static_version(name: str) -> str:
    """A static file's hash, in its URL, so a browser never runs an old one from its cache."""
    return hashlib.sha256(files(__package__).joinpath("static", name).read_bytes()
                          ).hexdigest()[:12]


def bundle_version() -> str:
    return static_version("editor.js")


class TablePage(UsageHandler):
    """GET {prefix}table: the editor, with the table's text, version, schema and problems."""

    page_title = "Quota table"

    def set_default_headers(self) -> None:
        super().set_default_headers()
        self.set_header("Content-Security-Policy", PAGE_CSP)

    @web.authenticated
    async def get(self) -> None:
        model = self.current_user
        if model.get("admin") is not True:
            log.info("Table editor page: refused %s, not an admin", model.get("name"))
            raise Refused(ADMINS_ONLY)
        path = self.settings["usage_quota_file"]
        if not path:
            raise Refused(NO_TABLE, 404)
        table = TableFile(path)

        def read() -> dict[str, Any]:
            text, version = table.read()
            return {"text": text, "version": version,
                    "problems": problems_json(table.check(text))}

        found = await self.reader.call(read)
        prefix = self.settings["usage_prefix"]
        self.render_page(
            "table.html", title="Quota table", path=table.path, text=found["text"],
            version=found["version"], problems=found["problems"],
            problems_json=json.dumps(found["problems"]),
            schema_json=json.dumps(table_schema(), separators=(",", ":")),
            xsrf=self.xsrf(),
            api=prefix + "api/table", script=f"{prefix}static/editor.js?v={bundle_version()}")


class StaticFiles(web.StaticFileHandler):
    """The editor's bundle; the same hardening headers as the pages, and a script's type."""

    def set_default_headers(self) -> None:
        self.set_header("X-Content-Type-Options", "nosniff")
        self.set_header("Content-Security-Policy", "default-src 'none'")

    def get_content_type(self) -> str:
        if self.absolute_path.endswith(".js"):
            return "text/javascript; charset=utf-8"
        if self.absolute_path.endswith(".txt"):
            return "text/plain; charset=utf-8"
        return super().get_content_type()


def routes(prefix: str) -> list[tuple[Any, ...]]:
    """The page's routes, for make_app: the page and its static files."""
    prefix = prefix if prefix.endswith("/") else prefix + "/"
    return [
        (prefix + "table", TablePage),
        (prefix + "static/(.*)", StaticFiles, {"path": STATIC}),
    ]
