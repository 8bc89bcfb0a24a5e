"""The class dashboard, for instructors (their classes) and admins (every group)
(docs/class-dashboard.md): its pages, its JSON API, and what a pre-warm may start.

Pages under the service's prefix:

- ``GET classes``: the visitor's classes, each a link to its dashboard;
- ``GET classes/<group>``: the dashboard: each member's server state, role and image,
  last activity, CPU, memory, GPU memory and home (its use of its size, where a watchdog
  reads the homes); open a member's server, stop one or all,
  pre-warm now or at a time, the pre-warm schedules. It is drawn here only, from the same
  snapshot as the API's; ``static/classes.js`` asks the API for it again every
  ``REFRESH_SECONDS``, as HTML, patches its live parts into the page in place
  (``static/live.js``) and sends the actions to the API, with the service's XSRF token.

The JSON API:

- ``GET api/classes``: the visitor's classes (an instructor's groups; admins: every group);
- ``GET api/classes/<g>``: each member's server state, role, image, last activity, CPU
  and memory (the usage ledger's open session), GPU memory (the watchdog's file) and
  home (``home_used``, ``home_limit``: the watchdogs' homes documents, ``disk`` their
  state),
  the role and image pairs every member may start (the pre-warm picker), those only
  some hold with who lacks them, and the class's pre-warm schedules; asked with
  ``Accept: text/html`` only, the dashboard as its page draws it (base.py's ``reply_html``);
- ``POST api/classes/<g>/stop`` ``{users: [...]}`` or ``{all: true}``: stop servers;
- ``POST api/classes/<g>/prewarm`` ``{role, image, at?}``: without ``at`` start every
  member's stopped server now with ``{"profile": role, "image": image}``, reporting per
  user; with ``at`` (epoch seconds) store a schedule (201), which prewarm.py runs;
- ``GET api/classes/<g>/schedules``, ``GET|DELETE api/classes/<g>/schedules/<id>``.

Who may do what is the hub's decision, not this service's: every call to the hub is made
with the visitor's own OAuth token, which carries only the scopes the visitor holds among
the service's allowed ones (spawner/hubconfig/rbac.py's ``CLASS_OAUTH_SCOPES``): an
instructor's ``servers!group=G`` and ``list:users!group=G``. A group the visitor is not an
instructor of (the usage scope's ``!group=`` filters) is refused here before any hub
call; a refusal of the hub is passed on as a sentence. Group and user names are chosen
by people: Jinja escapes them, links carry them URL-encoded, and the script writes them
as text only (its sentences about an action). A pre-warmed server is an ordinary server:
the idle culler stops it if nobody comes.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

from markupsafe import Markup
from tornado import web

from spawner.common.hub_client import HubRefused
from spawner.homes.errors import HomeError
from spawner.homes.names import home_name
from spawner.quota.model import QuotaTable
from spawner.usage import schedules
from spawner.usage.documents import DiskUsage, HomeReading
from spawner.usage.gpu_readings import GpuUsage, read_usage, usage_state
from spawner.usage.queries import open_sessions
from spawner.webapp import inputs
from spawner.webapp.access import (
    NOT_AN_INSTRUCTOR,
    Access,
    Refused,
    class_access,
    class_of,
    names,
)
from spawner.webapp.base import FORMAT_SCRIPT, LIVE_SCRIPT, ApiHandler, PageHandler, Setup
from spawner.webapp.formatting import bdi, isolate, size
from spawner.webapp.hub_api import (
    HubApi,
    default_server,
    groups_of,
    members,
    server_state,
    summary,
)
from spawner.webapp.reader import LedgerReader, NotReady, load_table

log = logging.getLogger("quota_spawner.usage")

REFRESH_SECONDS = 5
NO_TOKEN = "Your login to this page carries no hub token; log in again."
NO_HUB_API = ("The class dashboard needs the hub's API, and this service was not given its "
              "address (JUPYTERHUB_API_URL).")


# --- what a pre-warm may start -----------------------------------------------------------------


def _pairs(table: QuotaTable, user: dict[str, Any]) -> list[tuple[str, str]]:
    return [(c.role.name, c.image.key)
            for c in table.choices_for(str(user["name"]), user.get("groups") or [])]


def common_choices(table: QuotaTable, users: Sequence[dict[str, Any]]) -> list[dict[str, str]]:
    """The role and image pairs every one of ``users`` may start, in the table's order of
    the first user's choices; none for no users."""
    if not users:
        return []
    first = _pairs(table, users[0])
    common = set(first)
    for user in users[1:]:
        common &= set(_pairs(table, user))
    return [{"role": role, "image": image} for role, image in first if (role, image) in common]


