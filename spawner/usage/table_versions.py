"""The quota table's versions in the ledger: ``table_versions``, a row per version of the
table that the editor saved or found (spawner/quota/editing.py's ``Trail``), and, with
``quota_source = "database"``, the table every hub process and the usage service read.

``Audit`` blocks (the ledger's database): call it from a thread. ``restore`` saves an
earlier version again through the table's ``save``, with the same checks as any save.

Rows are keyed by ``path``: a file table's absolute path (its editor's history), or a
database table's ``database:<quota_table_name>`` (``editing.database_key``), which is
the same for every process on every machine whatever path the file has there.

``DatabaseSource`` is ``QuotaStore``'s source for a database table: at each look it reads
the newest version's id and sha256 only, and its text when they changed; while the
database has no version, the quota file seeds the first (when it is a valid table). The
table it gives is the newest GOOD version (``newest_good``): a bad version written
around the editor, or one the hub's GPUs refuse, is passed over, logged with its lines,
and never stops a start while an earlier version is good. The editor tells the admin
the same, from the same function.
``table_store`` is the hub's store for its settings, the file's or the database's.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Connection, Engine, insert, select

from spawner.quota.editing import (
    DATABASE_SOURCE,
    FROM_FILE,
    NOT_FOUND,
    EditableTable,
    SaveResult,
    Version,
    database_key,
    trail_key,
    unified_diff,
    version_name,
    version_of,
)
from spawner.quota.loader import parse_quota_table
from spawner.quota.model import GpuCapacity, Problem, QuotaTable, QuotaTableError
from spawner.quota.store import Loaded, QuotaStore
from spawner.usage.ledger import Ledger
from spawner.usage.locks import one_at_a_time
from spawner.usage.schema import table_versions

Log = logging.Logger | logging.LoggerAdapter

# pg_advisory_xact_lock's key for writing the table's versions ("table" in ASCII)
WRITE_LOCK = 0x7461626C65


class Audit:
    """The table's versions in the ledger's database (blocking)."""

    def __init__(self, engine: Engine):
        self.engine = engine

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        """A transaction on the ledger, in which a save records its versions: one at a
        time, from every process and machine, so that two saves on the same base version
        never both go through."""
        with self.engine.begin() as connection:
            # SQLite's write lock too: the reads below see the last save, and no other
            # writer comes between them and this one's
            one_at_a_time(connection, WRITE_LOCK)
            yield connection

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
        values = dict(path=trail_key(path), at=time.time() if at is None else at,
                      who=who, comment=comment, text=text, diff=diff,
                      sha256=sha256 or version_of(text.encode("utf-8")),
                      restored_from=restored_from)
        if connection is not None:
            return int(connection.execute(insert(table_versions).values(
                **values)).inserted_primary_key[0])
        with self.engine.begin() as own:
            return int(own.execute(insert(table_versions).values(
                **values)).inserted_primary_key[0])

    def versions(self, path: str, limit: int = 50, before: int | None = None
                 ) -> list[Version]:
        """The table's versions, newest first; with ``before``, those older than it."""
        query = (select(table_versions).where(table_versions.c.path == trail_key(path))
                 .order_by(table_versions.c.id.desc()).limit(limit))
        if before is not None:
            query = query.where(table_versions.c.id < before)
        with self.engine.connect() as connection:
            return [Version(**row._mapping) for row in connection.execute(query)]

    def version(self, version_id: int) -> Version | None:
        with self.engine.connect() as connection:
            row = connection.execute(
                select(table_versions).where(table_versions.c.id == version_id)).first()
        return Version(**row._mapping) if row is not None else None

    def latest(self, path: str, connection: Connection | None = None) -> Version | None:
        query = (select(table_versions).where(table_versions.c.path == trail_key(path))
                 .order_by(table_versions.c.id.desc()).limit(1))
        if connection is not None:
            row = connection.execute(query).first()
        else:
            with self.engine.connect() as own:
                row = own.execute(query).first()
        return Version(**row._mapping) if row is not None else None

    def newest(self, path: str) -> tuple[int, str] | None:
        """The newest version's id and sha256, without its text: what a hub reads at each
        spawn to tell whether the table changed (one row of the index on path and id)."""
        query = (select(table_versions.c.id, table_versions.c.sha256)
                 .where(table_versions.c.path == trail_key(path))
                 .order_by(table_versions.c.id.desc()).limit(1))
        with self.engine.connect() as connection:
            row = connection.execute(query).first()
        return (int(row.id), str(row.sha256)) if row is not None else None

    def by_sha(self, path: str, sha256: str) -> Version | None:
        """The newest version of the table with these bytes."""
        query = (select(table_versions).where(
            table_versions.c.path == trail_key(path), table_versions.c.sha256 == sha256)
            .order_by(table_versions.c.id.desc()).limit(1))
        with self.engine.connect() as connection:
            row = connection.execute(query).first()
        return Version(**row._mapping) if row is not None else None

    def seed(self, path: str, text: str, seed: str) -> Version:
        """The first version of the database table ``path``: ``text``, the file ``seed``'s,
        unless another process recorded one first (then that one)."""
        with self.transaction() as connection:
            found = self.latest(path, connection)
            if found is None:
                self.record(path=path, who=FROM_FILE,
                            comment=f"the table as it was in {seed}, the database's first "
                            "version", text=text, previous=None, connection=connection)
                found = self.latest(path, connection)
        assert found is not None
        return found

    def restore(self, version_id: int, who: str, comment: str, file: EditableTable,
                base_version: str | None = None) -> SaveResult:
        """Save an earlier version again, through ``file.save`` (the file, or the database
        table's versions): the same validation and the same refusal when the table changed
        since ``base_version`` (None: the table as it is when this is called)."""
        found = self.version(version_id)
        if found is None or found.path != trail_key(file.path):
            current = file.read()[1]
            return SaveResult(NOT_FOUND, f"There is no version {version_id} of this table.",
                              current)
        if base_version is None:
            base_version = file.read()[1]
        return file.save(found.text, base_version, who, comment, self,
                         restored_from=found.id)


