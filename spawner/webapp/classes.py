"""The class dashboard's JSON API in the usage service: instructors, for their classes only.

Routes under the service's prefix (``routes(prefix, config)``):

- ``GET api/classes``: the visitor's classes (an instructor's groups; admins: every group);
- ``GET api/classes/<g>``: each member's server state, role, image, last activity, CPU
  and memory (the usage ledger's open session) and GPU memory (the watchdog's file),
  the role and image pairs every member may start (the pre-warm picker), those only
  some hold with who lacks them, and the class's pre-warm schedules;
- ``POST api/classes/<g>/stop`` ``{users: [...]}`` or ``{all: true}``: stop servers;
- ``POST api/classes/<g>/prewarm`` ``{role, image, at?}``: without ``at`` start every
  member's stopped server now with ``{"profile": role, "image": image}``, reporting per
  user; with ``at`` (epoch seconds) store a schedule (201);
- ``GET api/classes/<g>/schedules``, ``DELETE api/classes/<g>/schedules/<id>``.

Who may do what is the hub's decision, not this service's: every call to the hub is made
with the visitor's own OAuth token, which carries only the scopes the visitor holds among
the service's allowed ones (``CLASS_OAUTH_SCOPES``): an instructor's ``servers!group=G``
and ``list:users!group=G``. A group the visitor is not an instructor of (the usage
scope's ``!group=`` filters, spawner/hubconfig/rbac.py) is refused here before any hub call; a
refusal of the hub is passed on as a sentence. Scheduled pre-warms run when nobody is
there, so the ``Prewarmer`` runs them with the service's own token, whose role holds
``servers!group=G`` for the hub config's classes (``class_service_scopes``). It looks
for due schedules every QUOTA_SPAWNER_PREWARM_INTERVAL seconds (30 unless set).

A pre-warmed server is an ordinary server: the idle culler stops it if nobody comes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

from tornado import web
from tornado.httpclient import AsyncHTTPClient, HTTPRequest
from tornado.ioloop import PeriodicCallback

from spawner.webapp import class_logic as classes
from spawner.webapp import inputs
from spawner.webapp.app import (
    Access,
    LedgerReader,
    NotReady,
    Refused,
    _load_table,
    _names,
    access_for,
)
from spawner.webapp.gpu_map import read_json_file, usage_state
from spawner.webapp.table import PAGINATION, TableApi

log = logging.getLogger("quota_spawner.usage")

GPU_USAGE_FILE_NAME = "quota-spawner-gpu-usage.json"  # the watchdog's, in the state folder
NOT_AN_INSTRUCTOR = ("The class dashboard is for admins and for the instructors of a class, "
                     "and you are neither.")
NO_TOKEN = "Your login to this page carries no hub token; log in again."
STARTS_AT_ONCE = 8  # concurrent start requests to the hub
PREWARM_INTERVAL_ENV = "QUOTA_SPAWNER_PREWARM_INTERVAL"
DEFAULT_PREWARM_INTERVAL = 30.0


@dataclass(frozen=True)
class ClassConfig:
    """Where the hub's API is, the service's own token (for schedules), the hub's base
    URL (for the links to open a server) and the watchdog's GPU usage file."""

    hub_api_url: str
    service_token: str = ""
    hub_base: str = "/"
    gpu_usage_file: str = ""

    @classmethod
    def from_environment(cls) -> ClassConfig:
        state = os.environ.get("QUOTA_SPAWNER_STATE_DIR", "")
        return cls(hub_api_url=os.environ.get("JUPYTERHUB_API_URL", ""),
                   service_token=os.environ.get("JUPYTERHUB_API_TOKEN", ""),
                   hub_base=os.environ.get("JUPYTERHUB_BASE_URL", "/"),
                   gpu_usage_file=os.path.join(state, GPU_USAGE_FILE_NAME) if state else "")


