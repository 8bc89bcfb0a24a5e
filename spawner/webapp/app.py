"""The usage page: a hub-managed service behind the hub's OAuth (docs/usage.md#the-usage-page).

The same report as ``quota-spawner report``, as tables and charts, with a
page per user and CSV/JSON downloads. Who sees what comes from the OAuth user
model the hub hands over:

- an admin (``admin`` is true), or anyone holding the unfiltered
  ``custom:quota-spawner:usage`` scope, sees every session;
- an instructor holds ``custom:quota-spawner:usage!group=<class>``
  (spawner/hubconfig/rbac.py) and sees only the sessions recorded with that group,
  and the page of a user only when that user has sessions there;
- anyone else is refused; the hub itself refuses those without
  ``access:services!service=usage`` before they reach this process.

Ledger reads run on worker threads, so a slow query never holds the event loop.
``python -m spawner.webapp.app`` runs it; the hub starts it (``usage_service``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone, tzinfo
from importlib.resources import files
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlencode, urlparse
from zoneinfo import ZoneInfo

import jinja2
from jupyterhub.services.auth import HubOAuthCallbackHandler, HubOAuthenticated
from markupsafe import Markup
from sqlalchemy import Engine, exists, select
from sqlalchemy.engine import make_url
from tornado import web
from tornado.httpserver import HTTPServer
from tornado.ioloop import IOLoop

from spawner.hubconfig.rbac import USAGE_SCOPE as SCOPE
from spawner.quota.store import QuotaStore
from spawner.quota.units import format_human, human_duration
from spawner.refusals import hours_text
from spawner.usage.ledger import Ledger, LedgerNotReady, default_url
from spawner.usage.report import BY, build_report, daily_gpu_hours, format_report, user_sessions
from spawner.usage.schema import session_groups, sessions
from spawner.webapp import charts, inputs

T = TypeVar("T")
log = logging.getLogger("quota_spawner.usage")

CUSTOM_SCOPES = {SCOPE: {
    "description": "See the usage page: every session, or with !group= the sessions of "
                   "that group's members.",
}}
DEFAULT_URL = "http://127.0.0.1:8182"
# What the service's own token may read: the table editor's preview needs every user's
# groups and the role of each running server, the role requests the requesters' groups.
SERVICE_SCOPES = ("list:users", "read:users:groups", "read:servers")
PERIODS = {"this-month": "This month", "last-month": "Last month", "30d": "Last 30 days",
           "custom": "From … to …"}
REFUSED = ("The usage page is for admins and for the instructors of a class, and you are "
           "neither. Ask an admin if you need these figures.")
NOT_READY = ("Nothing has been recorded yet: the usage ledger does not exist. The hub creates "
             "it when it starts with a usage ledger set (QuotaSpawner.usage_db); this page "
             "shows its sessions from then on.")
OUTDATED = ("The usage ledger is older than this page: the hub upgrades it when it starts "
            "(or run: quota-spawner ledger upgrade).")


# --- the hub config's side ---------------------------------------------------------------


def usage_service(public_url: str, usage_db: str, quota_file: str, name: str = "usage",
                  url: str = DEFAULT_URL, state_dir: str = "", secret_file: str = "",
                  prefix: str = "quota"
                  ) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The managed service, for c.JupyterHub.services, and two roles for load_roles:
    that of those who may see everything without being admins (no one until a config
    lists them), and the service's own (users, their groups and their servers' roles,
    for the table editor's preview and the role requests; the hub config adds the
    classes' servers, for scheduled pre-warms).

    The hub proxies ``/services/<name>/`` to ``url`` and lists it in its Services menu
    for everyone who holds access to it: with the shipped config, every user, since
    anyone may ask for a bigger role there; its pages check who may see what.

    ``state_dir``: the spawner's, where requests for a role append their events to the
    hub's event log; ``secret_file`` and ``prefix``: the hub's id for those events, as
    the spawner derives it (unless QUOTA_SPAWNER_HUB_ID is set).
    """
    environment = {
        "QUOTA_SPAWNER_USAGE_DB": usage_db,
        "QUOTA_SPAWNER_QUOTA_FILE": quota_file,
        "JUPYTERHUB_PUBLIC_URL": public_url,
    }
    if state_dir:
        environment["QUOTA_SPAWNER_STATE_DIR"] = state_dir
    if secret_file:
        environment["QUOTA_SPAWNER_HUB_SECRET_FILE"] = secret_file
        environment["QUOTA_SPAWNER_PREFIX"] = prefix
    for passed in ("QUOTA_SPAWNER_USAGE_TZ", "QUOTA_SPAWNER_USAGE_LOG_LEVEL",
                   "QUOTA_SPAWNER_HUB_ID"):
        if os.environ.get(passed):
            environment[passed] = os.environ[passed]
    service = {
        "name": name,
        "url": url,
        "command": [sys.executable, "-m", "spawner.webapp.app"],
        "environment": environment,
        # the user model the page gets carries the usage scope, filtered to the user's
        # classes; admins are told by the model's admin field
        "oauth_client_allowed_scopes": [SCOPE],
        # run by the hub's admin: logging in to it asks nobody for a confirmation
        "oauth_no_confirm": True,
    }
    role = {
        "name": f"{name}-viewer",
        "description": "See every session on the usage page without being an admin",
        "scopes": [SCOPE, f"access:services!service={name}"],
        "users": [],
    }
    own = {
        "name": f"{name}-service",
        "description": "Read the users, their groups and their servers, for the quota "
                       "table editor's preview and role requests",
        "scopes": list(SERVICE_SCOPES),
        "services": [name],
    }
    return service, role, own