# --- the table in the database ----------------------------------------------------------

NEWEST_GOOD = "the newest good version"
PAGE = 20  # versions read at a time while looking back for a good one


@dataclass(frozen=True)
class GoodVersion:
    """The version of a database table that runs: the newest that passes every check,
    and the newer ones passed over because they do not (newest first, with their
    problems)."""

    version: Version
    table: QuotaTable
    passed_over: tuple[tuple[Version, tuple[Problem, ...]], ...] = ()

    @property
    def problems(self) -> tuple[Problem, ...]:
        """Every problem of the versions passed over, newest first."""
        return tuple(p for _, found in self.passed_over for p in found)

    def runs(self) -> str:
        """'version 3, the newest good version', for the log."""
        return f"version {self.version.id}, {NEWEST_GOOD}"


def newest_good(audit: Audit, key: str, gpus: GpuCapacity | None,
                newest: Version | None = None) -> GoodVersion | None:
    """The newest version of the database table ``key`` that is a good table against
    ``gpus`` (the hub's GPU inventory; None: not checked), looking back from ``newest``
    (default: the newest there is); None when there is no version. QuotaTableError
    with the newest's problems when none is good. Blocking."""
    page = [newest] if newest is not None else audit.versions(key, limit=1)
    passed: list[tuple[Version, tuple[Problem, ...]]] = []
    while page:
        for version in page:
            try:
                table = parse_quota_table(version.text, version_name(version.id), gpus)
            except QuotaTableError as e:
                passed.append((version, tuple(e.problems)))
            else:
                return GoodVersion(version, table, tuple(passed))
        page = audit.versions(key, limit=PAGE, before=page[-1].id)
    if passed:
        raise QuotaTableError(list(passed[0][1]))
    return None


NO_LEDGER = ('quota_source is "database", but there is no usage ledger (usage_db is '
             '"none"): the table has nowhere to be')


