"""Hot reload of the quota table, keeping the last good version.

The table is checked on every spawn, where it lives: the quota file (``FileSource``), or
the newest version in the usage ledger's database (spawner/usage/table_versions.py's
``DatabaseSource``, with the setting ``quota_source = "database"``). A valid change takes
effect at once; an invalid one is logged with where it is and its line, and the last good
table stays in use.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Protocol

from spawner.common.registry import Registry
from spawner.quota.loader import load_quota_table
from spawner.quota.model import GpuCapacity, Problem, QuotaTable, QuotaTableError

Log = logging.Logger | logging.LoggerAdapter


@dataclass(frozen=True)
class Loaded:
    """What a source loaded: the table to use, and what ``peek`` sees of the source now
    (another value when loading changed it: a database's first version, seeded).

    ``passed_over``: the problems of what the source holds, when the table is an earlier
    one that is good (a database table's newest good version, with a bad one newer);
    ``runs`` then names that one, for the log ("version 3, the newest good version")."""

    table: QuotaTable
    seen: Hashable
    passed_over: tuple[Problem, ...] = ()
    runs: str = ""


class TableSource(Protocol):
    """Where a store reads the table (blocking)."""

    def peek(self) -> Hashable:
        """What changes whenever the table does, read cheaply: the file's bytes, the newest
        version's id and sha256. May raise when the source cannot be reached."""

    def where(self, seen: Hashable) -> str:
        """The table as the log names it after "Quota table": the file's path."""

    def name(self, seen: Hashable) -> str:
        """What its problems are named by (``Problem.file``): the file's path."""

    def load(self, seen: Hashable, gpus: GpuCapacity | None, log: Log) -> Loaded:
        """The table ``peek`` saw, checked (or, where the source keeps versions, the
        newest good one, with the problems of those passed over); QuotaTableError with
        every problem when there is none to use."""


class FileSource:
    """The quota file, read whole at every look (content, not mtime: ``cp -p`` and
    same-second edits are seen too)."""

    def __init__(self, path: str):
        self.path = path

    def peek(self) -> bytes | None:
        try:
            return Path(self.path).read_bytes()
        except OSError:
            return None

    def where(self, seen: Hashable) -> str:
        return self.path

    def name(self, seen: Hashable) -> str:
        return self.path

    def load(self, seen: Hashable, gpus: GpuCapacity | None, log: Log) -> Loaded:
        return Loaded(load_quota_table(self.path, gpus), seen)


class QuotaStore:
    """One per table (a file, or a table in the ledger's database), shared by all
    spawners of the hub process."""

    _stores: ClassVar[Registry[str, QuotaStore]] = Registry()

    def __init__(self, source: str | TableSource):
        self.source: TableSource = FileSource(source) if isinstance(source, str) else source
        self._lock = threading.Lock()
        self._read = False  # whether the source was read at all, present or not
        self._seen: Hashable = None
        self._gpus: GpuCapacity | None = None
        self._good: QuotaTable | None = None
        self._good_at = ""  # when the good table was loaded, for the log
        self._runs = ""  # the good table's name, when the source's newest is not it
        self._problems: list[Problem] = []

    @classmethod
    def for_path(cls, path: str) -> QuotaStore:
        path = os.path.abspath(path)
        return cls._stores.get(path, lambda: cls(path))

    @classmethod
    def for_source(cls, key: str, make: Callable[[], TableSource]) -> QuotaStore:
        """The store of the source ``make()`` makes, one per ``key`` (which no file's
        absolute path may be)."""
        return cls._stores.get(key, lambda: cls(make()))

    @property
    def problems(self) -> list[Problem]:
        """What was wrong with the table when it was last read; empty if it was good."""
        return list(self._problems)

    def get(self, log: Log, gpus: GpuCapacity | None = None) -> QuotaTable:
        """The current table; blocking (reads the file or the database), so call it in
        a thread.

        ``gpus`` is the hub's GPU inventory, which roles are checked against.
        Raises QuotaTableError only when no good table was ever loaded.
        """
        with self._lock:
            try:
                seen = self.source.peek()
            except Exception as e:  # the database is down: what was good stays good
                return self._unreachable(log, e)
            if not self._read or seen != self._seen or gpus != self._gpus:
                seen = self._load(log, seen, gpus)
                self._read, self._seen, self._gpus = True, seen, gpus
            elif self._problems:
                # Logged in full once; after that one line per use, so a stale table
                # never goes unnoticed and the log is not flooded.
                kept = (f"using {self._runs}" if self._runs else
                        f"using the last good table loaded at {self._good_at}"
                        if self._good else "no good table yet")
                log.warning("Quota table %s still has %d problem(s); %s",
                            self.source.where(seen), len(self._problems), kept)
            if self._good is None:
                raise QuotaTableError(self._problems)
            return self._good

    def _unreachable(self, log: Log, error: Exception) -> QuotaTable:
        where = self.source.where(None)
        why = (str(error) if isinstance(error, QuotaTableError)
               else f"{type(error).__name__}: {error}")
        if self._good is None:
            log.error("Quota table %s cannot be read; no good table yet: %s", where, why)
            raise QuotaTableError(error.problems if isinstance(error, QuotaTableError) else
                                  [Problem(self.source.name(None), 0,
                                           f"cannot be read: {why}")])
        log.warning("Quota table %s cannot be read (%s); using the last good table loaded "
                    "at %s", where, why, self._good_at)
        return self._good

    def _load(self, log: Log, seen: Hashable, gpus: GpuCapacity | None) -> Hashable:
        """Load the table ``seen``; what was loaded, as ``peek`` will see it."""
        try:
            loaded = self.source.load(seen, gpus, log)
        except QuotaTableError as e:
            self._refuse(log, seen, e.problems)
            return seen
        except Exception as e:  # a loader bug must not escape to the spawn as a 500
            problem = Problem(self.source.name(seen), 1,
                              f"could not read the quota table: {type(e).__name__}: {e}")
            self._refuse(log, seen, [problem], e)
            return seen
        seen = loaded.seen
        if loaded.passed_over:
            # an earlier good version instead of a bad newest one: said once, in full
            log.error("Quota table %s is invalid; using %s instead:\n%s",
                      self.source.where(seen), loaded.runs,
                      "\n".join(str(p) for p in loaded.passed_over))
        elif self._good is not None:
            log.info("Quota table %s reloaded", self.source.where(seen))
        self._good = loaded.table
        self._good_at = time.strftime("%Y-%m-%d %H:%M:%S")
        self._problems = list(loaded.passed_over)
        self._runs = loaded.runs if loaded.passed_over else ""
        return seen

    def _refuse(
        self, log: Log, seen: Hashable, problems: list[Problem],
        error: Exception | None = None,
    ) -> None:
        self._problems = problems
        self._runs = ""
        kept = "keeping the last good table" if self._good else "no good table yet"
        log.error("Quota table %s is invalid; %s:\n%s", self.source.where(seen), kept,
                  "\n".join(str(p) for p in problems), exc_info=error)
