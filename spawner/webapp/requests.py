"""Requests for a bigger role: the JSON API in the usage service (docs/role-requests.md).

Routes under the service's prefix (``routes``):

- ``GET api/requests/options``: the roles this user may ask for, the longest window,
  whether instructors decide, and the roles the user holds (with their grants);
- ``GET api/requests/mine``: the user's requests, newest first;
- ``POST api/requests`` ``{role, starts, ends, reason}`` (Unix seconds): ask;
- ``POST api/requests/<id>/withdraw``: take back a waiting request or give up a grant;
- ``GET api/requests/pending``: the requests this visitor may decide (admins: all;
  instructors of a group, when the table's ``requests: instructors_approve`` is true:
  those of the group's members); anyone else is refused (403);
- ``POST api/requests/<id>/decide`` ``{approve, comment}``: approve or refuse;
- ``DELETE api/requests/<id>``: an admin deletes a request whose window cannot be shown
  (stored before the input checks, ``inputs.py``); every other request is kept.

Unlike the usage report, these are for every logged-in user: the hub gives everyone
``access:services!service=usage`` (``USER_SCOPES``, for ``c.JupyterHub.extra_user_scopes``),
and the report's handlers still refuse those who are neither admins nor instructors.
Who is an instructor of which groups comes from the usage scope the hub's OAuth passes on
(``access_for``); the users' groups now, from the hub's REST API with the service's own
token (``read:users:groups``). A refusal is 4xx with ``{"message": sentence}``; POSTs must
be JSON, as the table editor's (table_api.py), and are behind HubOAuth's XSRF check.

Each change is appended to the hub's event log (``<state dir>/quota-spawner-events.jsonl``,
``QUOTA_SPAWNER_STATE_DIR``) with the hub's id, for the watchdog to tell the people
concerned. The ledger and the table are read on the service's worker threads.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

from tornado import web
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from spawner.events import EventLog
from spawner.policy.config import hub_id_from_secret_file
from spawner.quota.model import QuotaTable, QuotaTableError
from spawner.quota.store import QuotaStore
from spawner.usage import grants as rr
from spawner.webapp import inputs
from spawner.webapp.app import Refused, access_for
from spawner.webapp.table import TableApi

log = logging.getLogger("quota_spawner.usage")

EVENTS_FILE = "quota-spawner-events.jsonl"
# What every user needs to reach this service: c.JupyterHub.extra_user_scopes.
USER_SCOPES = ("access:services!service=usage",)
NOT_DECIDER = ("Requests are decided by admins, and by the instructors of a class when the "
               "quota table allows it; you are neither for any request.")
NO_TABLE = ("This service has no quota table, so no role can be requested "
            "(QUOTA_SPAWNER_QUOTA_FILE); ask an admin.")
BAD_TABLE = ("The quota table has problems, so requests cannot be handled now; "
             "an admin has to fix it.")
NO_HUB = ("The hub did not tell this service who is in which group; try again in a "
          "moment.")

GroupsOf = Callable[[str], Awaitable[list[str]]]


def hub_groups(api_url: str, token: str) -> GroupsOf:
    """A user's groups now, from the hub's REST API with the service's token."""

    async def groups(user: str) -> list[str]:
        if not api_url:
            raise Refused(NO_HUB + " (JUPYTERHUB_API_URL is not set.)", 503)
        try:
            response = await AsyncHTTPClient().fetch(HTTPRequest(
                f"{api_url.rstrip('/')}/users/{quote(user, safe='')}", request_timeout=10,
                headers={"Authorization": f"token {token}"}))
        except HTTPClientError as e:
            if e.code == 404:
                return []  # a user the hub no longer has is in no group
            log.warning("Requests: the hub did not give the groups of %s: %s", user, e)
            raise Refused(NO_HUB, 503) from None
        except OSError as e:
            log.warning("Requests: the hub did not give the groups of %s: %s", user, e)
            raise Refused(NO_HUB, 503) from None
        return [str(g) for g in json.loads(response.body).get("groups") or []]

    return groups


