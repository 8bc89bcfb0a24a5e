"""The hub's event log: the ledger database's ``events`` table, or a file of JSON lines.

The spawner records preemptions, the GPU wait queue and budget notices here (who, whom,
why, how long), the web app role requests; the watchdog reads them to tell the people
concerned. Each event is a payload of usage/events.py (its kind and fields);
docs/preemption.md#the-event-log lists them.

With a ledger, each record goes to its database's ``events`` table (usage/event_store.py)
and nowhere else, unless an admin names a file too (``events_file``); without a ledger,
to ``quota-spawner-events.jsonl`` in the state folder (``events_path``).

Each line of a file is written with one ``write`` on a file opened with O_APPEND, so
lines from several processes never interleave, and a reader never sees half a line as
a whole one.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from spawner.common.outages import OutageLog
from spawner.usage.events import HubEvent

if TYPE_CHECKING:
    from spawner.usage.documents import Documents, Kind

SCHEMA_VERSION = 1
EVENTS_FILE = "quota-spawner-events.jsonl"  # the hub's, in its state folder
TABLE = "the ledger's events table"


def events_path(state_dir: str, events_file: str, ledger: bool) -> str:
    """The file an event log appends to: ``events_file`` when an admin names one (relative:
    in ``state_dir``), else none with a ledger (its table holds the log), else
    EVENTS_FILE in ``state_dir``; "" for no file (nor a state folder to put it in)."""
    if events_file:
        return os.path.join(state_dir, events_file) if state_dir else events_file
    if ledger or not state_dir:
        return ""
    return os.path.join(state_dir, EVENTS_FILE)


class EventLog:
    """Appends events to ``store`` (the ledger's table) and to the file ``path``; with
    neither (an empty path, no store) it records nothing.

    The writes happen on one thread of the log's own, in order, so that a slow
    disk or database never holds up the hub's event loop; ``save`` replaces one of
    the hub's state documents (the preemptions in their grace, the pool's snapshot) on
    the same thread, after every event appended before it.
    """

    def __init__(self, path: str, log: logging.Logger | logging.LoggerAdapter | None = None,
                 store: Callable[[dict[str, Any]], None] | None = None):
        self.path = path
        self.log = log or logging.getLogger(__name__)
        # also appends each record to the ledger's database (usage/event_store.py), for
        # processes that share no folder with this one; it blocks, so it runs on the thread
        self.store = store
        self._storing = OutageLog(logging.ERROR)
        self._saving: dict[str, OutageLog] = {}  # by the document's kind
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="quota-events")

    def append(self, event: HubEvent | str, **fields: Any) -> dict[str, Any]:
        """Record ``event`` (a payload of usage/events.py; or a kind's name and its
        ``fields`` as they are, for tools and tests) with the time; returns the record.

        Never raises and never blocks: a full disk must not fail a spawn, so a
        write that fails is logged.
        """
        if isinstance(event, HubEvent):
            fields = {**event.fields(), **fields}
            event = event.kind
        record = {"version": SCHEMA_VERSION, "time": round(time.time(), 3),
                  "event": str(event), **fields}
        if self.store is not None:  # first: the table is the log, a named file a copy
            self._writer.submit(self._stored, record)
        if self.path:
            line = (json.dumps(record, sort_keys=True, default=str) + "\n").encode()
            self._writer.submit(self._append, line)
        return record

    @property
    def where(self) -> str:
        """Where the events go, for the log: the table, the file, both, or nowhere."""
        found = ([TABLE] if self.store is not None else []) + ([self.path] if self.path else [])
        return " and ".join(found) or "nowhere"

    def save(self, documents: Documents, kind: Kind, text: str) -> None:
        """Replace one of the hub's state documents (spawner/usage/documents.py: the database's row,
        or the state folder's file), on the log's thread, after every event before it."""
        self._writer.submit(self._save, documents, kind, text)

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
            self._storing.failed(self.log, e, "Event log: could not add %s to the database "
                                 "(%s: %s)", record.get("event"), type(e).__name__, e)
            return
        self._storing.works(self.log, "Event log: the database takes events again")

    def _save(self, documents: Documents, kind: Kind, text: str) -> None:
        outage = self._saving.setdefault(kind.name, OutageLog(logging.ERROR))
        try:
            documents.write(kind, text)
        except Exception as e:  # logged once until it works again, as the events are
            outage.failed(self.log, e, "Could not save the %s document (%s: %s)", kind.name,
                         type(e).__name__, e)
            return
        outage.works(self.log, "The %s document is saved again", kind.name)


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
