"""The page for requests for a bigger role, in the usage service (docs/role-requests.md).

``GET {prefix}requests`` is the service's landing page for every logged-in user:

- a form to ask for a role (those under the table's ``requests: roles`` that the user
  does not hold), for a window of at most ``max_days``, with a reason;
- the user's own requests with their state (waiting, approved until …, refused with the
  decider's comment, withdrawn, expired), and a button to withdraw one or give up a grant;
- for those who decide (admins; instructors of the requester's group when the table's
  ``instructors_approve`` is true), "Requests to decide", each with approve or refuse and
  a comment. Nobody else gets that section, and the API refuses them as well.

The page is rendered here first, so reading it needs no script; ``static/requests.js``
performs the actions through the JSON API of :mod:`spawner.webapp.requests`, with
the XSRF token the page carries, then reloads the page. Every user-chosen text (names,
reasons, comments) goes through Jinja's autoescape; the script only sets textContent.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import tzinfo
from typing import Any

from tornado import web

from spawner.quota.model import QuotaTable
from spawner.quota.units import format_moment
from spawner.usage import grants as rr
from spawner.webapp import requests as requests_api
from spawner.webapp.app import Refused, UsageHandler
from spawner.webapp.table_page import PAGE_CSP, static_version

log = logging.getLogger("quota_spawner.usage")


def script_version() -> str:
    return static_version("requests.js")


@dataclass(frozen=True)
class Row:
    """One request as the page shows it; the texts are escaped by the template."""

    id: int
    user: str
    groups: str
    role: str
    window: str
    reason: str
    asked: str
    state: str  # waiting, upcoming, granted, expired, refused, withdrawn: the CSS class
    status: str  # the state in words
    comment: str
    withdraw: str  # the button's label; empty: nothing to withdraw
    broken: bool = False  # a window no calendar shows: refused or deleted, never approved


def row(r: rr.RoleRequest, now: float, when: Callable[[float], str]) -> Row:
    by = r.decided_by or ""
    if r.state == rr.PENDING:
        state, status, withdraw = "waiting", "Waiting for a decision", "Withdraw"
    elif r.state == rr.APPROVED and r.ends <= now:
        state, status, withdraw = "expired", f"Expired: the grant ended on {when(r.ends)}", ""
    elif r.state == rr.APPROVED and r.starts > now:
        state, status, withdraw = ("upcoming", f"Approved by {by}, from {when(r.starts)} "
                                   f"until {when(r.ends)}", "Give up the grant")
    elif r.state == rr.APPROVED:
        state, status, withdraw = ("granted", f"Approved by {by}, until {when(r.ends)}",
                                   "Give up the grant")
    elif r.state == rr.REFUSED:
        state, status, withdraw = "refused", f"Refused by {by}", ""
    else:
        state, status, withdraw = "withdrawn", (
            f"Withdrawn on {when(r.decided_at)}" if r.decided_at else "Withdrawn"), ""
    if r.broken:
        status = f"{status}. Its window holds a time no calendar can show."
    return Row(r.id, r.user_name, ", ".join(r.groups), r.role,
               f"{when(r.starts)} to {when(r.ends)}", r.reason, when(r.asked_at), state,
               status, r.decision_comment, withdraw, r.broken)


def clock_text(tz: tzinfo) -> Callable[[float], str]:
    return lambda t: format_moment(t, tz)


class RequestsPage(UsageHandler):
    """GET {prefix}requests: ask, follow one's requests, and decide those of others."""

    page_title = "Role requests"

    def set_default_headers(self) -> None:
        super().set_default_headers()
        self.set_header("Content-Security-Policy", PAGE_CSP)

    @web.authenticated
    async def get(self) -> None:
        options = requests_api.shared_options(self.application)
        model = self.current_user
        user = str(model["name"])
        now = options["clock"]()
        when = clock_text(self.tz)
        # What the ask form needs; a missing table or a silent hub leaves the form out
        # with the sentence, while the user's requests are still shown.
        problem = ""
        table: QuotaTable | None = None
        askable: list[dict[str, str]] = []
        held: list[str] = []
        granted: set[str] = set()
        try:
            table = await requests_api.load_table(self.reader, options["quota_file"])
            groups = await options["groups_of"](user)
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
        if table is not None and requests_api.decider_for_model(model, table) is None:
            waiting = await self.reader.run(rr.pending)
            try:
                may = await requests_api.decider_for(model, table, waiting,
                                                     options["groups_of"])
                # nobody decides their own request: an admin's shows under theirs only
                to_decide = [row(r, now, when) for r in waiting
                             if may(r) and r.user_name != user]
            except Refused as e:
                to_decide, decide_problem = [], e.sentence
        elif table is None and model.get("admin") is True:
            to_decide, decide_problem = [], problem
        log.debug("Requests page: %s, %d own, deciding %s", user, len(mine),
                  None if to_decide is None else len(to_decide))

        prefix = self.settings["usage_prefix"]
        rules = table.requests if table is not None else None
        self.render_page(
            "requests.html", title="Role requests", problem=problem,
            no_roles=rules is not None and not rules.roles, askable=askable, held=held,
            granted=sorted(granted), max_days=f"{rules.max_days:g}" if rules else "0",
            instructors_approve=bool(rules and rules.instructors_approve),
            mine=mine, to_decide=to_decide, decide_problem=decide_problem,
            admin=model.get("admin") is True,
            max_reason=rr.MAX_REASON,
            xsrf=self.xsrf(),
            api=prefix + "api/requests", script=f"{prefix}static/requests.js?v={script_version()}")


def routes(prefix: str) -> list[tuple[Any, ...]]:
    """The page's route, for make_app; its script is served by the editor's static route
    ({prefix}static/) and its data come from the requests API's routes."""
    prefix = prefix if prefix.endswith("/") else prefix + "/"
    return [(prefix + "requests", RequestsPage)]