def partial_choices(table: QuotaTable, users: Sequence[dict[str, Any]]
                    ) -> list[dict[str, Any]]:
    """The role and image pairs some of ``users`` may start but not all, each with the
    names of those who may not (``lacking``): the page shows why a pair is not offered."""
    held = {str(u["name"]): _pairs(table, u) for u in users}
    every = [pair for pairs in held.values() for pair in pairs]
    found = []
    for pair in dict.fromkeys(every):
        missing = [name for name, pairs in held.items() if pair not in pairs]
        if missing:
            found.append({"role": pair[0], "image": pair[1], "lacking": missing})
    return found


def lacking(table: QuotaTable, users: Sequence[dict[str, Any]], role: str,
            image: str) -> list[str]:
    """The names of those among ``users`` who may not start ``role`` with ``image``."""
    return [str(u["name"]) for u in users if (role, image) not in set(_pairs(table, u))]


# --- a member's row ----------------------------------------------------------------------------


def gpu_memory_by_user(usage: GpuUsage | dict[str, Any] | None, now: float) -> dict[str, int]:
    """Each user's GPU memory (bytes, over all their servers' GPUs) from the watchdogs'
    readings (``read_usage``, usage/gpu_readings.py, or their JSON), when they are fresh;
    else nothing."""
    found_usage = GpuUsage.from_json(usage)
    if found_usage is None or found_usage.state(now) != "fresh":
        return {}
    found: dict[str, int] = {}
    for server in found_usage.servers.values():
        if server.user:
            found[server.user] = found.get(server.user, 0) + int(sum(server.gpu_memory.values()))
    return found


def homes_of(homes: Sequence[DiskUsage | dict[str, Any]], names: Sequence[str],
             now: float) -> tuple[str, dict[str, HomeReading]]:
    """The members' homes from the watchdogs' homes documents (or their JSON), and their
    state: "fresh" when some node's are (only those are read), "stale" when none is,
    "missing" without any. A member's home is the one a server of theirs runs on, else
    the one named as the hub names their home by default (spawner/homes/names.py)."""
    found = [u for u in map(DiskUsage.from_json, homes) if u is not None]
    fresh = sorted((u for u in found if u.state(now) == "fresh"), key=lambda u: u.node)
    state = "fresh" if fresh else "stale" if found else "missing"
    by_user: dict[str, HomeReading] = {}
    by_name: dict[str, HomeReading] = {}
    for usage in fresh:
        for home in usage.homes:
            if home.user is not None:
                by_user.setdefault(home.user, home)
            by_name.setdefault(home.name, home)
    members = {}
    for member in names:
        try:
            named = by_name.get(home_name(member))
        except HomeError:  # a name no home can have
            named = None
        home = by_user.get(member) or named
        if home is not None:
            members[member] = home
    return state, members


def member_row(user: dict[str, Any], used: Mapping[str, dict[str, Any]],
               gpu: Mapping[str, int], gpu_fresh: bool, hub_base: str = "/",
               home: HomeReading | None = None) -> dict[str, Any]:
    """One member of a class, for the dashboard: the hub's server model merged with the
    ledger's session, the watchdog's GPU memory and the member's home (None where not
    known)."""
    name = str(user["name"])
    server = default_server(user) or {}
    options = server.get("user_options") or {}
    state = server_state(user)
    session = used.get(name, {}) if state != "stopped" else {}
    return {
        "name": name,
        "state": state,
        "role": options.get("profile") if server else None,
        "image": options.get("image") if server else None,
        "started": server.get("started"),
        "last_activity": user.get("last_activity") or server.get("last_activity"),
        # escaped as the hub escapes it in its own URLs: a name may hold any character
        "url": (f"{hub_base.rstrip('/')}/user/{quote(name, safe='@~')}/"
                if state == "running" else None),
        "cpu": session.get("cpu"),
        "cpu_peak": session.get("cpu_peak"),
        "cpu_limit": session.get("cpu_limit"),
        "memory": session.get("memory"),
        "memory_peak": session.get("memory_peak"),
        "memory_limit": session.get("memory_limit"),
        "gpu_count": session.get("gpu_count"),
        "gpu_memory": gpu.get(name, 0 if gpu_fresh else None) if state != "stopped" else None,
        "last_seen": session.get("last_seen"),
        "home_used": home.used if home is not None else None,
        "home_limit": home.limit if home is not None else None,
    }


