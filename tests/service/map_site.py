"""The admins' host map served in the test's process from a state folder of its own, where
a test writes the hub's pool file and the watchdog's usage file (``state_site``), or from
the ledger's database alone, as a service on another machine (``database_site``), and
read as a visitor would (``row_of``, ``words``); the hostile names its pages must keep as
text. For tests/service/test_gpus.py, test_gpus_host.py and test_gpus_disk.py."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from webapp_client import ADMIN, INSTRUCTOR, PLAIN, PREFIX, VIEWER, PageHubAuth, PageSite, Text
from webapp_client import serve as serve_app

from spawner.usage.documents import DatabaseDocuments
from spawner.usage.ledger import Ledger
from spawner.webapp import app as service
from spawner.webapp.base import BaseHandler

HOSTILE = '<script>alert(1)</script>"&'
HOSTILE_ROLE = "<img src=x onerror=alert(2)>"


class Site(PageSite):
    def __init__(self, port: int, state):
        super().__init__(port, PREFIX)
        self.state = state

    def write(self, name: str, data) -> None:
        text = data if isinstance(data, str) else json.dumps(data)
        (self.state / name).write_text(text, encoding="utf-8")


async def serve(tmp_path, monkeypatch, state_dir):
    url = f"sqlite:///{tmp_path / 'usage.sqlite'}"
    Ledger(url).dispose()
    auth = PageHubAuth({"admin": ADMIN, "prof-ada": INSTRUCTOR, "carol": PLAIN,
                        "finance": VIEWER})
    monkeypatch.setattr(BaseHandler, "hub_auth", property(lambda self: auth))
    app = service.make_app(usage_db=url, service_prefix=PREFIX, state_dir=state_dir)
    server, port = serve_app(app)
    return app, server, port


@asynccontextmanager
async def state_site(tmp_path, monkeypatch) -> AsyncIterator[Site]:
    """The service with a state folder of its own, where a test writes the two files."""
    state = tmp_path / "state"
    state.mkdir()
    app, server, port = await serve(tmp_path, monkeypatch, str(state))
    try:
        yield Site(port, state)
    finally:
        server.stop()
        app.settings["usage"].reader.close()


@asynccontextmanager
async def database_site(tmp_path, monkeypatch,
                        hub: str = "hub-1") -> AsyncIterator[tuple[Site, DatabaseDocuments]]:
    """The service with only the ledger's URL and hub ``hub``'s id, no state folder; and the
    rows of that hub's documents, where a test writes them."""
    url = f"sqlite:///{tmp_path / 'usage.sqlite'}"
    ledger = Ledger(url)
    auth = PageHubAuth({"admin": ADMIN})
    monkeypatch.setattr(BaseHandler, "hub_auth", property(lambda self: auth))
    app = service.make_app(usage_db=url, service_prefix=PREFIX, state_dir="", hub_id=hub)
    server, port = serve_app(app)
    try:
        yield Site(port, tmp_path), DatabaseDocuments(ledger.engine, hub)
    finally:
        server.stop()
        app.settings["usage"].reader.close()
        ledger.dispose()


def row_of(page: str, uuid: str) -> str:
    found = re.search(rf'<tr data-key="{re.escape(uuid)}"[^>]*>(.*?)</tr>', page, re.S)
    assert found, uuid
    return found.group(1)


def words(fragment: str) -> str:
    return Text(fragment).words