def hub_id_from_env() -> str:
    """The hub's id as the spawner derives it: QUOTA_SPAWNER_HUB_ID, else from the hub's
    cookie secret file and prefix (QUOTA_SPAWNER_HUB_SECRET_FILE, QUOTA_SPAWNER_PREFIX)."""
    if os.environ.get("QUOTA_SPAWNER_HUB_ID"):
        return os.environ["QUOTA_SPAWNER_HUB_ID"]
    path = os.environ.get("QUOTA_SPAWNER_HUB_SECRET_FILE", "")
    found = hub_id_from_secret_file(os.environ.get("QUOTA_SPAWNER_PREFIX", "quota"),
                                    path) if path else None
    return found or ""


def request_json(r: rr.RoleRequest) -> dict[str, Any]:
    return {"id": r.id, "user": r.user_name, "groups": list(r.groups), "role": r.role,
            "starts": r.starts, "ends": r.ends, "window": r.window, "reason": r.reason,
            "state": r.state, "asked_at": r.asked_at, "decided_by": r.decided_by,
            "decided_at": r.decided_at, "comment": r.decision_comment}


def decider_for_model(model: dict[str, Any], table: QuotaTable) -> str | None:
    """None when this visitor may decide some requests (an admin; an instructor when the
    table lets instructors decide), else the sentence that refuses them."""
    admin = model.get("admin") is True
    access = access_for(model)
    if not admin and (access is None or access.everything):
        return NOT_DECIDER
    if not admin and not table.requests.instructors_approve:
        return "On this hub, requests are decided by admins only."
    return None


async def decider_for(model: dict[str, Any], table: QuotaTable,
                      pending: list[rr.RoleRequest],
                      groups_of: GroupsOf) -> Callable[[rr.RoleRequest], bool]:
    """Who may decide, with the groups of the requests' users read from the hub once."""
    admin = model.get("admin") is True
    access = access_for(model)
    taught = access.groups if access is not None and not access.everything else ()
    groups: dict[str, list[str]] = {}
    if not admin and taught and table.requests.instructors_approve:
        for user in {r.user_name for r in pending}:
            groups[user] = await groups_of(user)
    return rr.decider(table, admin=admin, instructor_of=taught,
                      groups_of=lambda user: groups.get(user, ()))


async def load_table(reader: Any, quota_file: str) -> QuotaTable:
    """The quota table, read on the service's worker threads, or Refused with a sentence."""
    if not quota_file:
        raise Refused(NO_TABLE, 404)
    try:
        return await reader.call(QuotaStore.for_path(quota_file).get, log)
    except QuotaTableError:
        raise Refused(BAD_TABLE, 503) from None


def shared_options(app: web.Application) -> dict[str, Any]:
    """The options ``routes`` gave the API's handlers in this app (the table, the event
    log, the hub's groups, the clock), so the requests page reads what the API writes."""
    for rule in app.wildcard_router.rules:
        target = rule.target
        if isinstance(target, type) and issubclass(target, RequestsApi):
            return dict(rule.target_kwargs)
    raise LookupError("the app has no routes of the requests API")


