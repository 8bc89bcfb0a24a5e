"""The watchdog's two disk incidents in words, each told in one place: a home near its
size (``home_disk``) and the filesystem that holds the homes near full
(``homes_filesystem``). rules.py makes an incident's ``What:`` line and the sentence that
ends it with these, notify.py its title and what to do; neither words them itself.
A user's name is shown bare only when plain (``text.name``); sizes as the hub writes
them; the path and the host are the admins' (lines stay one line in notify.py).
"""

from __future__ import annotations

from typing import Any

from spawner.quota.units import format_human
from spawner.watchdog.text import name

HOME_DISK = "home_disk"  # a user's home at or above a share of its size
HOMES_FILESYSTEM = "homes_filesystem"  # the filesystem that holds the homes nearly full
DISK_RULES = (HOME_DISK, HOMES_FILESYSTEM)

# What to do, by rule, for the open and remind messages.
ADVICE = {
    HOME_DISK: (
        "Delete what you no longer need from your home (old checkpoints, datasets you can "
        "fetch again, caches: pip cache purge, conda clean --all, ~/.cache), or ask for a "
        "role with a bigger home. At its size every write fails with \"Disk quota "
        "exceeded\" or \"No space left on device\"; deleting still works."),
    HOMES_FILESYSTEM: (
        "Admins: when this filesystem is full, every home on it stops taking writes, "
        "whatever its size, and so does anything else on it. Free room (the homes of "
        "users who left), grow the filesystem, or keep the homes' sizes within it "
        "(the hub's disk_ratio and disk_reserve; docs/disk.md)."),
}


def _percent(percent: float) -> str:
    return f"{percent:.0f}%"


# --- a home near its size ------------------------------------------------------------------


def home_what(used: int | None, size: int | None, percent: float | None) -> str:
    """The home's numbers, for the ``What:`` line."""
    if used is None or not size or percent is None:
        return "The home's use cannot be read."
    return (f"The home holds {format_human(used)} ({_percent(percent)}) of its size, "
            f"{format_human(size)}.")


def home_cleared(percent: float | None) -> str:
    """Why a home's incident ended, from the reading that ended it."""
    if percent is None:
        return ""
    return f"The home is down to {_percent(percent)} of its size."


HOME_GONE = "The home is gone."


# --- the homes' filesystem nearly full -----------------------------------------------------


def filesystem_what(path: str, used: int | None, free: int | None,
                    reserved: int | None, percent: float | None) -> str:
    """The filesystem's numbers, as df counts them (used of used and free), and what the
    homes' sizes reserve of it."""
    where = f"The homes' filesystem {path}" if path else "The homes' filesystem"
    if used is None or free is None or percent is None:
        return f"{where} cannot be read."
    what = (f"{where} holds {format_human(used)} ({_percent(percent)}), with "
            f"{format_human(free)} free")
    if reserved:
        what += f"; the homes' sizes reserve {format_human(reserved)} of it together"
    return what + "."


def filesystem_cleared(percent: float | None) -> str:
    if percent is None:
        return ""
    return f"The homes' filesystem is down to {_percent(percent)}."


# --- the title and the advice, for notify.py --------------------------------------------------


def subject(incident: Any, numbers: bool = True) -> str:
    """The title's subject, without the kind; ``numbers``: with the percent (not in the
    resolved message's title)."""
    percent = incident.percent
    share = f" at {_percent(percent)}" if numbers and percent is not None else ""
    if incident.rule == HOME_DISK:
        server = incident.server
        whose = f"{name(server.user)}'s home" if server is not None else "a home"
        return f"{whose}{share} of its size" if share else f"{whose} nearly full"
    host = f" on {incident.host}" if incident.host else ""
    return (f"the homes' filesystem{host}{share}" if share
            else f"the homes' filesystem{host} nearly full")


def advice(incident: Any) -> str | None:
    return ADVICE.get(incident.rule)
