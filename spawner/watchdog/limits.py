"""How many messages about one user a channel gets: a few an hour, then one digest.

One user can make the watchdog tell others a great deal: ask for a role and withdraw it
again and again, or let a kernel be OOM-killed every cycle. So each channel gets at most
``limit`` messages about one user (the user of the incident's server, or who asked for a
role) in a window of ``period`` seconds that begins with the first of them. The rest of
that window's messages are held: counted by kind, and told in ONE digest once the window
has ended (``due``, at the first cycle after). The next message opens a new window.

Which messages count, and on which channels, is the notifier's choice (notify.py): this
module only counts. Pure: the clock is the caller's. The counts are kept with the
incidents (``rules.IncidentBook.messages``), so a restarted watchdog goes on counting and
still sends the digests it owes.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Window:
    """The messages about ``user`` for ``channel`` since ``start``: those sent, and those
    held, by kind ("role-request", "oom", "memory resolved" ...)."""

    channel: str
    user: str
    start: float
    sent: int = 0
    held: dict[str, int] = field(default_factory=dict)

    @property
    def held_count(self) -> int:
        return sum(self.held.values())

    def to_json(self) -> dict[str, Any]:
        return {"channel": self.channel, "user": self.user, "start": self.start,
                "sent": self.sent, "held": dict(sorted(self.held.items()))}

    @classmethod
    def from_json(cls, entry: Any) -> Window:
        if not isinstance(entry, dict):
            raise TypeError(f"not an object: {entry!r}")
        window = cls(channel=entry["channel"], user=entry["user"], start=entry["start"],
                     sent=entry.get("sent", 0), held=dict(entry.get("held") or {}))
        if not (isinstance(window.channel, str) and isinstance(window.user, str)
                and isinstance(window.start, int | float) and math.isfinite(window.start)
                and isinstance(window.sent, int)
                and all(isinstance(k, str) and isinstance(v, int)
                        for k, v in window.held.items())):
            raise ValueError(f"not a window of messages: {entry!r}")
        return window


@dataclass
class MessageLimits:
    """The open windows, by channel and user, and the ended ones whose digest is owed."""

    windows: dict[tuple[str, str], Window] = field(default_factory=dict)
    ended: list[Window] = field(default_factory=list)

    def admit(self, channel: str, user: str, kind: str, now: float, limit: int,
              period: float) -> bool:
        """Whether a message of ``kind`` about ``user`` goes to ``channel`` now (and counts);
        False: it is held for the window's digest. ``limit`` 0: no limit."""
        if limit <= 0:
            return True
        key = (channel, user)
        window = self.windows.get(key)
        if window is not None and now >= window.start + period:
            self._close(key)
            window = None
        if window is None:
            window = self.windows[key] = Window(channel, user, now)
        if window.sent < limit:
            window.sent += 1
            return True
        window.held[kind] = window.held.get(kind, 0) + 1
        return False

    def held(self, channel: str, user: str) -> int:
        """How many messages about ``user`` the open window of ``channel`` holds."""
        window = self.windows.get((channel, user))
        return window.held_count if window else 0

    def due(self, now: float, period: float) -> list[Window]:
        """The windows that have ended and held messages, each told once: their digests.
        The ended windows are forgotten."""
        for key, window in list(self.windows.items()):
            if now >= window.start + period:
                self._close(key)
        owed, self.ended = self.ended, []
        return owed

    def _close(self, key: tuple[str, str]) -> None:
        window = self.windows.pop(key)
        if window.held:
            self.ended.append(window)

    def to_json(self) -> dict[str, Any]:
        return {"windows": [w.to_json() for _, w in sorted(self.windows.items())],
                "ended": [w.to_json() for w in self.ended]}

    @classmethod
    def from_json(cls, data: Any, log: logging.Logger, where: str) -> MessageLimits:
        """The saved counts; an entry that cannot be read is skipped with a warning (its
        held messages stay in the log, untold)."""
        limits = cls()
        if not isinstance(data, dict):
            if data is not None:
                log.warning("Skipping the message counts in %s: not an object", where)
            return limits
        for name in ("windows", "ended"):
            for entry in data.get(name) or ():
                try:
                    window = Window.from_json(entry)
                except (TypeError, ValueError, KeyError) as e:
                    log.warning("Skipping an unreadable window of messages in %s: %s",
                                where, e)
                    continue
                if name == "ended":
                    limits.ended.append(window)
                else:
                    limits.windows[(window.channel, window.user)] = window
        return limits