# --- how a row reads, for the template -----------------------------------------------------


def cpu_text(row: dict[str, Any]) -> str:
    if row.get("cpu") is None:
        return "–"
    limit = row.get("cpu_limit")
    return f"{row['cpu']:.2f}" + (f" of {limit:g} cores" if limit else " cores")


def memory_text(row: dict[str, Any]) -> str:
    if row.get("memory") is None:
        return "–"
    limit = row.get("memory_limit")
    return size(row["memory"]) + (f" of {size(limit)}" if limit else "")


def home_text(row: dict[str, Any]) -> str:
    """'3 GiB of 20 GiB', '3 GiB' for a home without a size, or '–'."""
    if row.get("home_used") is None:
        return "–"
    limit = row.get("home_limit")
    return size(row["home_used"]) + (f" of {size(limit)}" if limit else "")


def role_text(row: dict[str, Any]) -> str:
    """'role · image', each name isolated (a <bdi>): the table's names, as written."""
    if not row.get("role"):
        return "–"
    return bdi(row["role"]) + (Markup(" · ") + bdi(row["image"]) if row.get("image") else "")


def class_link(prefix: str, group: str) -> str:
    return f"{prefix}classes/{quote(group, safe='')}"


def dashboard(prefix: str, group: str, found: dict[str, Any], access: Access,
              xsrf: str) -> dict[str, Any]:
    """The values class.html draws the snapshot ``found`` of ``group`` with."""
    return dict(
        title=f"Class {isolate(group)}", group=group, data=found, admin=access.everything,
        classes_link=prefix + "classes", api=class_link(prefix + "api/", group), xsrf=xsrf,
        refresh_ms=REFRESH_SECONDS * 1000, cpu_text=cpu_text, memory_text=memory_text,
        home_text=home_text, role_text=role_text,
        choice_value=lambda c: json.dumps([c["role"], c["image"]]))


# --- the dashboard's snapshot ------------------------------------------------------------------


async def snapshot(setup: Setup, token: str, group: str) -> dict[str, Any]:
    """What the dashboard shows of ``group``, as the hub shows it to ``token``: the
    members' rows, the pre-warm choices (every member's, and those only some hold with
    who lacks them), the GPU file's state and the schedules. HubRefused from the hub."""
    reader: LedgerReader = setup.reader
    found = members(await setup.hub.require(NO_HUB_API).users(token), group)
    member_names = [str(u["name"]) for u in found]
    now = time.time()
    table = await reader.call(load_table, setup.quota_store)
    usage, homes = await reader.call(lambda: _documents(setup, now))
    try:
        used = await reader.run(open_sessions, member_names)
        planned = await reader.run(schedules.of_group, group)
    except NotReady:
        used, planned = {}, []
    gpu = gpu_memory_by_user(usage, now)
    fresh = usage_state(usage, now)
    disk, home = homes_of(homes, member_names, now)
    return {
        "group": group,
        "members": [member_row(u, used, gpu, fresh == "fresh", setup.hub_base,
                               home.get(str(u["name"]))) for u in found],
        "choices": common_choices(table, found) if table else [],
        "partial_choices": partial_choices(table, found) if table else [],
        "table_missing": table is None,
        "gpu_usage": fresh,
        "disk": disk,
        "schedules": planned,
        "now": now,
    }


def _documents(setup: Setup, now: float) -> tuple[GpuUsage | None, list[DiskUsage]]:
    """The watchdogs' readings, merged, and their homes documents (blocking)."""
    documents = setup.documents()
    return read_usage(documents, now), DiskUsage.read_all(documents)


# --- the visitor -------------------------------------------------------------------------------


def hub_refused(e: HubRefused, what: str) -> Refused:
    """The hub's refusal of a visitor's call, as their sentence."""
    if e.status == 599:
        return Refused("The hub did not answer; try again in a moment.", 503)
    status = 403 if e.status == 403 else 502
    return Refused(f"The hub refused to {what} for you"
                   + (f": {e.message}" if e.message else ".")
                   + ("" if status == 403 else f" (HTTP {e.status})"), status)


