"""Text for the watchdog's messages: what users typed, shown as data; times that never raise.

A message is lines of the form ``What: …``, ``Server: …``, ``What to do: …``.
Much of what fills them comes from users: a role request's reason, a
decider's comment, user, role and group names. None of it may start a line
of its own, or it could pass for one of the watchdog's (a fake ``What to
do:``). So every line and title goes through ``one_line`` (control
characters and line breaks shown escaped, as ``\\n``); free text a user typed
is also ``quoted`` (in double quotes, capped with an ellipsis); and a name is
shown bare only when it is plain (``name``).

The hub's event log is another program's file: a time may be out of
``datetime``'s range (a request that starts in the year 318857), NaN or
infinite. ``utc`` and ``duration`` print those as words instead of raising.
"""

from __future__ import annotations

import math
import re
import unicodedata
from datetime import timezone
from typing import Any

from spawner.quota.units import format_moment, human_duration

QUOTE_LIMIT = 300  # characters of a reason or comment in a message; the rest is "…"
NAME_LIMIT = 64  # characters of an odd name
ELLIPSIS = "…"
# Bidirectional overrides and isolates can make a line read in another order than
# it is written; shown escaped like the control characters.
_BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
# A user, role, group or container name shown as it is: letters, digits and . _ @ + -
_PLAIN_NAME = re.compile(r"[\w.@+-]+")


def _unsafe(char: str) -> bool:
    """Control characters (newlines among them), line and paragraph separators, bidi."""
    return unicodedata.category(char) in ("Cc", "Zl", "Zp") or char in _BIDI


def _escaped(char: str) -> str:
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def one_line(text: str) -> str:
    """``text`` with every control character shown escaped (a newline as ``\\n``):
    whatever it holds, it stays one line."""
    if not any(_unsafe(c) for c in text):
        return text
    return "".join(_escaped(c) if _unsafe(c) else c for c in text)


def quoted(value: Any, limit: int = QUOTE_LIMIT) -> str:
    """Text a user typed, as data: in double quotes, on one line (control characters,
    ``"`` and ``\\`` escaped), at most ``limit`` characters of it, then "…"."""
    text = value if isinstance(value, str) else str(value)
    cut = len(text) > limit
    out = []
    for char in text[:limit]:
        if char in '"\\':
            out.append("\\" + char)
        elif _unsafe(char):
            out.append(_escaped(char))
        else:
            out.append(char)
    return '"' + "".join(out) + (ELLIPSIS if cut else "") + '"'


def is_plain(value: str) -> bool:
    return len(value) <= NAME_LIMIT and _PLAIN_NAME.fullmatch(value) is not None


def name(value: Any) -> str:
    """A user, role, group or container name: as it is when plain (``alice``,
    ``gpu-training``, ``quota-alice``), else ``quoted``."""
    text = value if isinstance(value, str) else str(value)
    return text if is_plain(text) else quoted(text, NAME_LIMIT)


def number(value: Any) -> str:
    """A number as ``%g`` writes it (``1e+13``, ``nan``); anything else quoted."""
    try:
        return format(value, "g")
    except (TypeError, ValueError):
        return quoted(repr(value), 40)


def utc(epoch: Any, form: str = "%Y-%m-%d %H:%M:%S UTC") -> str:
    """A moment in UTC, as ``form`` writes it; one ``datetime`` cannot hold (out of
    range, NaN, infinite, not a number) reads "an invalid time (1e+13)"."""
    return format_moment(epoch, timezone.utc, form, zone=False)


def day_and_time(epoch: Any) -> str:
    """'2026-11-18 11:06 UTC', as ``utc`` writes a day and a minute."""
    return utc(epoch, "%Y-%m-%d %H:%M UTC")


def duration(seconds: Any) -> str:
    """``human_duration``, for any number: NaN or infinite is "an unknown time", and
    one beyond a thousand years is written in seconds, not in thousands of days."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) \
            or not math.isfinite(seconds):
        return "an unknown time"
    if seconds > 1000 * 365 * 86400:
        return f"{seconds:g}s"
    return human_duration(seconds)
