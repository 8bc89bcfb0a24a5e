"""What the usage service's APIs accept: every number, time and id a visitor sends is
checked here against a documented range before anything is stored
(docs/security.md#input-limits).

One visitor's odd input must never break a page or a message for others: a time
past the year 9999 cannot be formatted, an id past 2**63 - 1 cannot be stored,
and NaN passes every comparison. Each check raises ``BadInput`` (400, or 413 for a
body too large) with a plain sentence, so the handler writes nothing.
"""

from __future__ import annotations

import json
import math
from typing import Any

from spawner.webapp.access import Refused

# The largest id the ledger's databases store (SQLite INTEGER, PostgreSQL BIGINT).
MAX_ID = 2**63 - 1
# The largest request body, in bytes. A quota table of a few thousand users is far
# smaller; the hard cap of the HTTP server (MAX_BODY_HARD) answers a bare 400.
MAX_BODY = 1 << 20
MAX_BODY_HARD = 16 << 20
DAY = 86400.0
# How far ahead a class's pre-warm may be scheduled (a role request's start has its
# own rule, spawner/usage/grants.py's REQUEST_HORIZON_DAYS).
PREWARM_HORIZON_DAYS = 366
# Free text a visitor writes that others read.
MAX_COMMENT = 2000  # characters: a decision's comment, a table save's comment


class BadInput(Refused):
    """What a visitor sent is out of range (400), or too large (413); ``sentence`` says
    what was wrong, for them."""

    def __init__(self, sentence: str, status: int = 400):
        super().__init__(sentence, status)


def check_body_size(length: int) -> None:
    """413 for a request body over ``MAX_BODY`` bytes."""
    if length > MAX_BODY:
        raise BadInput(f"The request is {length:,} bytes; this service takes at most "
                       f"{MAX_BODY:,} bytes ({MAX_BODY >> 20} MiB).", 413)


def _not_a_number(name: str) -> Any:
    raise ValueError(f"{name} is not a number")


def parse_json(body: bytes) -> Any:
    """The body as JSON, refusing NaN and the infinities (Python's json reads them)."""
    check_body_size(len(body))
    try:
        return json.loads(body or b"{}", parse_constant=_not_a_number)
    except ValueError as e:
        if "is not a number" in str(e):
            raise BadInput("The request holds NaN or Infinity, which are not numbers "
                           "here.") from None
        raise BadInput("The request is not valid JSON.") from None


def record_id(text: str | int, what: str = "record") -> int:
    """An id from a URL or a body: a whole number from 1 to ``MAX_ID``."""
    try:
        found = int(text)
    except (TypeError, ValueError):
        found = 0
    if isinstance(text, bool) or not 1 <= found <= MAX_ID:
        shown = str(text)[:30] + ("…" if len(str(text)) > 30 else "")
        raise BadInput(f"{shown!r} is not a {what} id: ids are whole numbers from 1 to "
                       f"{MAX_ID}.")
    return found


def number(value: Any, name: str, meaning: str) -> float:
    """A finite JSON number (not a boolean); ``meaning`` says what it should be."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadInput(f"The request needs {name!r}, as {meaning}.")
    try:
        found = float(value)
    except OverflowError:  # an integer of hundreds of digits
        found = math.inf
    if not math.isfinite(found):
        raise BadInput(f"{name!r} must be a finite number: {meaning}.")
    return found


def moment(value: Any, name: str, *, now: float, ahead_days: float,
           what: str = "the time") -> float:
    """A time in Unix seconds, at most ``ahead_days`` after ``now`` and not before 1970."""
    found = number(value, name, "a time in Unix seconds")
    latest = now + ahead_days * DAY
    if found < 0:
        raise BadInput(f"{what.capitalize()} is before 1970; give a time in Unix seconds.")
    if found > latest:
        raise BadInput(f"{what.capitalize()} is more than {ahead_days:g} days ahead; "
                       f"this hub takes times up to {ahead_days:g} days from now.")
    return found


def text(value: Any, name: str, limit: int) -> str:
    """A string of at most ``limit`` characters."""
    if not isinstance(value, str):
        raise BadInput(f"{name!r} must be a string.")
    if len(value) > limit:
        raise BadInput(f"Please keep the {name} under {limit} characters.")
    return value