class ClassVisitor:
    """Shared by the dashboard's pages and endpoints: the visitor's classes, their hub
    token, and the hub's answers to it."""

    setup: Setup
    current_user: Any
    hub_auth: Any
    refused = NOT_AN_INSTRUCTOR

    def mine(self) -> Access:
        found = class_access(self.current_user)
        if found is None:
            log.info("Class dashboard: refused %s", (self.current_user or {}).get("name"))
            raise Refused(NOT_AN_INSTRUCTOR)
        return found

    def group(self, group: str) -> Access:
        """The visitor's access, when they may act on ``group``; else Refused, before
        anything is asked of the hub."""
        return class_of(self.mine(), group)

    def token(self) -> str:
        found = self.hub_auth.get_token(self)
        if not found:
            raise Refused(NO_TOKEN)
        return str(found)

    @property
    def hub(self) -> HubApi:
        return self.setup.hub.require(NO_HUB_API)

    async def visible_groups(self, access: Access) -> list[str]:
        """The classes the visitor sees: an instructor's own; for admins, every group with
        members (read with the admin's token)."""
        if not access.everything:
            return list(access.groups)
        try:
            return groups_of(await self.hub.users(self.token()))
        except HubRefused as e:
            raise hub_refused(e, "list the users") from None

    async def members(self, group: str) -> list[dict[str, Any]]:
        """The group's members as the hub shows them to the visitor's token."""
        try:
            users = await self.hub.users(self.token())
        except HubRefused as e:
            raise hub_refused(e, f"list the members of {group}") from None
        return members(users, group)

    async def snapshot(self, group: str) -> dict[str, Any]:
        try:
            return await snapshot(self.setup, self.token(), group)
        except HubRefused as e:
            raise hub_refused(e, f"list the members of {group}") from None


# --- the pages ---------------------------------------------------------------------------------


class ClassesPage(ClassVisitor, PageHandler):
    """GET {prefix}classes: links to the dashboards of the visitor's classes."""

    page_title = "Classes"

    @web.authenticated
    async def get(self) -> None:
        access = self.mine()
        groups = await self.visible_groups(access)
        self.render_page("classes.html", title="Classes", admin=access.everything,
                         groups=[(g, class_link(self.prefix, g)) for g in groups])


class ClassPage(ClassVisitor, PageHandler):
    """GET {prefix}classes/<group>: the dashboard of one class."""

    page_title = "Classes"
    scripts = (FORMAT_SCRIPT, LIVE_SCRIPT, "classes.js")

    @web.authenticated
    async def get(self, group: str) -> None:
        access = self.mine()
        try:
            class_of(access, group)
        except Refused:
            log.info("Class dashboard page: refused %s the class %s", self.who(), group)
            raise
        found = await self.snapshot(group)
        self.render_page("class.html",
                         **dashboard(self.prefix, group, found, access, self.xsrf()))


# --- the API -----------------------------------------------------------------------------------


class ClassApi(ClassVisitor, ApiHandler):
    """Shared by the dashboard's endpoints."""

    missing = "There is no such class or schedule here."

    def answer(self, results: list[dict[str, Any]], what: str) -> None:
        """Starts' or stops' results; 403 when the hub refused every one."""
        if results and all(r["outcome"] == "refused" for r in results):
            message = results[0]["message"]
            self.reply({"message": f"The hub refused to {what} these servers for you"
                        + (f": {message}" if message else "."), "results": results}, 403)
            return
        self.reply({"results": results})


class ClassesHandler(ClassApi):
    """GET: the visitor's classes."""

    @web.authenticated
    async def get(self) -> None:
        access = self.mine()
        groups = await self.visible_groups(access)
        self.reply({"classes": [{"name": g} for g in groups], "admin": access.everything})


class ClassHandler(ClassApi):
    """GET: a class's members, the pre-warm choices and the schedules; or the dashboard as
    its page draws them."""

    @web.authenticated
    async def get(self, group: str) -> None:
        access = self.group(group)
        found = await self.snapshot(group)
        if self.wants_html():
            self.reply_html("class.html",
                            **dashboard(self.prefix, group, found, access, self.xsrf()))
        else:
            self.reply(found)