# --- who sees what -------------------------------------------------------------------------


@dataclass(frozen=True)
class Access:
    """What one visitor may see: everything, or the sessions of some groups."""

    name: str
    everything: bool
    groups: tuple[str, ...] = ()


def access_for(model: dict[str, Any] | None) -> Access | None:
    """The visitor's access from the hub's OAuth user model; None: refused."""
    if not model:
        return None
    scopes = set(model.get("scopes") or ())
    name = str(model.get("name", ""))
    if model.get("admin") is True or SCOPE in scopes:
        return Access(name, everything=True)
    prefix = f"{SCOPE}!group="
    groups = sorted({s[len(prefix):] for s in scopes if s.startswith(prefix)})
    if groups:
        return Access(name, everything=False, groups=tuple(groups))
    return None


def nav_for(model: dict[str, Any], prefix: str) -> list[tuple[str, str]]:
    """The service's pages this visitor may open, as (label, path), for the header.
    Only a guide: each page and API call checks the visitor again."""
    if not model:
        return []
    access = access_for(model)
    links = []
    if access is not None:
        links.append(("Usage", prefix))
    if model.get("admin") is True:
        links += [("Quota table", prefix + "table"), ("GPU map", prefix + "gpus")]
    if model.get("admin") is True or (access is not None and access.groups):
        links.append(("Classes", prefix + "classes"))
    links.append(("Role requests", prefix + "requests"))
    return links


class Refused(web.HTTPError):
    """A request this visitor may not make (403), or cannot (400); the sentence says why."""

    def __init__(self, sentence: str, status: int = 403):
        super().__init__(status, reason="Forbidden" if status == 403 else "Bad Request")
        self.sentence = sentence

    def __str__(self) -> str:
        return self.sentence


class NotReady(web.HTTPError):
    """The ledger is not there yet, or older than this code (503)."""

    def __init__(self, sentence: str) -> None:
        super().__init__(503)
        self.sentence = sentence


def group_filter(access: Access, asked: str | None) -> str | None:
    """The group a report is filtered to: the one asked for if allowed, else an
    instructor's first class; None (every session) only for those who see everything."""
    asked = asked or None
    if access.everything:
        return asked
    if asked is None:
        return access.groups[0]
    if asked not in access.groups:
        raise Refused(f"You can see the usage of {_names(access.groups)} only.")
    return asked


def user_group(access: Access, asked: str | None, user_groups: Sequence[str]) -> str | None:
    """The group a user's page is filtered to, or Refused. ``user_groups``: the groups
    the user's sessions were ever recorded with (only read for instructors)."""
    if access.everything:
        return asked or None
    mine = [g for g in access.groups if g in set(user_groups)]
    if asked and asked in mine:
        return asked
    if asked and asked not in access.groups:
        raise Refused(f"You can see the usage of {_names(access.groups)} only.")
    if not mine:
        raise Refused(f"You can see the usage of the members of {_names(access.groups)} "
                      "only, and this user has no sessions there.")
    return mine[0]


