"""The hub's event log: one JSON object per line, appended, never rewritten.

The spawner records preemptions and the GPU wait queue here (who, whom, why,
how long); the watchdog tails it to tell the people concerned, and usage
reports read it. docs/preemption.md#the-event-log lists the events and fields.
With a ledger, each record also goes to its database's ``events`` table
(usage/event_store.py), which a watchdog that shares no folder with the hub reads.

Each event is written with one ``write`` on a file opened with O_APPEND, so
lines from several processes never interleave, and a reader never sees half
a line as a whole one.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

SCHEMA_VERSION = 1
EVENTS_FILE = "quota-spawner-events.jsonl"  # the hub's, in its state folder


class EventLog:
    """Appends events to ``path``; an empty path records nothing.

    The writes happen on one thread of the log's own, in order, so that a slow
    disk never holds up the hub's event loop; ``replace`` writes a whole small
    file (the preemptions in their grace) on the same thread, after every
    event appended before it.
    """

    def __init__(self, path: str, log: logging.Logger | logging.LoggerAdapter | None = None,
                 store: Callable[[dict[str, Any]], None] | None = None):
        self.path = path
        self.log = log or logging.getLogger(__name__)
        # also appends each record to the ledger's database (usage/event_store.py), for
        # processes that share no folder with this one; it blocks, so it runs on the thread
        self.store = store
        self._store_error = ""
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="quota-events")

    def append(self, event: str, **fields: Any) -> dict[str, Any]:
        """Record ``event`` with ``fields`` and the time; returns the record.

        Never raises and never blocks: a full disk must not fail a spawn, so a
        write that fails is logged.
        """
        record = {"version": SCHEMA_VERSION, "time": round(time.time(), 3), "event": event,
                  **fields}
        if self.store is not None:  # first: a record in the file is in the database too
            self._writer.submit(self._stored, record)
        if self.path:
            line = (json.dumps(record, sort_keys=True, default=str) + "\n").encode()
            self._writer.submit(self._append, line)
        return record

    def replace(self, path: str, text: str) -> None:
        """Write ``path`` whole (atomically: a temporary file renamed over it)."""
        self._writer.submit(self._replace, path, text)

    def flush(self) -> None:
        """Wait until every write asked for so far is done."""
        self._writer.submit(lambda: None).result()

    def _append(self, line: bytes) -> None:
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
            try:
                os.write(fd, line)
            finally:
                os.close(fd)
        except OSError as e:
            self.log.error("Event log: could not write %s: %s", self.path, e.strerror)

    def _stored(self, record: dict[str, Any]) -> None:
        assert self.store is not None
        try:
            self.store(record)
        except Exception as e:  # logged once until it works again: a spawn never fails on it
            if str(e) != self._store_error:
                self.log.error("Event log: could not add %s to the database (%s: %s)",
                               record.get("event"), type(e).__name__, e)
                self._store_error = str(e)
            return
        if self._store_error:
            self.log.info("Event log: the database takes events again")
            self._store_error = ""

    def _replace(self, path: str, text: str) -> None:
        try:
            write_atomically(path, text)
        except OSError as e:
            self.log.error("Could not write %s: %s", path, e.strerror)


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


def read_events(path: str, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
    """The whole events after byte ``offset``, and the offset to read from next.

    A line not yet finished is left for the next read; a line that is not JSON
    is skipped. A file shorter than ``offset`` (rotated or truncated) is read
    from its start.
    """
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < offset:
                offset = 0
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], 0
    end = data.rfind(b"\n") + 1
    events = []
    for line in data[:end].splitlines():
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            events.append(value)
    return events, offset + end
