"""The usage report (docs/usage.md#the-usage-page): the same report as ``quota-spawner
report``, as tables and charts, with a page per user and CSV/JSON downloads.

- ``GET {prefix}``: the report of a period, by user, role, group or image, with charts.
  It is also the service's front door, where the hub's Services menu leads: a visitor
  who may not see the report is sent on to ``requests``;
- ``GET {prefix}user?name=…``: one user's sessions over time;
- ``GET {prefix}report.csv|json``: the page's report in the CLI's formats.

Who sees what is access.py's: admins and viewers every session, an instructor the
sessions recorded with their classes, and the page of a user only when that user has
sessions there. The ledger is read on the worker threads (spawner/usage/report.py's
queries); the charts are drawn on the server (charts.py).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta, tzinfo
from typing import Any
from urllib.parse import urlencode

from markupsafe import Markup
from tornado import web

from spawner.usage.queries import groups_of_user, ledger_groups
from spawner.usage.report import BY, build_report, daily_gpu_hours, format_report, user_sessions
from spawner.webapp import charts
from spawner.webapp.access import (
    SCOPE,
    Access,
    Refused,
    access_for,
    group_filter,
    user_group,
)
from spawner.webapp.base import PageHandler
from spawner.webapp.formatting import isolate
from spawner.webapp.reader import load_table

log = logging.getLogger("quota_spawner.usage")

PERIODS = {"this-month": "This month", "last-month": "Last month", "30d": "Last 30 days",
           "custom": "From … to …"}
# The days a report may name (docs/security.md#input-limits): the ledger holds nothing
# before 1970, and the day after 9998-12-31 must still be a date.
FIRST_YEAR, LAST_YEAR = 1970, 9998


# --- the period --------------------------------------------------------------------------


@dataclass(frozen=True)
class Window:
    period: str
    since: float
    until: float
    label: str
    since_day: str  # YYYY-MM-DD, the first day
    until_day: str  # YYYY-MM-DD, the last day (inclusive)


def _midnight(d: datetime) -> datetime:
    return d.replace(hour=0, minute=0, second=0, microsecond=0)


def _day(text: str, tz: tzinfo, what: str) -> datetime:
    try:
        found = datetime.strptime(text.strip()[:10], "%Y-%m-%d").replace(tzinfo=tz)
    except ValueError:
        found = None
    if found is None or len(text.strip()) != 10:
        raise Refused(f"The {what} date {text[:40]!r} is not a date like 2025-01-31.", 400)
    if not FIRST_YEAR <= found.year <= LAST_YEAR:
        raise Refused(f"The {what} date {text!r} is out of range: reports cover "
                      f"{FIRST_YEAR}-01-01 to {LAST_YEAR}-12-31.", 400)
    return found


def window(period: str, since: str, until: str, now: float, tz: tzinfo) -> Window:
    """[since, until) of a period picked on the page; ``custom`` takes the two days,
    both included. Refused (400, with a sentence) for dates it cannot read."""
    today = _midnight(datetime.fromtimestamp(now, tz))
    if period == "custom" or (period not in PERIODS and (since or until)):
        first = _day(since, tz, "start") if since else today.replace(day=1)
        last = _day(until, tz, "end") if until else today
        if last < first:
            raise Refused("The end date comes before the start date.", 400)
        end = datetime.combine(last.date() + timedelta(days=1), datetime.min.time(), tzinfo=tz)
        start, period = first, "custom"
        label = f"{first.date().isoformat()} to {last.date().isoformat()}"
    elif period == "last-month":
        end = today.replace(day=1)
        start = (end - timedelta(days=1)).replace(day=1)
        label = start.strftime("%B %Y")
    elif period == "30d":
        end = datetime.fromtimestamp(now, tz)
        start = end - timedelta(days=30)
        label = "the last 30 days"
    else:
        period = "this-month"
        start = today.replace(day=1)
        end = datetime.fromtimestamp(now, tz)
        label = start.strftime("%B %Y") + " so far"
    last_day = (end - timedelta(microseconds=1)).date()
    return Window(period, start.timestamp(), end.timestamp(), label,
                  start.date().isoformat(), last_day.isoformat())


def all_days(w: Window) -> list[str]:
    first = datetime.strptime(w.since_day, "%Y-%m-%d").date()
    last = datetime.strptime(w.until_day, "%Y-%m-%d").date()
    return [(first + timedelta(days=i)).isoformat() for i in range((last - first).days + 1)]


# --- the pages ---------------------------------------------------------------------------------


class ReportHandler(PageHandler):
    """Shared by the report's pages: the visitor's access, the period, the query."""

    def access(self) -> Access:
        model = self.current_user
        found = access_for(model)
        log.debug("Usage page: %s (admin: %s, scopes: %s) sees %s", model.get("name"),
                  model.get("admin"), model.get("scopes"), found)
        if found is None:
            log.info("Usage page: refused %s, neither an admin nor holding %s",
                     model.get("name"), SCOPE)
            raise Refused(self.refused)
        return found

    def window(self) -> Window:
        return window(self.get_argument("period", ""), self.get_argument("since", ""),
                      self.get_argument("until", ""), self.setup.clock(), self.tz)

    async def report_args(self) -> tuple[Access, Window, str, str | None, Any]:
        """What the report page and its downloads both read from a request: the access,
        the window, the grouping, the group filter and the quota table (for advice)."""
        access = self.access()
        w = self.window()
        by = self.get_argument("by", "user")
        if by not in BY:
            by = "user"
        group = group_filter(access, self.get_argument("group", ""))
        table = await self.blocking(load_table, self.setup.quota_store)
        return access, w, by, group, table

    def query(self, **overrides: Any) -> str:
        """This page's query string, with some arguments changed."""
        keep = {k: self.get_argument(k, "") for k in ("period", "since", "until", "by",
                                                         "group", "name")}
        keep.update(overrides)
        return urlencode({k: v for k, v in keep.items() if v})


