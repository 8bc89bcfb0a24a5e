"""Requests for a bigger role (docs/role-requests.md): the page and its JSON API.

``GET {prefix}requests`` is the service's landing page for every logged-in user:

- a form to ask for a role (those under the table's ``requests: roles`` that the user
  does not hold), for a window of at most ``max_days``, with a reason;
- the user's own requests with their state (waiting, approved until …, refused with the
  decider's comment, withdrawn, expired), and a button to withdraw one or give up a grant;
- for those who decide (admins; instructors of the requester's group when the table's
  ``instructors_approve`` is true), "Requests to decide", each with approve or refuse and
  a comment. Nobody else gets that section, and the API refuses them as well.

The page is rendered here first, so reading it needs no script; ``static/requests.js``
performs the actions through the JSON API, with the XSRF token the page carries, then
reloads the page. Every user-chosen text (names, reasons, comments) goes through Jinja's
autoescape, and is isolated where it stands in a line (``<bdi>``, ``dir="auto"``, FSI … PDI
in a sentence), so its bidi controls cannot reorder the words around it; the script only
sets textContent. The API, under ``api/requests``:

- ``GET options``: the roles this user may ask for, the longest window, how many
  requests may wait at once (``max_open``), whether instructors decide, and the roles
  the user holds (with their grants);
- ``GET mine``: the user's requests, newest first;
- ``POST`` ``{role, starts, ends, reason}`` (Unix seconds): ask;
- ``POST <id>/withdraw``: take back a waiting request or give up a grant;
- ``GET pending``: the requests this visitor may decide (admins: all; instructors of a
  group, when the table's ``requests: instructors_approve`` is true: those of the group's
  members); anyone else is refused (403);
- ``POST <id>/decide`` ``{approve, comment}``: approve or refuse;
- ``DELETE <id>``: an admin deletes a request whose window cannot be shown (stored before
  the input checks, ``inputs.py``); every other request is kept.

Unlike the usage report, these are for every logged-in user: the hub gives everyone
``access:services!service=usage`` (``USER_SCOPES``, for ``c.JupyterHub.extra_user_scopes``).
Who is an instructor of which groups comes from the usage scope the hub's OAuth passes on;
the users' groups now, from the hub's REST API with the service's own token
(``read:users:groups``). The logic and the rows are spawner/usage/grants.py's; each change
is appended to the hub's event log with the hub's id, for the watchdog to tell the people
concerned. The ledger and the table are read on the service's worker threads.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from markupsafe import Markup
from tornado import web

from spawner.quota.model import QuotaTable, QuotaTableError
from spawner.quota.units import format_moment
from spawner.usage import grants as rr
from spawner.webapp import inputs
from spawner.webapp.access import Refused, access_for, is_admin, taught
from spawner.webapp.base import ApiHandler, BaseHandler, PageHandler
from spawner.webapp.formatting import bdi

log = logging.getLogger("quota_spawner.usage")

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
LOG_IN = "Log in to the hub to ask for a role."


def request_json(r: rr.RoleRequest) -> dict[str, Any]:
    return {"id": r.id, "user": r.user_name, "groups": list(r.groups), "role": r.role,
            "starts": r.starts, "ends": r.ends, "window": r.window, "reason": r.reason,
            "state": r.state, "asked_at": r.asked_at, "decided_by": r.decided_by,
            "decided_at": r.decided_at, "comment": r.decision_comment}


def decider_for_model(model: dict[str, Any], table: QuotaTable) -> str | None:
    """None when this visitor may decide some requests (an admin; an instructor when the
    table lets instructors decide), else the sentence that refuses them."""
    admin = is_admin(model)
    access = access_for(model)
    if not admin and (access is None or access.everything):
        return NOT_DECIDER
    if not admin and not table.requests.instructors_approve:
        return "On this hub, requests are decided by admins only."
    return None


# --- how a request reads on the page -----------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One request as the page shows it; the texts are escaped by the template."""

    id: int
    user: str
    groups: str  # markup: each a <bdi>
    role: str
    window: str
    reason: str
    asked: str
    state: str  # waiting, upcoming, granted, expired, refused, withdrawn: the CSS class
    status: str  # the state in words (markup: the decider's name is a <bdi>)
    comment: str
    withdraw: str  # the button's label; empty: nothing to withdraw
    broken: bool = False  # a window no calendar shows: refused or deleted, never approved


