"""The class dashboard's pages, for instructors (their classes) and admins (every group).

- ``GET {prefix}classes``: the visitor's classes, each a link to its dashboard;
- ``GET {prefix}classes/<group>``: the dashboard: each member's server state, role and
  image, last activity, CPU, memory and GPU memory; open a member's server, stop one or
  all, pre-warm now or at a time, the pre-warm schedules.

The page is rendered here first, from the same snapshot as ``GET api/classes/<g>``
(spawner/webapp/classes.py), then ``static/classes.js`` refreshes it from that API every
few seconds and sends the actions to it, with the service's XSRF token. Who may see and
do what is decided as in the API: a visitor who is neither an admin nor an instructor is
refused with a sentence, an instructor sees their own classes only, and every hub call is
made with the visitor's own OAuth token, so the hub's scopes have the last word.
Group and user names are chosen by people: Jinja escapes them, links carry them
URL-encoded, and the script writes them as text only.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime, timezone
from typing import Any
from urllib.parse import quote

from tornado import web

from spawner.quota.units import format_moment, valid_moment
from spawner.webapp.app import Refused, UsageHandler, _names
from spawner.webapp.classes import (
    ClassConfig,
    ClassVisitor,
    HubRefused,
    snapshot,
)
from spawner.webapp.table_page import PAGE_CSP, static_version

log = logging.getLogger("quota_spawner.usage")

REFRESH_SECONDS = 5


def script_version() -> str:
    return static_version("classes.js")


# --- how a row reads; static/classes.js writes the same text -----------------------------


def size_text(value: float | None) -> str:
    if value is None:
        return "–"
    if value >= 1 << 30:
        return f"{value / (1 << 30):.1f} GiB"
    return f"{round(value / (1 << 20))} MiB"


def cpu_text(row: dict[str, Any]) -> str:
    if row.get("cpu") is None:
        return "–"
    limit = row.get("cpu_limit")
    return f"{row['cpu']:.2f}" + (f" of {limit:g} cores" if limit else " cores")


def memory_text(row: dict[str, Any]) -> str:
    if row.get("memory") is None:
        return "–"
    limit = row.get("memory_limit")
    return size_text(row["memory"]) + (f" of {size_text(limit)}" if limit else "")


def role_text(row: dict[str, Any]) -> str:
    if not row.get("role"):
        return "–"
    return str(row["role"]) + (f" · {row['image']}" if row.get("image") else "")


def _parse_time(text: str | None) -> float | None:
    if not text:
        return None
    try:
        found = datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        return None
    return (found if found.tzinfo else found.replace(tzinfo=timezone.utc)).timestamp()


def ago_text(text: str | None, now: float) -> str:
    """The hub's ISO time as "12 min ago"; "never" when there is none."""
    when = _parse_time(text)
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


def class_link(prefix: str, group: str) -> str:
    return f"{prefix}classes/{quote(group, safe='')}"


# --- the pages ----------------------------------------------------------------------------


class ClassPages(ClassVisitor, UsageHandler):
    """Shared by the two pages: the class dashboard's visitor, and the page's headers."""

    page_title = "Classes"

    def set_default_headers(self) -> None:
        super().set_default_headers()
        self.set_header("Content-Security-Policy", PAGE_CSP)


class ClassesPage(ClassPages):
    """GET {prefix}classes: links to the dashboards of the visitor's classes."""

    @web.authenticated
    async def get(self) -> None:
        access = self.mine()
        groups = await self.visible_groups(access)
        prefix = self.settings["usage_prefix"]
        self.render_page("classes.html", title="Classes", admin=access.everything,
                         groups=[(g, class_link(prefix, g)) for g in groups])


class ClassPage(ClassPages):
    """GET {prefix}classes/<group>: the dashboard of one class."""

    @web.authenticated
    async def get(self, group: str) -> None:
        access = self.mine()
        if not access.everything and group not in access.groups:
            log.info("Class dashboard page: refused %s the class %s",
                     self.current_user.get("name"), group)
            raise Refused(f"You manage the servers of {_names(access.groups)} only, "
                          f"not of {group}.")
        try:
            found = await snapshot(self.config, self.reader, self.settings["usage_quota_file"],
                                   self.token(), group)
        except HubRefused as e:
            raise self.hub_refused(e, f"list the members of {group}") from None
        prefix = self.settings["usage_prefix"]
        now = found["now"]
        self.render_page(
            "class.html", title=f"Class {group}", group=group, data=found,
            admin=access.everything, classes_link=prefix + "classes",
            api=class_link(prefix + "api/", group), xsrf=self.xsrf(),
            refresh_ms=REFRESH_SECONDS * 1000,
            script=f"{prefix}static/classes.js?v={script_version()}",
            cpu_text=cpu_text, memory_text=memory_text, size_text=size_text,
            role_text=role_text, ago=lambda t: ago_text(t, now),
            when=lambda t: format_moment(t, self.tz, zone=False),
            iso=lambda t: format_moment(t, timezone.utc, "%Y-%m-%dT%H:%M:%S+00:00",
                                        zone=False) if valid_moment(t) else "",
            choice_value=lambda c: json.dumps([c["role"], c["image"]]))


def routes(prefix: str, config: ClassConfig | None = None) -> list[tuple[Any, ...]]:
    """The pages' routes, for make_app; ``config`` defaults to the service's environment
    (as the API's does). The script is served by table_page's static route."""
    prefix = prefix if prefix.endswith("/") else prefix + "/"
    extra = {"config": config or ClassConfig.from_environment()}
    return [
        (prefix + "classes", ClassesPage, extra),
        (prefix + r"classes/([^/]+)", ClassPage, extra),
    ]