async def _none() -> None:
    return None


class ReportPage(ReportHandler):
    """GET {prefix}: the report of a period, by user, role, group or image, with charts."""

    @web.authenticated
    async def get(self) -> None:
        if access_for(self.current_user) is None and not self.request.query:
            # the service's front door, from the hub's Services menu: a user who may not
            # see the report lands on what they may do here
            self.redirect(self.prefix + "requests")
            return
        access, w, by, group, table = await self.report_args()
        now = self.setup.clock()
        run = self.reader.run
        main, by_user, days, groups = await asyncio.gather(
            run(lambda e: build_report(e, since=w.since, until=w.until, by=by, table=table,
                                       group=group, now=now)),
            run(lambda e: build_report(e, since=w.since, until=w.until, by="user",
                                       group=group, now=now)) if by != "user" else _none(),
            run(lambda e: daily_gpu_hours(e, since=w.since, until=w.until, group=group,
                                          now=now, tz=self.tz)),
            run(ledger_groups) if access.everything else _none(),
        )
        users = main if by == "user" else by_user
        gpu = users.total.gpu_hours > 0
        colours = charts.colours_for([role for _, role, _, _ in days])

        def rows(hours: str, used: str) -> list[tuple[str, float, float | None]]:
            ordered = sorted(main.rows, key=lambda r: -getattr(r, hours))
            return [(r.key, getattr(r, hours), getattr(r, used)) for r in ordered]

        resources = [("GPU-hours", "gpu_hours", "gpu_used", "gpu"),
                     ("CPU-hours", "cpu_hours", "cpu_used", "cpu"),
                     ("memory GiB-hours", "memory_gib_hours", "memory_used", "memory")]
        if by == "user":  # the top users chart shows it already
            resources = [r for r in resources if r[3] != ("gpu" if gpu else "cpu")]
        figures = {
            "days": charts.gpu_hours_per_day(days, all_days(w), colours),
            "top": charts.top_users(
                [(r.key, r.gpu_hours if gpu else r.cpu_hours, r.gpu_used if gpu else r.cpu_used)
                 for r in users.rows], unit="GPU-hours" if gpu else "CPU-hours"),
            "reserved": [charts.reserved_vs_used(
                rows(hours, used), unit=unit, limit=10,
                title=f"{unit[0].upper()}{unit[1:]} reserved against used, by {by}",
                css_class=f"reserved-used {css}") for unit, hours, used, css in resources],
        }
        self.render_page(
            "report.html", title="Usage", access=access, w=w, by=by, group=group,
            periods=PERIODS, bys=BY, report=main,
            group_choices=groups if access.everything else list(access.groups),
            figures={k: [Markup(s) for s in v] if isinstance(v, list) else Markup(v)
                     for k, v in figures.items()},
            table_missing=table is None,
            user_link=lambda name: f"user?{self.query(name=name, by='')}",
            download=lambda fmt: f"report.{fmt}?{self.query()}")


class UserPage(ReportHandler):
    """GET {prefix}user?name=…: one user's sessions over time."""

    @web.authenticated
    async def get(self) -> None:
        access = self.access()
        name = self.get_argument("name", "")
        if not name:
            raise web.HTTPError(404)
        asked = self.get_argument("group", "")
        member_of = [] if access.everything else await self.reader.run(
            groups_of_user, name, access.groups)
        group = user_group(access, asked, member_of)
        w = self.window()
        now = self.setup.clock()
        table = await self.blocking(load_table, self.setup.quota_store)
        found, report = await asyncio.gather(
            self.reader.run(lambda e: user_sessions(e, name, since=w.since, until=w.until,
                                                    group=group, now=now)),
            self.reader.run(lambda e: build_report(e, since=w.since, until=w.until, by="user",
                                                   table=table, group=group, now=now)))
        row = next((r for r in report.rows if r.key == name), None)
        advice = [a for a in report.advice if a.user == name]
        timeline = charts.session_timeline(found, since=w.since, until=w.until, now=now,
                                           tz=self.tz,
                                           title=f"Sessions of {isolate(name)} over time")
        self.render_page(
            "user.html", title=f"Usage of {isolate(name)}", access=access, w=w, name=name,
            group=group,
            periods=PERIODS, row=row, advice=advice, sessions=found, timeline=Markup(timeline),
            back=f"./?{self.query(name='')}", reason_words=charts.REASON_WORDS, now=now,
            group_choices=member_of if not access.everything else [])


class Download(ReportHandler):
    """GET {prefix}report.csv|json: the page's report in the CLI's formats."""

    @web.authenticated
    async def get(self, fmt: str) -> None:
        access, w, by, group, table = await self.report_args()
        report = await self.reader.run(lambda e: build_report(
            e, since=w.since, until=w.until, by=by, table=table, group=group))
        text = format_report(report, fmt)
        scope = f"-{group}" if group else ""
        filename = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in
                           f"usage-by-{by}{scope}-{w.since_day}-to-{w.until_day}.{fmt}")
        self.set_header("Content-Type", "text/csv; charset=utf-8" if fmt == "csv"
                        else "application/json")
        self.set_header("Content-Disposition", f'attachment; filename="{filename}"')
        self.finish(text)


def routes(prefix: str) -> list[tuple[str, type[web.RequestHandler]]]:
    return [(prefix, ReportPage), (prefix + "user", UserPage),
            (prefix + r"report\.(csv|json)", Download)]