class HubRefused(Exception):
    """The hub answered with an error; ``status`` and its message."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def _message(body: bytes) -> str:
    try:
        found = json.loads(body)
    except ValueError:
        return ""
    return str(found.get("message", "")) if isinstance(found, dict) else ""


async def hub_call(config: ClassConfig, token: str, method: str, path: str,
                   body: Any = None) -> tuple[int, Any]:
    """One request to the hub's REST API with ``token``: (status, JSON or None); 599
    when the hub did not answer."""
    if not config.hub_api_url:
        raise Refused("The class dashboard needs the hub's API, and this service was not "
                      "given its address (JUPYTERHUB_API_URL).", 503)
    request = HTTPRequest(
        f"{config.hub_api_url.rstrip('/')}/{path.lstrip('/')}", method=method,
        headers={"Authorization": f"token {token}", "Accept": PAGINATION,
                 "Content-Type": "application/json"},
        body=None if method in ("GET", "DELETE") else json.dumps(body or {}),
        request_timeout=60)
    response = await AsyncHTTPClient().fetch(request, raise_error=False)
    try:
        found = json.loads(response.body) if response.body else None
    except ValueError:
        found = None
    return response.code, found


async def hub_users(config: ClassConfig, token: str) -> list[dict[str, Any]]:
    """Every user the token may list, with groups and servers; HubRefused otherwise."""
    users: list[dict[str, Any]] = []
    offset = 0
    while True:
        code, page = await hub_call(config, token, "GET",
                                    "users?" + urlencode({"offset": offset, "limit": 200}))
        if code != 200:
            raise HubRefused(code, (page or {}).get("message", "") if isinstance(page, dict)
                             else "")
        items = page if isinstance(page, list) else (page or {}).get("items", [])
        users += [u for u in items if isinstance(u, dict) and u.get("name")]
        following = None if isinstance(page, list) else (
            ((page or {}).get("_pagination") or {}).get("next"))
        if not following:
            return users
        offset = int(following.get("offset", offset + 200))


# The hub refuses a server outside the token's filters with 404 ("No access to resources
# or resources not found"), not 403, when the token holds the scope for some servers: an
# instructor's token always does (their own, from "self"), so 404 is how the hub says no
# to another class's member (checked on a real hub by tests/test_browser_classes.py).
REFUSALS = {403: "refused", 404: "refused"}


def _server_path(name: str) -> str:
    return f"users/{quote(name, safe='')}/server"


async def start_one(config: ClassConfig, token: str, name: str, options: dict[str, str]
                    ) -> dict[str, Any]:
    code, found = await hub_call(config, token, "POST", _server_path(name), options)
    message = (found or {}).get("message", "") if isinstance(found, dict) else ""
    outcome = {201: "started", 202: "starting", 400: "skipped", 429: "busy",
               **REFUSALS}.get(code, "failed")
    if code == 599:
        message = "The hub did not answer."
    return {"user": name, "outcome": outcome, "message": message}


async def stop_one(config: ClassConfig, token: str, name: str) -> dict[str, Any]:
    code, found = await hub_call(config, token, "DELETE", _server_path(name))
    message = (found or {}).get("message", "") if isinstance(found, dict) else ""
    outcome = {204: "stopped", 202: "stopping", 400: "skipped", **REFUSALS}.get(code, "failed")
    if code == 599:
        message = "The hub did not answer."
    return {"user": name, "outcome": outcome, "message": message}


async def start_members(config: ClassConfig, token: str, users: Sequence[dict[str, Any]],
                        role: str, image: str) -> list[dict[str, Any]]:
    """Starts the stopped servers of ``users`` with the role and image, a few at once;
    running and starting ones are skipped. One result per user, in the users' order."""
    gate = asyncio.Semaphore(STARTS_AT_ONCE)
    options = {"profile": role, "image": image}

    async def one(user: dict[str, Any]) -> dict[str, Any]:
        state = classes.server_state(user)
        if state != "stopped":
            return {"user": user["name"], "outcome": "skipped",
                    "message": f"The server is {state} already."}
        async with gate:
            return await start_one(config, token, str(user["name"]), options)

    return list(await asyncio.gather(*(one(u) for u in users)))


