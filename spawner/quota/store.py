"""Hot reload of the quota table, keeping the last good version.

The file is checked on every spawn. A valid edit takes effect at once; an
invalid one is logged with file and line and the last good table stays in use.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import ClassVar

from spawner.quota.loader import load_quota_table
from spawner.quota.model import GpuCapacity, Problem, QuotaTable, QuotaTableError
from spawner.registry import Registry


class QuotaStore:
    """One per quota file, shared by all spawners of the hub process."""

    _stores: ClassVar[Registry[str, QuotaStore]] = Registry()

    def __init__(self, path: str):
        self.path = path
        self._lock = threading.Lock()
        self._read = False  # whether the file was read at all, present or not
        self._raw: bytes | None = None
        self._gpus: GpuCapacity | None = None
        self._good: QuotaTable | None = None
        self._good_at = ""  # when the good table was loaded, for the log
        self._problems: list[Problem] = []

    @classmethod
    def for_path(cls, path: str) -> QuotaStore:
        path = os.path.abspath(path)
        return cls._stores.get(path, lambda: cls(path))

    @property
    def problems(self) -> list[Problem]:
        """What was wrong with the file when it was last read; empty if it was good."""
        return list(self._problems)

    def get(
        self, log: logging.Logger | logging.LoggerAdapter, gpus: GpuCapacity | None = None
    ) -> QuotaTable:
        """The current table; blocking (reads the file), so call it in a thread.

        ``gpus`` is the hub's GPU inventory, which roles are checked against.
        Raises QuotaTableError only when no good table was ever loaded.
        """
        with self._lock:
            # Comparing content, not mtime, also catches `cp -p` and same-second edits.
            try:
                raw: bytes | None = Path(self.path).read_bytes()
            except OSError:
                raw = None
            if not self._read or raw != self._raw or gpus != self._gpus:
                self._load(log, gpus)
                self._read, self._raw, self._gpus = True, raw, gpus
            elif self._problems:
                # Logged in full once; after that one line per use, so a stale table
                # never goes unnoticed and the log is not flooded.
                kept = (f"using the last good table loaded at {self._good_at}"
                        if self._good else "no good table yet")
                log.warning("Quota table %s still has %d problem(s); %s",
                            self.path, len(self._problems), kept)
            if self._good is None:
                raise QuotaTableError(self._problems)
            return self._good

    def _load(self, log: logging.Logger | logging.LoggerAdapter, gpus: GpuCapacity | None) -> None:
        try:
            table = load_quota_table(self.path, gpus)
        except QuotaTableError as e:
            self._refuse(log, e.problems)
        except Exception as e:  # a loader bug must not escape to the spawn as a 500
            problem = Problem(self.path, 1,
                              f"could not read the quota table: {type(e).__name__}: {e}")
            self._refuse(log, [problem], e)
        else:
            if self._good is not None:
                log.info("Quota table %s reloaded", self.path)
            self._good = table
            self._good_at = time.strftime("%Y-%m-%d %H:%M:%S")
            self._problems = []

    def _refuse(
        self, log: logging.Logger | logging.LoggerAdapter, problems: list[Problem],
        error: Exception | None = None,
    ) -> None:
        self._problems = problems
        kept = "keeping the last good table" if self._good else "no good table yet"
        log.error("Quota table %s is invalid; %s:\n%s", self.path, kept,
                  "\n".join(str(p) for p in problems), exc_info=error)
