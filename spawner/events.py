"""The hub's event log: one JSON object per line, appended, never rewritten.

The spawner records preemptions and the GPU wait queue here (who, whom, why,
how long); the watchdog tails it to tell the people concerned, and usage
reports read it. docs/preemption.md#the-event-log lists the events and fields.

Each event is written with one ``write`` on a file opened with O_APPEND, so
lines from several threads or processes never interleave, and a reader never
sees half a line as a whole one.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

SCHEMA_VERSION = 1


class EventLog:
    """Appends events to ``path``; an empty path records nothing."""

    def __init__(self, path: str):
        self.path = path
        self._lock = threading.Lock()

    def append(self, event: str, **fields: Any) -> dict[str, Any]:
        """Record ``event`` with ``fields`` and the time; returns what was written.

        Never raises: a full disk must not fail a spawn. Failures are returned
        in the record's ``error`` for the caller to log.
        """
        record = {"version": SCHEMA_VERSION, "time": round(time.time(), 3), "event": event,
                  **fields}
        if not self.path:
            return record
        line = (json.dumps(record, sort_keys=True, default=str) + "\n").encode()
        try:
            with self._lock:
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
                try:
                    os.write(fd, line)
                finally:
                    os.close(fd)
        except OSError as e:
            return {**record, "error": f"could not write {self.path}: {e.strerror}"}
        return record


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
