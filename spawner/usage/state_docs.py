"""The processes' shared documents (spawner/state.py) in the ledger's database: the
``state_documents`` table, one row per hub, kind and node, replaced whole.

A write is one upsert (``INSERT … ON CONFLICT DO UPDATE`` on SQLite and PostgreSQL), so
two writers of the same row never deadlock and a reader sees the old text or the new.
Blocking: call from a thread.
"""

from __future__ import annotations

import time

from sqlalchemy import Engine, select
from sqlalchemy.dialects import postgresql, sqlite

from spawner.state import Document, Documents, Kind
from spawner.usage.schema import state_documents

NODE_LENGTH = 253  # a DNS name, as a Kubernetes node's


class DatabaseDocuments:
    """One hub's documents in the ledger's database (``Documents``, spawner/state.py)."""

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