class RequestsApi(TableApi):
    """Shared by the requests' endpoints: any logged-in user, JSON in and out."""

    def initialize(self, *, quota_file: str, events: EventLog, hub_id: Callable[[], str],
                   groups_of: GroupsOf, clock: Callable[[], float]) -> None:
        self.quota_file = quota_file
        self.events = events
        self.hub_id = hub_id
        self.groups_of = groups_of
        self.clock = clock

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        error = kwargs.get("exc_info", (None, None, None))[1]
        if getattr(error, "sentence", None) is None and status_code == 403:
            # HubOAuthenticated refused the visitor: no login, or no access to the service
            self.set_header("Content-Type", "application/json; charset=utf-8")
            self.finish(json.dumps({"message": "Log in to the hub to ask for a role."}))
            return
        super().write_error(status_code, **kwargs)

    def who(self) -> str:
        return str(self.current_user["name"])

    async def quota_table(self) -> QuotaTable:
        return await load_table(self.reader, self.quota_file)

    async def my_groups(self) -> list[str]:
        return await self.groups_of(self.who())

    async def decider(self, table: QuotaTable,
                      pending: list[rr.RoleRequest]) -> Callable[[rr.RoleRequest], bool]:
        return await decider_for(self.current_user, table, pending, self.groups_of)

    def told(self, outcome: rr.Outcome) -> None:
        """The outcome's event appended to the hub's log, then the answer; a refusal: 400."""
        if not outcome.done:
            raise Refused(outcome.refusal or "", 400)
        outcome.emit(self.events, hub=self.hub_id())
        log.info("Requests: %s (%s)", outcome.fields.get("text") or outcome.reply,
                 outcome.event)
        assert outcome.request is not None
        self.reply({"request": request_json(outcome.request), "message": outcome.reply})


class OptionsHandler(RequestsApi):
    """GET: what this user may ask for."""

    @web.authenticated
    async def get(self) -> None:
        table = await self.quota_table()
        user = self.who()
        groups = await self.my_groups()
        now = self.clock()
        granted = await self.reader.run(rr.granted_roles, user, now)
        held = table.role_names_for(user, groups, granted)
        rules = table.requests
        roles = [{"name": name, "display_name": table.roles[name].display_name or name,
                  "description": table.roles[name].description}
                 for name in rules.roles if name in table.roles and name not in held]
        self.reply({"roles": roles, "held": held, "granted": sorted(granted),
                    "max_days": rules.max_days,
                    "instructors_approve": rules.instructors_approve,
                    "message": "" if rules.roles else
                    "Roles cannot be requested on this hub; ask an admin."})


class MineHandler(RequestsApi):
    """GET: the user's requests, newest first."""

    @web.authenticated
    async def get(self) -> None:
        found = await self.reader.run(rr.requests_of, self.who())
        self.reply({"requests": [request_json(r) for r in found]})


def _seconds(body: dict[str, Any], name: str) -> float:
    # the range (a start at most REQUEST_HORIZON_DAYS ahead) is the ask's own rule
    return inputs.number(body.get(name), name, "a time in Unix seconds")


class AskHandler(RequestsApi):
    """POST {role, starts, ends, reason}: ask for a role."""

    @web.authenticated
    async def post(self) -> None:
        body = self.body("role", "reason")
        starts, ends = _seconds(body, "starts"), _seconds(body, "ends")
        inputs.text(body["reason"], "reason", rr.MAX_REASON)
        table = await self.quota_table()
        user = self.who()
        groups = await self.my_groups()
        now = self.clock()
        outcome = await self.reader.run(lambda engine: rr.ask(
            engine, table, user, groups, body["role"], starts, ends, body["reason"], now))
        self.told(outcome)


class WithdrawHandler(RequestsApi):
    """POST: the user takes back their request, or gives up their grant."""

    @web.authenticated
    async def post(self, request_id: str) -> None:
        self.body()
        found = inputs.record_id(request_id, "request")
        user, now = self.who(), self.clock()
        self.told(await self.reader.run(rr.withdraw, found, user, now))


class PendingHandler(RequestsApi):
    """GET: the requests waiting for this visitor's decision."""

    @web.authenticated
    async def get(self) -> None:
        model, access = self.current_user, access_for(self.current_user)
        if model.get("admin") is not True and (access is None or access.everything):
            raise Refused(NOT_DECIDER)  # before reading the table: nothing to tell them
        table = await self.quota_table()
        refusal = decider_for_model(model, table)
        if refusal:
            raise Refused(refusal)
        waiting = await self.reader.run(rr.pending)
        may = await self.decider(table, waiting)
        self.reply({"requests": [request_json(r) for r in waiting if may(r)]})