def _names(groups: Sequence[str]) -> str:
    groups = list(groups)
    return groups[0] if len(groups) == 1 else ", ".join(groups[:-1]) + " and " + groups[-1]


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


# The days a report may name (docs/security.md#input-limits): the ledger holds nothing
# before 1970, and the day after 9998-12-31 must still be a date.
FIRST_YEAR, LAST_YEAR = 1970, 9998


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


# --- the ledger, read on threads ------------------------------------------------------------


class _Missing(Exception):
    """The ledger's SQLite file is not there."""


class LedgerReader:
    """Opens the ledger once it exists, then answers queries on worker threads."""

    def __init__(self, url: str, threads: int = 4):
        self.url = url
        self._engine: Engine | None = None
        self._opening = threading.Lock()  # the first page's queries all arrive at once
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="usage-page")

    def _open(self) -> Engine:
        with self._opening:
            if self._engine is None:
                parsed = make_url(self.url)
                if (parsed.get_backend_name() == "sqlite" and parsed.database
                        and parsed.database != ":memory:"
                        and not Path(parsed.database).exists()):
                    raise _Missing(parsed.database)  # a reader must not create the hub's file
                ledger = Ledger(self.url, log, create=False)
                self._engine = ledger.engine
            return self._engine

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the worker threads, without the ledger (files)."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        def call() -> T:
            return fn(self._open(), *args, **kwargs)

        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, call)
        except _Missing:
            raise NotReady(NOT_READY) from None
        except LedgerNotReady as e:
            log.warning("Usage page: %s", e)
            raise NotReady(OUTDATED) from None


def ledger_groups(engine: Engine) -> list[str]:
    with engine.connect() as connection:
        return [r[0] for r in connection.execute(
            select(session_groups.c.group_name).distinct().order_by(session_groups.c.group_name))]


def groups_of_user(engine: Engine, user: str, among: Sequence[str]) -> list[str]:
    """Which of ``among`` the user's sessions were ever recorded with."""
    found = []
    with engine.connect() as connection:
        for group in among:
            query = select(exists().where(
                sessions.c.user_name == user, session_groups.c.session_id == sessions.c.id,
                session_groups.c.group_name == group))
            if connection.execute(query).scalar():
                found.append(group)
    return found


# --- pages ----------------------------------------------------------------------------------


def _templates() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(files(__package__).joinpath("templates"))),
        autoescape=True, trim_blocks=True, lstrip_blocks=True,
        undefined=jinja2.StrictUndefined)
    env.filters["share"] = lambda v: "–" if v is None else f"{v:.0%}"
    env.filters["hours"] = hours_text  # 0.005, 4.5, 1,234.5: never 0.0 for a short session
    env.filters["size"] = lambda v: "–" if v is None else format_human(int(v))
    env.filters["duration"] = human_duration
    return env


CSP = ("default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; "
       "form-action 'self'; frame-ancestors 'self'; base-uri 'none'")