def row(r: rr.RoleRequest, now: float, when: Callable[[float], str]) -> Row:
    by = bdi(r.decided_by or "")  # a name in a sentence: its bidi controls kept inside
    if r.state == rr.PENDING:
        state, status, withdraw = "waiting", "Waiting for a decision", "Withdraw"
    elif r.state == rr.APPROVED and r.ends <= now:
        state, status, withdraw = "expired", f"Expired: the grant ended on {when(r.ends)}", ""
    elif r.state == rr.APPROVED and r.starts > now:
        state, status, withdraw = ("upcoming", Markup("Approved by {}, from {} until {}").format(
            by, when(r.starts), when(r.ends)), "Give up the grant")
    elif r.state == rr.APPROVED:
        state, status, withdraw = ("granted", Markup("Approved by {}, until {}").format(
            by, when(r.ends)), "Give up the grant")
    elif r.state == rr.REFUSED:
        state, status, withdraw = "refused", Markup("Refused by {}").format(by), ""
    else:
        state, status, withdraw = "withdrawn", (
            f"Withdrawn on {when(r.decided_at)}" if r.decided_at else "Withdrawn"), ""
    if r.broken:
        status = Markup("{}. Its window holds a time no calendar can show.").format(status)
    return Row(r.id, r.user_name, Markup(", ").join(bdi(g) for g in r.groups), r.role,
               f"{when(r.starts)} to {when(r.ends)}", r.reason, when(r.asked_at), state,
               status, r.decision_comment, withdraw, r.broken)


# --- shared by the page and the API -------------------------------------------------------------


class RequestsHandler(BaseHandler):
    """The quota table's request rules, the users' groups from the hub, who decides."""

    async def quota_table(self) -> QuotaTable:
        """The quota table, read on the worker threads, or Refused with a sentence."""
        store = self.setup.quota_store
        if store is None:
            raise Refused(NO_TABLE, 404)
        try:
            return await self.blocking(store.get, log)
        except QuotaTableError:
            raise Refused(BAD_TABLE, 503) from None

    async def groups_of(self, user: str) -> list[str]:
        """A user's groups now, from the hub's REST API with the service's token."""
        hub = self.setup.hub.require(NO_HUB + " (JUPYTERHUB_API_URL is not set.)")
        code, found = await hub.call(hub.service_token, "GET", f"users/{quote(user, safe='')}")
        if code == 404:
            return []  # a user the hub no longer has is in no group
        if code != 200 or not isinstance(found, dict):
            log.warning("Requests: the hub did not give the groups of %s (HTTP %s)", user,
                        code)
            raise Refused(NO_HUB, 503)
        return [str(g) for g in found.get("groups") or []]

    async def decider(self, table: QuotaTable,
                      pending: list[rr.RoleRequest]) -> Callable[[rr.RoleRequest], bool]:
        """Who may decide, with the groups of the requests' users read from the hub once."""
        model = self.current_user
        admin = is_admin(model)
        classes = taught(model)
        groups: dict[str, list[str]] = {}
        if not admin and classes and table.requests.instructors_approve:
            for user in {r.user_name for r in pending}:
                groups[user] = await self.groups_of(user)
        return rr.decider(table, admin=admin, instructor_of=classes,
                          groups_of=lambda user: groups.get(user, ()))


# --- the page ----------------------------------------------------------------------------------


class RequestsPage(RequestsHandler, PageHandler):
    """GET {prefix}requests: ask, follow one's requests, and decide those of others."""

    page_title = "Role requests"
    scripts = ("requests.js",)

    @web.authenticated
    async def get(self) -> None:
        model = self.current_user
        user = str(model["name"])
        now = self.setup.clock()

        def when(t: float) -> str:
            return format_moment(t, self.tz)

        # What the ask form needs; a missing table or a silent hub leaves the form out
        # with the sentence, while the user's requests are still shown.
        problem = ""
        table: QuotaTable | None = None
        askable: list[dict[str, str]] = []
        held: list[str] = []
        granted: set[str] = set()
        try:
            table = await self.quota_table()
            groups = await self.groups_of(user)
            granted = await self.reader.run(rr.granted_roles, user, now)
            held = table.role_names_for(user, groups, granted)
            askable = [{"name": name, "label": table.roles[name].display_name or name,
                        "description": table.roles[name].description}
                       for name in table.requests.roles
                       if name in table.roles and name not in held]
        except Refused as e:
            problem = e.sentence
        mine = [row(r, now, when) for r in await self.reader.run(rr.requests_of, user)]

        # "Requests to decide": only for those who may decide some; None hides it.
        to_decide: list[Row] | None = None
        decide_problem = ""
        if table is not None and decider_for_model(model, table) is None:
            waiting = await self.reader.run(rr.pending)
            try:
                may = await self.decider(table, waiting)
                # nobody decides their own request: an admin's shows under theirs only
                to_decide = [row(r, now, when) for r in waiting
                             if may(r) and r.user_name != user]
            except Refused as e:
                to_decide, decide_problem = [], e.sentence
        elif table is None and is_admin(model):
            to_decide, decide_problem = [], problem
        log.debug("Requests page: %s, %d own, deciding %s", user, len(mine),
                  None if to_decide is None else len(to_decide))

        rules = table.requests if table is not None else None
        self.render_page(
            "requests.html", title="Role requests", problem=problem,
            no_roles=rules is not None and not rules.roles, askable=askable, held=held,
            granted=sorted(granted), max_days=f"{rules.max_days:g}" if rules else "0",
            instructors_approve=bool(rules and rules.instructors_approve),
            mine=mine, to_decide=to_decide, decide_problem=decide_problem,
            admin=is_admin(model), max_reason=rr.MAX_REASON, xsrf=self.xsrf(),
            api=self.prefix + "api/requests")


