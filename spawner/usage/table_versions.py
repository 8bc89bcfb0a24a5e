"""The quota table's audit trail in the ledger: ``table_versions``, a row per version of
the table that the editor saved or found (spawner/quota/editing.py's ``Trail``).

``Audit`` blocks (the ledger's database): call it from a thread. ``restore`` saves an
earlier version again through ``TableFile.save``, with the same checks as any save.
"""

from __future__ import annotations

import os
import time
from contextlib import AbstractContextManager

from sqlalchemy import Connection, Engine, insert, select

from spawner.quota.editing import (
    NOT_FOUND,
    SaveResult,
    TableFile,
    Version,
    unified_diff,
    version_of,
)
from spawner.usage.schema import table_versions


class Audit:
    """The table's versions in the ledger's database (blocking)."""

    def __init__(self, engine: Engine):
        self.engine = engine

    def transaction(self) -> AbstractContextManager[Connection]:
        """A transaction on the ledger, in which a save records its versions."""
        return self.engine.begin()

    def record(self, *, path: str, who: str, comment: str, text: str,
               previous: str | None, at: float | None = None, sha256: str | None = None,
               restored_from: int | None = None,
               connection: Connection | None = None) -> int:
        """Add a version; its diff is from ``previous`` (None: the first version).
        ``sha256`` defaults to that of the text in UTF-8; pass ``connection`` to write
        in a transaction of the caller's."""
        name = os.path.basename(path)
        diff = "" if previous is None else unified_diff(previous, text, f"a/{name}",
                                                        f"b/{name}")
        values = dict(path=os.path.abspath(path), at=time.time() if at is None else at,
                      who=who, comment=comment, text=text, diff=diff,
                      sha256=sha256 or version_of(text.encode("utf-8")),
                      restored_from=restored_from)
        if connection is not None:
            return int(connection.execute(insert(table_versions).values(
                **values)).inserted_primary_key[0])
        with self.engine.begin() as own:
            return int(own.execute(insert(table_versions).values(
                **values)).inserted_primary_key[0])

    def versions(self, path: str, limit: int = 50) -> list[Version]:
        """The table's versions, newest first."""
        query = (select(table_versions).where(table_versions.c.path == os.path.abspath(path))
                 .order_by(table_versions.c.id.desc()).limit(limit))
        with self.engine.connect() as connection:
            return [Version(**row._mapping) for row in connection.execute(query)]

    def version(self, version_id: int) -> Version | None:
        with self.engine.connect() as connection:
            row = connection.execute(
                select(table_versions).where(table_versions.c.id == version_id)).first()
        return Version(**row._mapping) if row is not None else None

    def latest(self, path: str, connection: Connection | None = None) -> Version | None:
        query = (select(table_versions).where(table_versions.c.path == os.path.abspath(path))
                 .order_by(table_versions.c.id.desc()).limit(1))
        if connection is not None:
            row = connection.execute(query).first()
        else:
            with self.engine.connect() as own:
                row = own.execute(query).first()
        return Version(**row._mapping) if row is not None else None

    def by_sha(self, path: str, sha256: str) -> Version | None:
        """The newest version of the table with these bytes."""
        query = (select(table_versions).where(
            table_versions.c.path == os.path.abspath(path), table_versions.c.sha256 == sha256)
            .order_by(table_versions.c.id.desc()).limit(1))
        with self.engine.connect() as connection:
            row = connection.execute(query).first()
        return Version(**row._mapping) if row is not None else None

    def restore(self, version_id: int, who: str, comment: str, file: TableFile,
                base_version: str | None = None) -> SaveResult:
        """Save an earlier version again, through ``file.save``: the same validation and
        the same refusal when the file changed since ``base_version`` (None: the file
        as it is when this is called)."""
        found = self.version(version_id)
        if found is None or found.path != os.path.abspath(file.path):
            current = file.read()[1]
            return SaveResult(NOT_FOUND, f"There is no version {version_id} of this table.",
                              current)
        if base_version is None:
            base_version = file.read()[1]
        return file.save(found.text, base_version, who, comment, self,
                         restored_from=found.id)
