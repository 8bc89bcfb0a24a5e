"""Parse the sizes and durations used in the quota table.

Sizes are binary, as in JupyterHub's ByteSpecification: ``4G`` is 4 * 2**30.
"""

from __future__ import annotations

import math
import re
from datetime import datetime, timezone, tzinfo

_SIZE_UNITS = {
    "": 1,
    "K": 2**10,
    "M": 2**20,
    "G": 2**30,
    "T": 2**40,
    "KiB": 2**10,
    "MiB": 2**20,
    "GiB": 2**30,
    "TiB": 2**40,
}
_DURATION_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600}
_NUMBER_WITH_UNIT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")


def _written_form(units: dict[str, int]) -> str:
    """The JSON Schema pattern of a number with one of ``units`` (or none)."""
    return r"^\s*\d+(\.\d+)?\s*(" + "|".join(u for u in units if u) + r")?\s*$"


SIZE_PATTERN = _written_form(_SIZE_UNITS)  # '4G', '512 MiB', '1.5T'
DURATION_PATTERN = _written_form(_DURATION_UNITS)  # '90', '45s', '1.5h'


def _parse(value: object, units: dict[str, int], what: str) -> int | float:
    if isinstance(value, bool):
        raise ValueError(f"expected a {what}, got a boolean")
    if isinstance(value, int):
        return value  # exact; float() of a huge int would raise OverflowError
    if isinstance(value, float):
        number, unit = value, ""
    elif isinstance(value, str):
        match = _NUMBER_WITH_UNIT.match(value)
        if not match:
            raise ValueError(f"cannot read {value!r} as a {what}")
        number, unit = float(match.group(1)), match.group(2)
    else:
        raise ValueError(f"expected a {what}, got {type(value).__name__}")
    if unit not in units:
        allowed = ", ".join(u for u in units if u)
        raise ValueError(f"unknown unit {unit!r} in {value!r}; use one of {allowed}")
    result = number * units[unit]
    # inf and nan would pass every comparison a caller makes, and int(inf) raises
    # OverflowError; a long enough string of digits also comes out as inf.
    if not math.isfinite(result):
        raise ValueError(f"{value!r} is not a finite {what}")
    return result


def parse_size(value: object) -> int:
    """Bytes from ``4G``, ``512MiB``, ``1.5T`` or a plain number of bytes.

    Raises ValueError for anything else, inf and nan included; no upper bound.
    """
    return int(_parse(value, _SIZE_UNITS, "size"))


def parse_duration(value: object) -> float:
    """Seconds from ``90``, ``45s``, ``30m`` or ``72h``; ValueError for inf and nan."""
    seconds = _parse(value, _DURATION_UNITS, "duration")
    try:
        return float(seconds)
    except OverflowError:  # an int with hundreds of digits
        raise ValueError(f"{value!r} is too large to be a duration") from None


def format_size(num_bytes: int) -> str:
    """The shortest exact binary form: 4294967296 -> '4G', 1536 MiB -> '1536M'."""
    for unit in ("T", "G", "M", "K"):
        factor = _SIZE_UNITS[unit]
        if num_bytes >= factor and num_bytes % factor == 0:
            return f"{num_bytes // factor}{unit}"
    return str(num_bytes)


def format_human(num_bytes: float) -> str:
    """A rounded form for people: '4 GiB', '1.5 GiB', '9.31 GiB', '512 MiB', '1000 MiB'.

    At most three significant digits (two decimals below 10, one below 100, none from
    100 up), rounded half up, trailing zeros dropped, never an exponent. The web app's
    scripts write sizes with the same rule (spawner/webapp/static/format.js), in the
    same float arithmetic, so a page drawn by either reads alike."""
    value = float(num_bytes)
    if value < 0:
        return "-" + format_human(-value)
    unit = "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            break
        value /= 1024
    decimals = 2 if value < 10 else 1 if value < 100 else 0
    scaled = math.floor(value * 10**decimals + 0.5)  # half up, as Math.floor in the script
    whole, part = divmod(scaled, 10**decimals)
    shown = f"{whole}.{part:0{decimals}d}".rstrip("0").rstrip(".") if decimals else str(whole)
    return f"{shown} {unit}"


