"""How the web app's pages write sizes, durations, shares and times: one set, for the
templates (as Jinja filters, ``FILTERS``) and for the handlers.

The rules themselves are the hub's (spawner/quota/units.py: ``format_human``,
``human_duration``, ``format_moment``, ``hours_text``), so a page,
the watchdog's messages and the CLI say the same size alike. The pages are drawn here
only; ``static/format.js`` copies the two a script still writes itself, ``moment`` (in
the browser's zone) and ``isolate`` (tests/unit/test_formatting.py runs both on one
table of values). Unknown values (None, NaN) are "–" everywhere.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from datetime import datetime, timezone, tzinfo
from typing import Any

from jinja2 import pass_context
from jinja2.runtime import Context
from markupsafe import Markup, escape

from spawner.quota.units import (
    format_human,
    format_moment,
    hours_text,
    human_duration,
    valid_moment,
)
from spawner.quota.units import size_of as size_of_text

UNKNOWN = "–"
# FIRST STRONG ISOLATE and POP DIRECTIONAL ISOLATE (Unicode TR9): around a name in plain
# text, what the HTML pages do with <bdi>
FSI, PDI = "\u2068", "\u2069"


def _number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def half_up(value: float) -> int:
    """Rounded half up: 0.5 -> 1, 2.5 -> 3 (not Python's round to even)."""
    return math.floor(value + 0.5)


def size(num_bytes: Any) -> str:
    """'512 MiB', '1.5 GiB', '9.31 GiB', '80 GiB'; '–' when unknown."""
    return format_human(num_bytes) if _number(num_bytes) else UNKNOWN


def size_of(used: Any, limit: Any) -> str:
    """A size against its limit: '3 GiB of 20 GiB', '– of 20 GiB' (not measured); '3 GiB'
    or '–' without a limit."""
    return size_of_text(used if _number(used) else None,
                        limit if _number(limit) else None, UNKNOWN)


def duration(seconds: Any) -> str:
    """'45s', '3m20s', '2h05m', '1d4h': the two largest units; '–' when unknown."""
    return human_duration(seconds) if _number(seconds) else UNKNOWN


def percent(fraction: Any) -> str:
    """A share (0 to 1) as '76%'; '–' when unknown (a resource never measured)."""
    return f"{half_up(fraction * 100)}%" if _number(fraction) else UNKNOWN


def hours(value: Any) -> str:
    """GPU-, CPU- or GiB-hours: '0.005', '4.5', '1,234.5', never '0.0' for a short session."""
    return hours_text(value) if _number(value) else UNKNOWN


def moment(epoch: Any, tz: tzinfo = timezone.utc, *, zone: bool = True) -> str:
    """'2026-12-20 14:00 UTC' in ``tz``; '–' when there is none; a time no calendar
    shows (a row stored before the input checks) as 'an invalid time (1e+18)'."""
    if epoch is None or epoch == "":
        return UNKNOWN
    return format_moment(epoch, tz, zone=zone)


def iso(epoch: Any) -> str:
    """The moment for a ``<time datetime>``, in UTC; empty when it cannot be shown."""
    if not valid_moment(epoch):
        return ""
    return format_moment(epoch, timezone.utc, "%Y-%m-%dT%H:%M:%S+00:00", zone=False)


def _epoch_of(text: Any) -> float | None:
    if not text:
        return None
    try:
        found = datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        return None
    return (found if found.tzinfo else found.replace(tzinfo=timezone.utc)).timestamp()


def ago(text: Any, now: float) -> str:
    """The hub's ISO time (its ``last_activity``) as '12 min ago'; 'never' when none."""
    when = _epoch_of(text)
    if when is None:
        return "never"
    seconds = max(0, now - when)
    if seconds < 60:
        return "just now"
    if seconds < 3600:
        return f"{int(seconds // 60)} min ago"
    if seconds < 86400:
        return f"{int(seconds // 3600)} h ago"
    return f"{int(seconds // 86400)} days ago"


def isolate(name: Any) -> str:
    """A name someone chose, isolated for plain text (a sentence, a tooltip, an
    ``<option>``, SVG): its bidi controls stay inside it, so "eve\u202egnp.exe" cannot
    reverse the words after it (Unicode TR36's spoofing), and it reads in the direction
    of its own first letter. In HTML a field is a ``<bdi>`` (``bdi``) or has ``dir="auto"``."""
    return f"{FSI}{name}{PDI}"


def bdi(name: Any) -> Markup:
    """A name someone chose, as an isolated ``<bdi>`` in a line of HTML, escaped."""
    return Markup("<bdi>%s</bdi>") % (name,)


def bdi_names(text: Any, *names: Any) -> Markup:
    """``text``, escaped, with each of ``names`` in it (where it stands as a word) in a
    ``<bdi>``: for a sentence written elsewhere that names users or roles (advice)."""
    found = str(escape(text))
    words = sorted({str(escape(n)) for n in names if n}, key=len, reverse=True)
    if not words:
        return Markup(found)
    pattern = re.compile(r"(?<![\w.@+-])(" + "|".join(map(re.escape, words))
                         + r")(?![\w@+-]|\.\w)")
    return Markup(pattern.sub(r"<bdi>\1</bdi>", found))


@pass_context
def _moment_filter(context: Context, epoch: Any, zone: bool = True) -> str:
    # the page's time zone is the service's, which render_page hands every template
    return moment(epoch, context.get("tz", timezone.utc), zone=zone)


FILTERS: dict[str, Callable[..., str]] = {
    "size": size, "size_of": size_of, "duration": duration, "percent": percent, "hours": hours,
    "moment": _moment_filter, "iso": iso, "ago": ago, "isolate": isolate, "bdi": bdi,
    "bdi_names": bdi_names,
}