class UsageHandler(HubOAuthenticated, web.RequestHandler):
    """Shared by the pages: the visitor's access, the period, rendering, refusals."""

    page_title = "Usage"  # what a refusal of this page is titled

    @property
    def reader(self) -> LedgerReader:
        return self.settings["usage_reader"]

    @property
    def tz(self) -> tzinfo:
        return self.settings["usage_tz"]

    async def prepare(self) -> None:
        inputs.check_body_size(len(self.request.body or b""))
        # fetch the user model without blocking the loop; current_user then reads the cache
        await self.hub_auth.get_user(self, sync=False)

    def set_default_headers(self) -> None:
        self.set_header("Content-Security-Policy", CSP)
        self.set_header("Cache-Control", "no-store")
        self.set_header("X-Content-Type-Options", "nosniff")
        self.set_header("Referrer-Policy", "same-origin")

    def access(self) -> Access:
        model = self.current_user
        found = access_for(model)
        log.debug("Usage page: %s (admin: %s, scopes: %s) sees %s", model.get("name"),
                  model.get("admin"), model.get("scopes"), found)
        if found is None:
            log.info("Usage page: refused %s, neither an admin nor holding %s",
                     model.get("name"), SCOPE)
            raise Refused(REFUSED)
        return found

    def xsrf(self) -> str:
        """The XSRF token the pages send back as X-XSRFToken, as text."""
        token = self.xsrf_token
        return token.decode() if isinstance(token, bytes) else str(token)

    def window(self) -> Window:
        return window(self.get_argument("period", ""), self.get_argument("since", ""),
                      self.get_argument("until", ""), _now(), self.tz)

    async def report_args(self) -> tuple[Access, Window, str, str | None, Any]:
        """What the report page and its downloads both read from a request: the access,
        the window, the grouping, the group filter and the quota table (for advice)."""
        access = self.access()
        w = self.window()
        by = self.get_argument("by", "user")
        if by not in BY:
            by = "user"
        group = group_filter(access, self.get_argument("group", ""))
        table = await asyncio.get_running_loop().run_in_executor(
            None, _load_table, self.settings["usage_quota_file"])
        return access, w, by, group, table

    def query(self, **overrides: Any) -> str:
        """This page's query string, with some arguments changed."""
        keep = {k: self.get_argument(k, "") for k in ("period", "since", "until", "by",
                                                         "group", "name")}
        keep.update(overrides)
        return urlencode({k: v for k, v in keep.items() if v})

    def render_page(self, template: str, status: int = 200, **values: Any) -> None:
        prefix = self.settings["usage_prefix"]
        # the cache: an error page must not ask the hub again
        model = getattr(self, "_hub_auth_user_cache", None) or {}
        self.set_status(status)
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.finish(self.settings["usage_templates"].get_template(template).render(
            prefix=prefix, hub_home=self.settings["usage_hub_home"],
            who=model.get("name", ""), nav=nav_for(model, prefix),
            here=self.request.path, tz_name=str(self.tz), **values))

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        error = kwargs.get("exc_info", (None, None, None))[1]
        sentence = getattr(error, "sentence", None)  # Refused, NotReady, inputs.BadInput
        if sentence is not None:
            pass
        elif status_code == 403:  # HubOAuthenticated refused the user model
            sentence = REFUSED
        elif status_code == 404:
            sentence = "There is no such page here."
        elif status_code == 400:
            sentence = "The page was asked for with arguments it cannot read."
        else:
            sentence = ("The page could not be shown because of an error; "
                        "the service's log has the details.")
        self.render_page("message.html", status=status_code, title=self.page_title,
                         sentence=sentence)


def _now() -> float:
    return datetime.now(timezone.utc).timestamp()


def _load_table(quota_file: str) -> Any:
    if not quota_file:
        return None
    try:
        return QuotaStore.for_path(quota_file).get(log)
    except Exception as e:  # advice needs the table; the rest of the page does not
        log.warning("Usage page: no quota table for the advice: %s", e)
        return None


class ReportPage(UsageHandler):
    """GET {prefix}: the report of a period, by user, role, group or image, with charts."""

    @web.authenticated
    async def get(self) -> None:
        if access_for(self.current_user) is None and not self.request.query:
            # the service's front door, from the hub's Services menu: a user who may not
            # see the report lands on what they may do here
            self.redirect(self.settings["usage_prefix"] + "requests")
            return
        access, w, by, group, table = await self.report_args()
        now = _now()
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


async def _none() -> None:
    return None


class UserPage(UsageHandler):
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
        now = _now()
        table = await asyncio.get_running_loop().run_in_executor(
            None, _load_table, self.settings["usage_quota_file"])
        found, report = await asyncio.gather(
            self.reader.run(lambda e: user_sessions(e, name, since=w.since, until=w.until,
                                                    group=group, now=now)),
            self.reader.run(lambda e: build_report(e, since=w.since, until=w.until, by="user",
                                                   table=table, group=group, now=now)))
        row = next((r for r in report.rows if r.key == name), None)
        advice = [a for a in report.advice if a.user == name]
        timeline = charts.session_timeline(found, since=w.since, until=w.until, now=now,
                                           tz=self.tz, title=f"Sessions of {name} over time")
        self.render_page(
            "user.html", title=f"Usage of {name}", access=access, w=w, name=name, group=group,
            periods=PERIODS, row=row, advice=advice, sessions=found, timeline=Markup(timeline),
            when=lambda t: "–" if not t else datetime.fromtimestamp(t, self.tz).strftime(
                "%Y-%m-%d %H:%M"),
            back=f"./?{self.query(name='')}", reason_words=charts.REASON_WORDS, now=now,
            group_choices=member_of if not access.everything else [])