def summary(results: Sequence[dict[str, Any]]) -> str:
    return "\n".join(f"{r['user']}: {r['outcome']}" + (f" ({r['message']})" if r["message"]
                                                        else "") for r in results)


async def snapshot(config: ClassConfig, reader: LedgerReader, quota_file: str, token: str,
                   group: str) -> dict[str, Any]:
    """What the dashboard shows of ``group``, as the hub shows it to ``token``: the
    members' rows, the pre-warm choices (every member's, and those only some hold with
    who lacks them), the GPU file's state and the schedules. HubRefused from the hub."""
    found = classes.members(await hub_users(config, token), group)
    names = [str(u["name"]) for u in found]
    now = time.time()
    table = await reader.call(_load_table, quota_file)
    path = config.gpu_usage_file
    usage = await reader.call(read_json_file, path) if path else None
    try:
        used = await reader.run(classes.open_sessions, names)
        planned = await reader.run(classes.schedules, group)
    except NotReady:
        used, planned = {}, []
    gpu = classes.gpu_memory_by_user(usage, now)
    fresh = usage_state(usage, now)
    return {
        "group": group,
        "members": [classes.member_row(u, used, gpu, fresh == "fresh", config.hub_base)
                    for u in found],
        "choices": classes.common_choices(table, found) if table else [],
        "partial_choices": classes.partial_choices(table, found) if table else [],
        "table_missing": table is None,
        "gpu_usage": fresh,
        "schedules": planned,
        "now": now,
    }


def class_access(model: dict[str, Any] | None) -> Access | None:
    """Admins see every class; an instructor the groups of their usage scope's filters;
    a viewer of every session is no instructor."""
    found = access_for(model)
    if found is None or not model:
        return None
    if model.get("admin") is True:
        return Access(found.name, everything=True)
    return found if found.groups else None


class ClassVisitor:
    """Shared by the dashboard's endpoints and pages: the visitor's classes, their hub
    token, and the hub's refusals as sentences."""

    config: ClassConfig
    current_user: Any
    hub_auth: Any

    def initialize(self, config: ClassConfig) -> None:
        self.config = config

    def mine(self) -> Access:
        found = class_access(self.current_user)
        if found is None:
            log.info("Class dashboard: refused %s", (self.current_user or {}).get("name"))
            raise Refused(NOT_AN_INSTRUCTOR)
        return found

    def token(self) -> str:
        found = self.hub_auth.get_token(self)
        if not found:
            raise Refused(NO_TOKEN)
        return str(found)

    async def visible_groups(self, access: Access) -> list[str]:
        """The classes the visitor sees: an instructor's own; for admins, every group with
        members (read with the admin's token)."""
        if not access.everything:
            return list(access.groups)
        try:
            return classes.groups_of(await hub_users(self.config, self.token()))
        except HubRefused as e:
            raise self.hub_refused(e, "list the users") from None

    @staticmethod
    def hub_refused(e: HubRefused, what: str) -> Refused:
        if e.status == 599:
            return Refused("The hub did not answer; try again in a moment.", 503)
        status = 403 if e.status == 403 else 502
        return Refused(f"The hub refused to {what} for you"
                       + (f": {e.message}" if e.message else ".")
                       + ("" if status == 403 else f" (HTTP {e.status})"), status)


class ClassApi(ClassVisitor, TableApi):
    """Shared by the dashboard's endpoints."""

    def group(self, group: str) -> Access:
        """The visitor's access, when they may act on ``group``; else Refused, before
        anything is asked of the hub."""
        access = self.mine()
        if not access.everything and group not in access.groups:
            raise Refused(f"You manage the servers of {_names(access.groups)} only, "
                          f"not of {group}.")
        return access

    async def members(self, group: str) -> list[dict[str, Any]]:
        """The group's members as the hub shows them to the visitor's token."""
        try:
            users = await hub_users(self.config, self.token())
        except HubRefused as e:
            raise self.hub_refused(e, f"list the members of {group}") from None
        return classes.members(users, group)

    async def ledger(self, fn: Any, *args: Any) -> Any:
        return await self.reader.run(fn, *args)

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        error = kwargs.get("exc_info", (None, None, None))[1]
        sentence = getattr(error, "sentence", None) or {
            403: NOT_AN_INSTRUCTOR, 404: "There is no such class or schedule here.",
            400: "The request could not be read."}.get(
            status_code, "The request failed because of an error; the service's log has "
            "the details.")
        self.set_header("Content-Type", "application/json; charset=utf-8")
        self.finish(json.dumps({"message": sentence}))


