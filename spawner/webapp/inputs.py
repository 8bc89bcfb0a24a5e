"""What the usage service's APIs accept: every number, time and id a visitor sends is
checked here against a documented range before anything is stored, and every string
(a JSON body's, keys included, and a query's or a path's) is text a database, a log line
and a page can hold (docs/security.md#input-limits).

One visitor's odd input must never break a page or a message for others: a time
past the year 9999 cannot be formatted, an id past 2**63 - 1 cannot be stored,
NaN passes every comparison, and a lone UTF-16 surrogate ("\\ud800", valid JSON) is no
character at all: UTF-8 cannot encode it, so storing, logging or showing it fails. Each
check raises ``BadInput`` (400, or 413 for a body too large) with a plain sentence, so the
handler writes nothing.
"""

from __future__ import annotations

import json
import math
import re
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
# What no text here may hold: a lone UTF-16 surrogate, which UTF-8 cannot encode, and NUL,
# which PostgreSQL's text refuses. Every other code point is kept as written: names and
# reasons in any script, bidi controls included (the pages isolate them, not refuse them).
NOT_TEXT = re.compile("[\x00\ud800-\udfff]")
# How a JSON field is named in a sentence, where its key alone would not say it.
FIELD_WORDS = {"text": "table's text"}


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


def check_text(value: str, name: str) -> str:
    """``value``, or a 400 naming ``name`` when it holds a code point text cannot hold
    here (``NOT_TEXT``): a lone surrogate, or NUL."""
    found = NOT_TEXT.search(value)
    if found is None:
        return value
    point = ord(found.group())
    what = "a NUL character" if point == 0 else "an unpaired UTF-16 surrogate"
    raise BadInput(f"The {name} holds {what} (U+{point:04X}) at character "
                   f"{found.start() + 1}, which is not text that can be stored; please "
                   "remove it and send it again.")


def _check_strings(value: Any, name: str | None) -> None:
    """Every string in a parsed JSON value, keys included; ``name``: the top-level field
    it is under (None at the top)."""
    if isinstance(value, str):
        check_text(value, FIELD_WORDS.get(name or "", name or "request"))
    elif isinstance(value, dict):
        for key, item in value.items():
            check_text(key, "name of a field" + (f" in {name}" if name else ""))
            _check_strings(item, key if name is None else name)
    elif isinstance(value, list):
        for item in value:
            _check_strings(item, name)


def parse_json(body: bytes) -> Any:
    """The body as JSON, refusing NaN and the infinities (Python's json reads them), and
    any string, key or value, that is not text (``check_text``)."""
    check_body_size(len(body))
    try:
        found = json.loads(body or b"{}", parse_constant=_not_a_number)
    except ValueError as e:
        if "is not a number" in str(e):
            raise BadInput("The request holds NaN or Infinity, which are not numbers "
                           "here.") from None
        raise BadInput("The request is not valid JSON.") from None
    _check_strings(found, None)
    return found


def argument(value: bytes, name: str | None) -> str:
    """A query or path argument of the address, as text: a 400 naming it when its bytes
    are not UTF-8, or decode to what ``check_text`` refuses (%00)."""
    what = f"{name!r} in the address" if name else "address"
    try:
        found = value.decode("utf-8")
    except UnicodeDecodeError:
        raise BadInput(f"The {what} is not UTF-8 text; please check the link.") from None
    return check_text(found, what)


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
    """A string of at most ``limit`` characters, all of them text (``check_text``)."""
    if not isinstance(value, str):
        raise BadInput(f"{name!r} must be a string.")
    if len(value) > limit:
        raise BadInput(f"Please keep the {name} under {limit} characters.")
    return check_text(value, name)
