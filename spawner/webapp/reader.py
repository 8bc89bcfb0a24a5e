"""The usage ledger and the service's files, read on worker threads, so a slow query or
disk never holds up the event loop (and so every other visitor).

The service only reads the ledger the hub creates: ``LedgerReader`` opens it once it
exists and never creates it; until then, or while it is older than this code, a page
says so (``NotReady``, 503) instead of failing.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Engine
from sqlalchemy.engine import make_url
from tornado import web

from spawner.quota.model import QuotaTable
from spawner.quota.store import QuotaStore
from spawner.usage.ledger import Ledger, LedgerNotReady

T = TypeVar("T")
log = logging.getLogger("quota_spawner.usage")

NOT_READY = ("Nothing has been recorded yet: the usage ledger does not exist. The hub creates "
             "it when it starts with a usage ledger set (QuotaSpawner.usage_db); this page "
             "shows its sessions from then on.")
OUTDATED = ("The usage ledger is older than this page: the hub upgrades it when it starts "
            "(or run: quota-spawner ledger upgrade).")


class NotReady(web.HTTPError):
    """The ledger is not there yet, or older than this code (503)."""

    def __init__(self, sentence: str) -> None:
        super().__init__(503)
        self.sentence = sentence


class _Missing(Exception):
    """The ledger's SQLite file is not there."""


class LedgerReader:
    """Opens the ledger once it exists, then answers queries on worker threads."""

    def __init__(self, url: str, threads: int = 4):
        self.url = url
        self._engine: Engine | None = None
        self._opening = threading.Lock()  # the first page's queries all arrive at once
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="usage-page")

    def _open(self) -> Engine:
        with self._opening:
            if self._engine is None:
                parsed = make_url(self.url)
                if (parsed.get_backend_name() == "sqlite" and parsed.database
                        and parsed.database != ":memory:"
                        and not Path(parsed.database).exists()):
                    raise _Missing(parsed.database)  # a reader must not create the hub's file
                ledger = Ledger(self.url, log, create=False)
                self._engine = ledger.engine
            return self._engine

    def engine(self) -> Engine:
        """The ledger's engine, opened now if need be (blocking; NotReady-like errors while
        the hub has not made the ledger)."""
        return self._open()

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the worker threads, without the ledger (files)."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(engine, *args, **kwargs)`` on the worker threads, with the ledger's engine;
        NotReady while there is no ledger, or an older one."""
        def call() -> T:
            return fn(self._open(), *args, **kwargs)

        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, call)
        except _Missing:
            raise NotReady(NOT_READY) from None
        except LedgerNotReady as e:
            log.warning("Usage page: %s", e)
            raise NotReady(OUTDATED) from None

    def close(self) -> None:
        self._pool.shutdown(wait=False)


def load_table(store: QuotaStore | None) -> QuotaTable | None:
    """The quota table as the hub has it (``Setup.quota_store``: the file's, or the
    database's), for the pages that only use it (the report's advice, the class
    dashboard's choices); None without one or when it is broken (blocking: run it on
    the worker threads)."""
    if store is None:
        return None
    try:
        return store.get(log)
    except Exception as e:  # advice needs the table; the rest of the page does not
        log.warning("Usage page: no quota table for the advice: %s", e)
        return None
