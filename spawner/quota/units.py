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


def format_human(num_bytes: int) -> str:
    """A rounded form for people: '4 GiB', '1.5 GiB', '512 MiB'."""
    value = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{value:.3g} {unit}"
        value /= 1024
    return f"{value:.3g} TiB"


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