class Download(UsageHandler):
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


def make_app(*, usage_db: str, quota_file: str = "", prefix: str = "/services/usage/",
             hub_base: str = "/", tz: tzinfo = timezone.utc, hub_api_url: str = "",
             hub_api_token: str = "", **settings: Any) -> web.Application:
    """The service's app. ``hub_api_url`` and ``hub_api_token`` read the hub's users for
    the table editor's preview; ``table_directory`` in ``settings`` replaces that read."""
    from spawner.webapp import class_page, requests_page, table_page
    from spawner.webapp import classes as class_api
    from spawner.webapp import gpus as gpu_page
    from spawner.webapp import requests as requests_api
    from spawner.webapp.table import hub_directory, table_routes

    prefix = prefix if prefix.endswith("/") else prefix + "/"
    settings.setdefault("table_directory", hub_directory(hub_api_url, hub_api_token))
    return web.Application([
        *table_routes(prefix),
        *table_page.routes(prefix),
        *gpu_page.routes(prefix),
        *class_page.routes(prefix),
        *requests_page.routes(prefix),
        *class_api.routes(prefix, settings.pop("class_config", None)),
        *requests_api.routes(prefix, **{
            "quota_file": quota_file or None, "hub_api_url": hub_api_url or None,
            "hub_api_token": hub_api_token or None, **settings.pop("requests_options", {})}),
        (prefix, ReportPage),
        (prefix + "user", UserPage),
        (prefix + r"report\.(csv|json)", Download),
        (prefix + "oauth_callback", HubOAuthCallbackHandler),
        (prefix.rstrip("/"), web.RedirectHandler, {"url": prefix}),
    ], cookie_secret=os.urandom(32), usage_reader=LedgerReader(usage_db),
        usage_quota_file=quota_file, usage_prefix=prefix, usage_tz=tz,
        usage_hub_home=hub_base.rstrip("/") + "/hub/home",
        usage_templates=_templates(), **settings)


def main() -> None:
    logging.basicConfig(level=os.environ.get("QUOTA_SPAWNER_USAGE_LOG_LEVEL", "INFO").upper(),
                        format="[%(levelname).1s %(asctime)s quota-spawner usage] %(message)s")
    logging.getLogger("alembic").setLevel(logging.WARNING)  # its revision check, each start
    tz_name = os.environ.get("QUOTA_SPAWNER_USAGE_TZ", "UTC")
    tz: tzinfo = timezone.utc if tz_name.upper() == "UTC" else ZoneInfo(tz_name)
    app = make_app(
        usage_db=os.environ.get("QUOTA_SPAWNER_USAGE_DB") or default_url(),
        quota_file=os.environ.get("QUOTA_SPAWNER_QUOTA_FILE", ""),
        prefix=os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/services/usage/"),
        hub_base=os.environ.get("JUPYTERHUB_BASE_URL", "/"), tz=tz,
        hub_api_url=os.environ.get("JUPYTERHUB_API_URL", ""),
        hub_api_token=os.environ.get("JUPYTERHUB_API_TOKEN", ""))
    from spawner.webapp.classes import ClassConfig, Prewarmer

    Prewarmer(ClassConfig.from_environment(), app.settings["usage_reader"]).start()
    bind = urlparse(os.environ.get("JUPYTERHUB_SERVICE_URL", DEFAULT_URL))
    # a body past inputs.MAX_BODY gets a 413 with a sentence; this cap ends the rest early
    server = HTTPServer(app, xheaders=True, max_body_size=inputs.MAX_BODY_HARD)
    server.listen(bind.port or 80, bind.hostname or "127.0.0.1")
    log.info("Usage page at %s, serving %s", bind.geturl(),
             os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/services/usage/"))
    try:
        IOLoop.current().start()
    except KeyboardInterrupt:  # the hub stopping its services: not an error
        log.info("Usage page stopped")


if __name__ == "__main__":
    main()