class ClassesHandler(ClassApi):
    """GET: the visitor's classes."""

    @web.authenticated
    async def get(self) -> None:
        access = self.mine()
        groups = await self.visible_groups(access)
        self.reply({"classes": [{"name": g} for g in groups],
                    "admin": access.everything})


class ClassHandler(ClassApi):
    """GET: a class's members, the pre-warm choices and the schedules."""

    @web.authenticated
    async def get(self, group: str) -> None:
        self.group(group)
        try:
            found = await snapshot(self.config, self.reader, self.settings["usage_quota_file"],
                                   self.token(), group)
        except HubRefused as e:
            raise self.hub_refused(e, f"list the members of {group}") from None
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
            names = [n for n, u in found.items() if classes.server_state(u) != "stopped"]
        else:
            strangers = [n for n in asked if n not in found]
            if strangers:
                raise Refused(f"{_names(strangers)} {'is' if len(strangers) == 1 else 'are'}"
                              f" not a member of {group}.", 400)
            names = list(dict.fromkeys(asked))
        token = self.token()
        results = list(await asyncio.gather(*(stop_one(self.config, token, n) for n in names)))
        log.info("Class dashboard: %s stopped servers of %s: %s",
                 self.current_user.get("name"), group, summary(results).replace("\n", "; "))
        self.answer(results, "stop")

    def answer(self, results: list[dict[str, Any]], what: str) -> None:
        if results and all(r["outcome"] == "refused" for r in results):
            message = results[0]["message"]
            self.reply({"message": f"The hub refused to {what} these servers for you"
                        + (f": {message}" if message else "."), "results": results}, 403)
            return
        self.reply({"results": results})


class PrewarmHandler(StopHandler):
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
        table = await self.blocking(_load_table, self.settings["usage_quota_file"])
        if table is None:
            raise Refused("The quota table cannot be read, so the roles cannot be "
                          "checked; ask an admin.", 503)
        missing = classes.lacking(table, found, role, image)
        if missing:
            raise Refused(f"Not every member of {group} may start {role} with {image}: "
                          f"{_names(missing)} may not. Pick a role and image all of them "
                          "hold.", 400)
        who = str(self.current_user.get("name"))
        if at is not None:
            planned = await self.ledger(classes.add_schedule, group, role, image,
                                        float(at), who, now)
            log.info("Class dashboard: %s scheduled pre-warm %s of %s (%s, %s) at %s",
                     who, planned["id"], group, role, image, at)
            self.reply(planned, 201)
            return
        results = await start_members(self.config, self.token(), found, role, image)
        log.info("Class dashboard: %s pre-warmed %s (%s, %s): %s", who, group, role, image,
                 summary(results).replace("\n", "; "))
        self.answer(results, "start")


class SchedulesHandler(ClassApi):
    """GET: a class's pre-warm schedules."""

    @web.authenticated
    async def get(self, group: str) -> None:
        self.group(group)
        self.reply({"schedules": await self.ledger(classes.schedules, group)})


class ScheduleHandler(ClassApi):
    """GET: one schedule. DELETE: cancel it while it is pending."""

    async def _one(self, group: str, schedule_id: str) -> dict[str, Any]:
        found = await self.ledger(classes.schedule, inputs.record_id(schedule_id, "schedule"))
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
        cancelled, before = await self.ledger(classes.cancel, group, number)
        if before is None:
            raise Refused(f"{group} has no pre-warm schedule {schedule_id}.", 404)
        if not cancelled:
            self.reply({"message": f"The pre-warm is {before} already; only a pending one "
                        "can be cancelled."}, 409)
            return
        log.info("Class dashboard: %s cancelled pre-warm %s of %s",
                 self.current_user.get("name"), schedule_id, group)
        self.reply(await self._one(group, schedule_id))