# --- the API -----------------------------------------------------------------------------------


class RequestsApi(RequestsHandler, ApiHandler):
    """Shared by the requests' endpoints: any logged-in user, JSON in and out."""

    refused = LOG_IN  # HubOAuthenticated refused the visitor: no login, or no access

    def record_and_reply(self, outcome: rr.Outcome) -> None:
        """The outcome's event appended to the hub's log, then the answer; a refusal: 400."""
        if not outcome.done:
            raise Refused(outcome.refusal or "", 400)
        outcome.emit(self.setup.events, hub=self.setup.hub_id())
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
        groups = await self.groups_of(user)
        now = self.setup.clock()
        granted = await self.reader.run(rr.granted_roles, user, now)
        held = table.role_names_for(user, groups, granted)
        rules = table.requests
        roles = [{"name": name, "display_name": table.roles[name].display_name or name,
                  "description": table.roles[name].description}
                 for name in rules.roles if name in table.roles and name not in held]
        self.reply({"roles": roles, "held": held, "granted": sorted(granted),
                    "max_days": rules.max_days, "max_open": rules.max_open,
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
        groups = await self.groups_of(user)
        now = self.setup.clock()
        outcome = await self.reader.run(lambda engine: rr.ask(
            engine, table, user, groups, body["role"], starts, ends, body["reason"], now))
        self.record_and_reply(outcome)


class WithdrawHandler(RequestsApi):
    """POST: the user takes back their request, or gives up their grant."""

    @web.authenticated
    async def post(self, request_id: str) -> None:
        self.body()
        found = inputs.record_id(request_id, "request")
        user, now = self.who(), self.setup.clock()
        self.record_and_reply(await self.reader.run(rr.withdraw, found, user, now))


class PendingHandler(RequestsApi):
    """GET: the requests waiting for this visitor's decision."""

    @web.authenticated
    async def get(self) -> None:
        model, access = self.current_user, access_for(self.current_user)
        if not is_admin(model) and (access is None or access.everything):
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
        who, now = self.who(), self.setup.clock()
        outcome = await self.reader.run(lambda engine: rr.decide(
            engine, table, number, who, approve, comment, may, now))
        self.record_and_reply(outcome)


class DeleteHandler(RequestsApi):
    """DELETE: an admin deletes a request whose window cannot be shown."""

    @web.authenticated
    async def delete(self, request_id: str) -> None:
        number = inputs.record_id(request_id, "request")
        if not is_admin(self.current_user):
            raise Refused("Only admins may delete a request, and only one whose window "
                          "cannot be shown.")
        outcome = await self.reader.run(rr.delete_broken, number)
        if not outcome.done:
            raise Refused(outcome.refusal or "", 404 if outcome.request is None else 400)
        log.warning("Requests: %s deleted request %s of %s, whose window could not be shown",
                    self.who(), number, outcome.request.user_name if outcome.request else "?")
        self.reply({"message": outcome.reply})


def routes(prefix: str) -> list[tuple[str, type[web.RequestHandler]]]:
    return [
        (prefix + "requests", RequestsPage),
        (prefix + "api/requests", AskHandler),
        (prefix + "api/requests/options", OptionsHandler),
        (prefix + "api/requests/mine", MineHandler),
        (prefix + "api/requests/pending", PendingHandler),
        (prefix + r"api/requests/(\d+)/withdraw", WithdrawHandler),
        (prefix + r"api/requests/(\d+)/decide", DecideHandler),
        (prefix + r"api/requests/(\d+)", DeleteHandler),
    ]