class DecideHandler(RequestsApi):
    """POST {approve, comment}: approve or refuse a waiting request."""

    @web.authenticated
    async def post(self, request_id: str) -> None:
        body = self.body()
        approve = body.get("approve")
        if not isinstance(approve, bool):
            raise Refused("The request needs 'approve', as true or false.", 400)
        comment = inputs.text(body.get("comment", ""), "comment", inputs.MAX_COMMENT)
        number = inputs.record_id(request_id, "request")
        table = await self.quota_table()
        found = await self.reader.run(rr.get, number)
        if found is None:
            raise Refused(f"There is no request {request_id}.", 404)
        may = await self.decider(table, [found])
        if not may(found):
            raise Refused(f"You may not decide the requests of {found.user_name}.")
        who, now = self.who(), self.clock()
        outcome = await self.reader.run(lambda engine: rr.decide(
            engine, table, number, who, approve, comment, may, now))
        self.told(outcome)


class DeleteHandler(RequestsApi):
    """DELETE: an admin deletes a request whose window cannot be shown."""

    @web.authenticated
    async def delete(self, request_id: str) -> None:
        number = inputs.record_id(request_id, "request")
        if self.current_user.get("admin") is not True:
            raise Refused("Only admins may delete a request, and only one whose window "
                          "cannot be shown.")
        outcome = await self.reader.run(rr.delete_broken, number)
        if not outcome.done:
            raise Refused(outcome.refusal or "", 404 if outcome.request is None else 400)
        log.warning("Requests: %s deleted request %s of %s, whose window could not be shown",
                    self.who(), number, outcome.request.user_name if outcome.request else "?")
        self.reply({"message": outcome.reply})


def routes(prefix: str, *, quota_file: str | None = None, state_dir: str | None = None,
           hub_id: str | Callable[[], str] | None = None, hub_api_url: str | None = None,
           hub_api_token: str | None = None, groups_of: GroupsOf | None = None,
           clock: Callable[[], float] = time.time) -> list[tuple[str, type, dict[str, Any]]]:
    """The requests' routes under ``prefix``; what is not given comes from the service's
    environment (QUOTA_SPAWNER_QUOTA_FILE, QUOTA_SPAWNER_STATE_DIR, the hub's id,
    JUPYTERHUB_API_URL and JUPYTERHUB_API_TOKEN). The app needs the usage service's
    settings (``usage_reader``), as ``make_app`` gives them."""
    prefix = prefix if prefix.endswith("/") else prefix + "/"
    env = os.environ.get
    if quota_file is None:
        quota_file = env("QUOTA_SPAWNER_QUOTA_FILE", "")
    if state_dir is None:
        state_dir = env("QUOTA_SPAWNER_STATE_DIR", "")
    if hub_id is None:
        hub_id = hub_id_from_env
    elif isinstance(hub_id, str):
        hub_id = (lambda fixed: lambda: fixed)(hub_id)
    if groups_of is None:
        groups_of = hub_groups(env("JUPYTERHUB_API_URL", "") if hub_api_url is None
                               else hub_api_url,
                               env("JUPYTERHUB_API_TOKEN", "") if hub_api_token is None
                               else hub_api_token)
    if not state_dir:
        log.warning("Requests: no QUOTA_SPAWNER_STATE_DIR, so their events are not "
                    "recorded and nobody is told of them")
    events = EventLog(os.path.join(state_dir, EVENTS_FILE) if state_dir else "", log)
    shared = {"quota_file": quota_file, "events": events, "hub_id": hub_id,
              "groups_of": groups_of, "clock": clock}
    return [
        (prefix + "api/requests", AskHandler, shared),
        (prefix + "api/requests/options", OptionsHandler, shared),
        (prefix + "api/requests/mine", MineHandler, shared),
        (prefix + "api/requests/pending", PendingHandler, shared),
        (prefix + r"api/requests/(\d+)/withdraw", WithdrawHandler, shared),
        (prefix + r"api/requests/(\d+)/decide", DecideHandler, shared),
        (prefix + r"api/requests/(\d+)", DeleteHandler, shared),
    ]