class StopHandler(ClassApi):
    """POST {users: [...]} or {all: true}: stop some or every member's server."""

    @web.authenticated
    async def post(self, group: str) -> None:
        self.group(group)
        body = self.body()
        everyone = body.get("all") is True
        asked = body.get("users")
        if not everyone and (not isinstance(asked, list) or not asked
                             or not all(isinstance(n, str) for n in asked)):
            raise Refused("Say whose servers to stop: {\"users\": [names]} or "
                          "{\"all\": true}.", 400)
        found = {str(u["name"]): u for u in await self.members(group)}
        if everyone:
            chosen = [n for n, u in found.items() if server_state(u) != "stopped"]
        else:
            strangers = [n for n in asked if n not in found]
            if strangers:
                raise Refused(f"{names(strangers)} {'is' if len(strangers) == 1 else 'are'}"
                              f" not a member of {group}.", 400)
            chosen = list(dict.fromkeys(asked))
        token = self.token()
        results = await self.hub.stop_servers(token, chosen)
        log.info("Class dashboard: %s stopped servers of %s: %s", self.who(), group,
                 summary(results).replace("\n", "; "))
        self.answer(results, "stop")


class PrewarmHandler(ClassApi):
    """POST {role, image, at?}: start the class's servers now, or schedule it."""

    @web.authenticated
    async def post(self, group: str) -> None:
        self.group(group)
        body = self.body("role", "image")
        role, image, at = body["role"], body["image"], body.get("at")
        now = time.time()
        if at is not None:
            at = inputs.moment(at, "at", now=now, ahead_days=inputs.PREWARM_HORIZON_DAYS,
                               what="the pre-warm's time")
            if at < now - 60:
                raise Refused("That time has passed; pick a time to come, or none for now.",
                              400)
        found = await self.members(group)
        if not found:
            raise Refused(f"{group} has no members you can see.", 404)
        table = await self.blocking(load_table, self.setup.quota_store)
        if table is None:
            raise Refused("The quota table cannot be read, so the roles cannot be "
                          "checked; ask an admin.", 503)
        missing = lacking(table, found, role, image)
        if missing:
            raise Refused(f"Not every member of {group} may start {role} with {image}: "
                          f"{names([isolate(n) for n in missing])} may not. Pick a role "
                          "and image all of them hold.", 400)
        who = self.who()
        if at is not None:
            planned = await self.reader.run(schedules.add, group, role, image, float(at),
                                            who, now)
            log.info("Class dashboard: %s scheduled pre-warm %s of %s (%s, %s) at %s",
                     who, planned["id"], group, role, image, at)
            self.reply(planned, 201)
            return
        results = await self.hub.start_servers(self.token(), found,
                                               {"profile": role, "image": image})
        log.info("Class dashboard: %s pre-warmed %s (%s, %s): %s", who, group, role, image,
                 summary(results).replace("\n", "; "))
        self.answer(results, "start")


class SchedulesHandler(ClassApi):
    """GET: a class's pre-warm schedules."""

    @web.authenticated
    async def get(self, group: str) -> None:
        self.group(group)
        self.reply({"schedules": await self.reader.run(schedules.of_group, group)})


class ScheduleHandler(ClassApi):
    """GET: one schedule. DELETE: cancel it while it is pending."""

    async def _one(self, group: str, schedule_id: str) -> dict[str, Any]:
        found = await self.reader.run(schedules.get,
                                      inputs.record_id(schedule_id, "schedule"))
        if found is None or found["group"] != group:
            raise Refused(f"{group} has no pre-warm schedule {schedule_id}.", 404)
        return found

    @web.authenticated
    async def get(self, group: str, schedule_id: str) -> None:
        self.group(group)
        self.reply(await self._one(group, schedule_id))

    @web.authenticated
    async def delete(self, group: str, schedule_id: str) -> None:
        self.group(group)
        number = inputs.record_id(schedule_id, "schedule")
        cancelled, before = await self.reader.run(schedules.cancel, group, number)
        if before is None:
            raise Refused(f"{group} has no pre-warm schedule {schedule_id}.", 404)
        if not cancelled:
            self.reply({"message": f"The pre-warm is {before} already; only a pending one "
                        "can be cancelled."}, 409)
            return
        log.info("Class dashboard: %s cancelled pre-warm %s of %s", self.who(), schedule_id,
                 group)
        self.reply(await self._one(group, schedule_id))


def routes(prefix: str) -> list[tuple[str, type[web.RequestHandler]]]:
    api = prefix + r"api/classes/([^/]+)"
    return [
        (prefix + "classes", ClassesPage),
        (prefix + r"classes/([^/]+)", ClassPage),
        (prefix + "api/classes", ClassesHandler),
        (api, ClassHandler),
        (api + "/stop", StopHandler),
        (api + "/prewarm", PrewarmHandler),
        (api + "/schedules", SchedulesHandler),
        (api + r"/schedules/(\d+)", ScheduleHandler),
    ]