def size_of(used: float | None, limit: float | None, unknown: str = "-") -> str:
    """A size against its limit, for people: '3 GiB of 20 GiB'; ``unknown`` for what was
    not measured ('- of 20 GiB'); without a limit, the size alone ('3 GiB', '-')."""
    shown = unknown if used is None else format_human(used)
    return shown if limit is None else f"{shown} of {format_human(limit)}"


def human_duration(seconds: float) -> str:
    """'45s', '3m20s', '2h10m', '1d4h': the two largest units, for people."""
    seconds = max(0, math.floor(seconds + 0.5))  # half up: 0.5 s is "1s"
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours}h" if hours else f"{days}d"
    if hours:
        return f"{hours}h{minutes:02d}m" if minutes else f"{hours}h"
    if minutes:
        return f"{minutes}m{secs:02d}s" if secs else f"{minutes}m"
    return f"{secs}s"


def table_duration(seconds: float) -> str:
    """Seconds in the largest unit the table accepts that divides them: 259200 -> '72h',
    600 -> '10m', 90 -> '90s'; so a message's figure can be written back as it is."""
    if seconds and seconds % 3600 == 0:
        return f"{seconds / 3600:g}h"
    if seconds and seconds % 60 == 0:
        return f"{seconds / 60:g}m"
    return f"{seconds:g}s"


INVALID_TIME = "an invalid time"


def format_moment(epoch: float, tz: tzinfo = timezone.utc, pattern: str = "%Y-%m-%d %H:%M",
                  zone: bool = True) -> str:
    """'2026-12-20 14:00 UTC': a moment in ``tz`` for people, with the zone's name when
    ``zone``. Never raises: a time no calendar can show (past the year 9999, NaN, a
    stored row from before the input checks) reads as 'an invalid time (1e+13)'."""
    try:
        moment = datetime.fromtimestamp(epoch, tz)
    except (OverflowError, OSError, ValueError, TypeError):
        try:
            shown = format(epoch, "g")
        except (TypeError, ValueError):
            shown = repr(epoch)[:40]
        return f"{INVALID_TIME} ({shown})"
    text = moment.strftime(pattern)
    return f"{text} {moment.tzname() or tz}" if zone else text


def valid_moment(epoch: float) -> bool:
    """Whether ``format_moment`` can show ``epoch`` as a date."""
    try:
        datetime.fromtimestamp(epoch, timezone.utc)
    except (OverflowError, OSError, ValueError, TypeError):
        return False
    return True


def rfc3339_time(stamp: str | None) -> float | None:
    """An RFC 3339 time as the Docker engine and the Kubernetes API write them
    ("2026-11-30T18:10:01.123456789Z": nanoseconds, Z or an offset) in epoch seconds;
    None when unset ("0001-01-01T00:00:00Z") or unreadable."""
    if not stamp or stamp.startswith("0001-"):
        return None
    main, _, rest = stamp.partition(".")
    zone = rest.lstrip("0123456789") if rest else stamp[19:]
    fraction = float("0." + rest[: len(rest) - len(zone)]) if rest else 0.0
    zone = "+00:00" if zone in ("Z", "") else zone
    try:
        return datetime.fromisoformat(main[:19] + zone).timestamp() + fraction
    except ValueError:
        return None


HOURS_PRECISION = 0.001  # the least amount of hours written as a number


def hours_text(hours: float) -> str:
    """Hours (GPU-, CPU- or GiB-hours) for people: '0.005', '4.5', '200.4', '1,234.5',
    '200' (not '200.0'). Three significant digits below 10, so a small budget or a short
    session keeps its size; one decimal from 10 up, so large ones stay short. Never an
    exponent, and never '0' for an amount that is not 0: below 0.001 it is '<0.001'."""
    if hours < 0:
        return "-" + hours_text(-hours)
    if hours == 0:
        return "0"
    if hours < HOURS_PRECISION:
        return f"<{HOURS_PRECISION:g}"
    # from 0.001 to 10, 'g' with 3 digits writes no exponent and no trailing zeros
    text = f"{hours:.3g}" if hours < 10 else f"{hours:,.1f}"
    return text.removesuffix(".0")
