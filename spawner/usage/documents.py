"""The small documents the product's processes publish for each other: their kinds,
where they live, and how the pages read them. The one home of the shared documents.

Besides the hub's REST API, the hub, the web app and the watchdogs share one thing:
the ledger's database. Each publishes a few JSON documents there, replaced whole on
each change, keyed by the hub's id, the document's kind and the node that wrote it
(table ``state_documents``, ``DatabaseDocuments``):

- ``GPUS``: the hub's GPU pool, host room and queue (gpu/snapshot.py), for the host map;
- ``GPU_USAGE``: a watchdog's readings on its node (watchdog/app.py), one per node;
- ``PREEMPTIONS``: the preemptions in their grace (docker/evictor.py), read back by a
  restarted hub;
- ``BUDGET_MEMORY``: the budget notices already told this period (usage/budgets.py), so
  a restarted hub tells nothing twice.

A hub without a ledger (``usage_db = "none"``) keeps them as files in its state folder
(``FolderDocuments``), as before the database held them; readers that find no row fall
back to that folder's file, so a web app beside such a hub still draws its map.

The pages read them through ``read_pool`` and ``read_usage``: any document may be
missing, half-written, old, or from another version, and that reads as missing or stale,
never as an error, so a page never fails on one odd document.

Every method and reader blocks (a file or the database): call it from a thread.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy import Engine, select
from sqlalchemy.dialects import postgresql, sqlite

from spawner.usage.gpu_readings import json_object, merge_usage
from spawner.usage.schema import state_documents

NODE_LENGTH = 253  # a DNS name, as a Kubernetes node's


@dataclass(frozen=True)
class Kind:
    name: str  # the row's kind
    file: str  # the file in the state folder, without a database


GPUS = Kind("gpus", "quota-spawner-gpus.json")
GPU_USAGE = Kind("gpu-usage", "quota-spawner-gpu-usage.json")
PREEMPTIONS = Kind("preemptions", "quota-spawner-preemptions.json")
BUDGET_MEMORY = Kind("budget-memory", "quota-spawner-budgets.json")
KINDS = (GPUS, GPU_USAGE, PREEMPTIONS, BUDGET_MEMORY)


@dataclass(frozen=True)
class Document:
    node: str  # "" for the hub's own documents
    time: float  # when it was written (epoch seconds)
    text: str  # JSON


class Documents(Protocol):
    """Where one hub's documents are kept (blocking)."""

    def write(self, kind: Kind, text: str, node: str = "") -> None:
        """Replace the document; raises OSError or the database's error."""

    def read(self, kind: Kind, node: str = "") -> Document | None:
        """The document, or None when there is none."""

    def read_all(self, kind: Kind) -> list[Document]:
        """Every node's document of ``kind``."""


class FolderDocuments:
    """The documents as files in a state folder: one per kind, whatever the node."""

    def __init__(self, folder: str):
        self.folder = folder

    def path(self, kind: Kind) -> str:
        return os.path.join(self.folder or ".", kind.file)

    def write(self, kind: Kind, text: str, node: str = "") -> None:
        write_atomically(self.path(kind), text)

    def read(self, kind: Kind, node: str = "") -> Document | None:
        path = self.path(kind)
        try:
            with open(path, encoding="utf-8") as f:
                return Document(node, os.fstat(f.fileno()).st_mtime, f.read())
        except (OSError, UnicodeDecodeError):
            return None

    def read_all(self, kind: Kind) -> list[Document]:
        found = self.read(kind)
        return [found] if found is not None else []


def write_atomically(path: str | os.PathLike[str], text: str) -> None:
    """Write ``path`` whole: a temporary file beside it, renamed over it, so a reader
    sees the old text or the new, never half of one. Raises OSError."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)),
                               prefix=".quota-spawner.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class DatabaseDocuments:
    """One hub's documents in the ledger's database (``Documents``): a write is one upsert
    (``INSERT … ON CONFLICT DO UPDATE`` on SQLite and PostgreSQL), so two writers of the
    same row never deadlock and a reader sees the old text or the new."""

    def __init__(self, engine: Engine, hub: str, fallback: Documents | None = None):
        self.engine = engine
        self.hub = hub[:64]
        # read where the database has no row: the state folder's files of a hub before
        # its upgrade, or of a hub or watchdog that has no ledger
        self.fallback = fallback

    def write(self, kind: Kind, text: str, node: str = "") -> None:
        if len(node) > NODE_LENGTH:
            raise ValueError(f"a node's name has at most {NODE_LENGTH} characters")
        row = {"hub": self.hub, "kind": kind.name, "node": node, "time": time.time(),
               "body": text}
        dialect = self.engine.dialect.name
        insert = (postgresql.insert if dialect == "postgresql" else sqlite.insert)(
            state_documents).values(**row)
        upsert = insert.on_conflict_do_update(
            index_elements=["hub", "kind", "node"],
            set_={"time": insert.excluded.time, "body": insert.excluded.body})
        with self.engine.begin() as connection:
            connection.execute(upsert)

    def read(self, kind: Kind, node: str = "") -> Document | None:
        found = self._select(kind, node)
        if found:
            return found[0]
        return self.fallback.read(kind, node) if self.fallback is not None else None

    def read_all(self, kind: Kind) -> list[Document]:
        found = self._select(kind, None)
        if found or self.fallback is None:
            return found
        return self.fallback.read_all(kind)

    def _select(self, kind: Kind, node: str | None) -> list[Document]:
        t = state_documents.c
        query = select(t.node, t.time, t.body).where(t.hub == self.hub, t.kind == kind.name)
        if node is not None:
            query = query.where(t.node == node)
        with self.engine.connect() as connection:
            rows = connection.execute(query.order_by(t.node)).all()
        return [Document(row.node, row.time, row.body) for row in rows]


# --- how the pages read them ----------------------------------------------------------


def read_pool(documents: Documents | None) -> dict[str, Any] | None:
    """The hub's pool snapshot (``GPUS``: gpu/snapshot.py), None while there is none."""
    found = documents.read(GPUS) if documents is not None else None
    return json_object(found.text) if found is not None else None


def read_usage(documents: Documents | None, now: float) -> dict[str, Any] | None:
    """Every watchdog's readings (``GPU_USAGE``) merged into one (``merge_usage``)."""
    found: list[Document] = documents.read_all(GPU_USAGE) if documents is not None else []
    return merge_usage([u for u in (json_object(d.text) for d in found) if u], now)