class DatabaseSource:
    """``QuotaStore``'s source for the database table ``name``: what it saw is the newest
    version's (id, sha256), or, while there is none, ("seed", the file's bytes)."""

    def __init__(self, engine: Callable[[], Engine], name: str, seed: str = ""):
        self._engine = engine  # opened at the first look: the ledger may come later
        self.key = database_key(name)
        self.seed = seed

    def peek(self) -> Hashable:
        found = Audit(self._engine()).newest(self.key)
        if found is not None:
            return found
        try:
            data: bytes | None = Path(self.seed).read_bytes() if self.seed else None
        except OSError:
            data = None
        return ("seed", data)

    def where(self, seen: Hashable) -> str:
        if isinstance(seen, tuple) and isinstance(seen[0], int):
            return f"(database, version {seen[0]})"
        if isinstance(seen, tuple):
            return f"({self.key}, no version yet; its seed {self.seed or '(no file)'})"
        return f"({self.key})"

    def name(self, seen: Hashable) -> str:
        if isinstance(seen, tuple) and isinstance(seen[0], int):
            return version_name(seen[0])
        if isinstance(seen, tuple) and self.seed:
            return self.seed
        return f"quota table ({self.key})"

    def load(self, seen: Hashable, gpus: GpuCapacity | None, log: Log) -> Loaded:
        """The newest good version, looking back from the one ``seen``: a bad newest one
        is passed over with its problems, never served, and never stops the hub while an
        earlier version is good."""
        audit = Audit(self._engine())
        if isinstance(seen, tuple) and isinstance(seen[0], int):
            found = audit.version(seen[0])
            if found is None:  # only a database emptied under the hub: look again
                raise QuotaTableError([Problem(version_name(seen[0]), 0,
                                               "this version is gone from the database")])
        else:
            found = audit.seed(self.key, self._seed_text(seen), self.seed)
            log.info("Quota table (database, version %d): the first version of %s, seeded "
                     "from %s", found.id, self.key, self.seed)
        good = newest_good(audit, self.key, gpus, found)
        assert good is not None  # there is a version: found
        return Loaded(good.table, (found.id, found.sha256), good.problems,
                      good.runs() if good.passed_over else "")

    def _seed_text(self, seen: Hashable) -> str:
        """The file's text, when it is a valid table (its GPUs are checked as any version's,
        once it is one); QuotaTableError with the file's problems, by line, else."""
        data = seen[1] if isinstance(seen, tuple) else None
        if data is None:
            raise QuotaTableError([Problem(
                self.seed or f"quota table ({self.key})", 0,
                "the database has no version of the table yet, and "
                + (f"the file {self.seed} to seed it from cannot be read" if self.seed
                   else "no quota file was given to seed it from"))])
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise QuotaTableError([Problem(self.seed, 1, f"the file is not UTF-8 text: {e}")]
                                  ) from None
        parse_quota_table(text, self.seed)  # a bad file never becomes a version
        return text


class LedgerEngine:
    """The ledger's engine for a hub process's ``DatabaseSource``, opened (created or
    upgraded, as the hub does) at the first look and kept; a failure is tried again at
    the next."""

    def __init__(self, url: str, log: Log, create: bool = True):
        self.url, self.log, self.create = url, log, create
        self._engine: Engine | None = None
        self._lock = threading.Lock()

    def __call__(self) -> Engine:
        with self._lock:
            if self._engine is None:
                if self.url == "none":
                    raise QuotaTableError([Problem("quota table (database)", 0, NO_LEDGER)])
                self._engine = Ledger(self.url, self.log, create=self.create).engine
            return self._engine


def table_store(source: str, quota_file: str, usage_db: str, name: str, log: Log,
                create: bool = True) -> QuotaStore:
    """The process's store of the quota table for these settings (``quota_source``,
    ``quota_file``, the ledger's URL resolved, ``quota_table_name``): the file's, or with
    the database source the database table's, seeded from the file. ``create``: whether
    this process may create or upgrade the ledger (the hub), or only read it."""
    if source != DATABASE_SOURCE:
        return QuotaStore.for_path(quota_file)
    seed = os.path.abspath(quota_file) if quota_file else ""
    key = database_key(name)
    return QuotaStore.for_source(
        f"{DATABASE_SOURCE} {usage_db} {key} {seed}",
        lambda: DatabaseSource(LedgerEngine(usage_db, log, create), name, seed))