def prewarm_interval() -> float:
    """Seconds between looks for due schedules: QUOTA_SPAWNER_PREWARM_INTERVAL, else 30
    (a lab's servers start within half a minute of the time asked); tests shorten it."""
    try:
        found = float(os.environ.get(PREWARM_INTERVAL_ENV, "") or DEFAULT_PREWARM_INTERVAL)
    except ValueError:
        log.warning("Pre-warm: %s is not a number of seconds; checking every %ss",
                    PREWARM_INTERVAL_ENV, DEFAULT_PREWARM_INTERVAL)
        return DEFAULT_PREWARM_INTERVAL
    return max(0.5, found)


class Prewarmer:
    """Runs the due pre-warm schedules with the service's own token, every ``interval``
    seconds once started (``start()``, on the service's IOLoop)."""

    def __init__(self, config: ClassConfig, reader: LedgerReader,
                 interval: float | None = None):
        self.config = config
        self.reader = reader
        self.interval = prewarm_interval() if interval is None else interval
        self._busy = False
        self._callback: PeriodicCallback | None = None

    def start(self) -> None:
        self._callback = PeriodicCallback(self._tick, self.interval * 1000)
        self._callback.start()

    def stop(self) -> None:
        if self._callback:
            self._callback.stop()

    async def _tick(self) -> None:
        if self._busy:  # the last round is still starting servers
            return
        self._busy = True
        try:
            await self.run_due()
        except Exception:
            log.exception("Pre-warm: the due schedules could not be run")
        finally:
            self._busy = False

    async def run_due(self, now: float | None = None) -> list[dict[str, Any]]:
        """Runs each due schedule and marks it done (every member's server started or
        running) or failed; returns them as they ended."""
        try:
            found = await self.reader.run(classes.due, time.time() if now is None else now)
        except NotReady:
            return []
        ended = []
        for planned in found:
            state, result = await self.run_one(planned)
            if await self.reader.run(classes.finish, planned["id"], state, result):
                log.info("Pre-warm %s of %s (%s, %s) %s:\n%s", planned["id"], planned["group"],
                         planned["role"], planned["image"], state, result)
            ended.append(await self.reader.run(classes.schedule, planned["id"]))
        return ended

    async def run_one(self, planned: dict[str, Any]) -> tuple[str, str]:
        if not self.config.service_token:
            return classes.FAILED, "The service has no hub token (JUPYTERHUB_API_TOKEN)."
        try:
            users = await hub_users(self.config, self.config.service_token)
        except HubRefused as e:
            return classes.FAILED, (f"The hub refused to list the users (HTTP {e.status})"
                                    + (f": {e.message}" if e.message else "."))
        found = classes.members(users, planned["group"])
        if not found:
            return classes.FAILED, f"{planned['group']} has no members."
        results = await start_members(self.config, self.config.service_token, found,
                                      planned["role"], planned["image"])
        ok = all(r["outcome"] in ("started", "starting", "skipped") for r in results)
        return (classes.DONE if ok else classes.FAILED), summary(results)


def routes(prefix: str, config: ClassConfig | None = None
           ) -> list[tuple[str, type[web.RequestHandler], dict[str, Any]]]:
    """The dashboard's routes; ``config`` defaults to the service's environment."""
    extra = {"config": config or ClassConfig.from_environment()}
    group = r"api/classes/([^/]+)"
    return [
        (prefix + "api/classes", ClassesHandler, extra),
        (prefix + group, ClassHandler, extra),
        (prefix + group + "/stop", StopHandler, extra),
        (prefix + group + "/prewarm", PrewarmHandler, extra),
        (prefix + group + "/schedules", SchedulesHandler, extra),
        (prefix + group + r"/schedules/(\d+)", ScheduleHandler, extra),
    ]
