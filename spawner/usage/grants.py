"""Requests for a bigger role: a user asks for a role they do not hold, for a window of
time, with a reason; an admin (or, when the table allows it, an instructor of the user's
group) approves or refuses; an approval is a grant that holds until the window ends.

The rows of the ledger's ``role_requests`` are the grants' audit trail: who asked, why,
who decided, when and with what comment. Nothing is deleted, and a grant needs no
clean-up to end: ``granted_roles`` only counts approved windows that hold now.

Each change returns an ``Outcome``: the request, or a sentence saying why nothing was
done, and the event for the hub's event log (a payload of usage/events.py: the request's
facts, the reason and the comment as fields), so the user is told either way.

One user may have at most the table's ``requests: max_open`` requests waiting, one per
role. ``ask`` counts and checks under a lock of that user (usage/locks.py), so asks sent
all at once are taken one at a time, and the ledger's unique index on waiting requests
(``uq_role_requests_open``) refuses a second one for the same role from any writer.

Everything here reads or writes the ledger and blocks: call it from a thread.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, replace
from typing import Any

from sqlalchemy import Engine, and_, delete, insert, select, update
from sqlalchemy.exc import IntegrityError

from spawner.quota.model import QuotaTable
from spawner.quota.units import format_moment, valid_moment
from spawner.usage.events import (
    EventKind,
    RoleRequestApproved,
    RoleRequestAsked,
    RoleRequestEvent,
    RoleRequestRefused,
    RoleRequestWithdrawn,
)
from spawner.usage.locks import one_at_a_time
from spawner.usage.schema import role_requests

PENDING, APPROVED, REFUSED, WITHDRAWN = "pending", "approved", "refused", "withdrawn"
STATES = (PENDING, APPROVED, REFUSED, WITHDRAWN)
# The hub's events (docs/role-requests.md#events), by the names this module gave them.
ASKED = EventKind.ROLE_REQUEST
APPROVED_EVENT = EventKind.ROLE_REQUEST_APPROVED
REFUSED_EVENT = EventKind.ROLE_REQUEST_REFUSED
WITHDRAWN_EVENT = EventKind.ROLE_REQUEST_WITHDRAWN
MAX_REASON = 2000  # characters; a reason is a sentence or two, not a document
DAY = 86400.0
# How far ahead a request may start (docs/security.md#input-limits).
REQUEST_HORIZON_DAYS = 366
# pg_advisory_xact_lock's kind for one user's asks ("reqs" in ASCII): usage/locks.py
REQUESTS_LOCK = 0x72657173


@dataclass(frozen=True)
class RoleRequest:
    """One row of ``role_requests``."""

    id: int
    user_name: str
    groups: tuple[str, ...]  # the user's groups when they asked
    role: str
    starts: float
    ends: float
    reason: str
    state: str
    asked_at: float
    decided_by: str | None = None
    decided_at: float | None = None
    decision_comment: str = ""

    def holds_at(self, now: float) -> bool:
        """Whether this is a grant in force at ``now``."""
        return self.state == APPROVED and self.starts <= now < self.ends

    @property
    def window(self) -> str:
        return f"from {when(self.starts)} to {when(self.ends)}"

    @property
    def broken(self) -> bool:
        """Stored before the input checks with a time no calendar shows: the pages show
        it as broken, and an admin may refuse or delete it."""
        return not (valid_moment(self.starts) and valid_moment(self.ends))


@dataclass(frozen=True)
class Outcome:
    """What an ask, decision or withdrawal did: ``refusal`` says why nothing was done;
    ``reply`` is the sentence for whoever made the change, ``payload`` the event for
    those it is told to."""

    request: RoleRequest | None = None
    refusal: str | None = None
    payload: RoleRequestEvent | None = None
    reply: str = ""

    @property
    def done(self) -> bool:
        return self.refusal is None

    @property
    def event(self) -> EventKind | None:
        return self.payload.kind if self.payload is not None else None

    @property
    def fields(self) -> dict[str, Any]:
        """The event's fields as the log writes them, but the hub's id (``emit``'s)."""
        if self.payload is None:
            return {}
        fields = self.payload.fields()
        del fields["hub"]
        return fields

    def emit(self, events: Any, **extra: Any) -> None:
        """Append the event to an ``EventLog`` (``extra``: ``hub=...``); none if refused."""
        if self.payload is not None:
            events.append(replace(self.payload, **extra))


def when(t: float) -> str:
    """A moment for people: '2026-12-20 14:00 UTC' (never raises)."""
    return format_moment(t)


def _days(seconds: float) -> str:
    days = seconds / 86400
    return f"{days:.3g} day{'' if days == 1 else 's'}"


def _row(row: Any) -> RoleRequest:
    values = dict(row._mapping)
    values["groups"] = tuple(g for g in values["groups"].split(",") if g)
    return RoleRequest(**values)


def _event(payload: type[RoleRequestEvent], request: RoleRequest, reply: str) -> Outcome:
    return Outcome(request, None, payload(
        id=request.id, user=request.user_name, role=request.role, starts=request.starts,
        ends=request.ends, reason=request.reason, who=request.decided_by or request.user_name,
        comment=request.decision_comment), reply)


def get(engine: Engine, request_id: int) -> RoleRequest | None:
    with engine.connect() as connection:
        row = connection.execute(
            select(role_requests).where(role_requests.c.id == request_id)).first()
    return _row(row) if row else None


def ask(engine: Engine, table: QuotaTable, user: str, groups: Iterable[str], role: str,
        starts: float, ends: float, reason: str, now: float) -> Outcome:
    """Record ``user``'s request for ``role`` from ``starts`` to ``ends`` (a start in the
    past means now), or refuse it with a sentence for the user: also when they have a
    request for it waiting, or ``max_open`` requests waiting."""
    groups = tuple(groups)
    rules = table.requests
    reason = reason.strip()
    refusal = None
    if not (math.isfinite(starts) and math.isfinite(ends)):
        return Outcome(refusal="The window's start and end must be times in Unix seconds.")
    starts = max(starts, now)
    if not rules.roles:
        refusal = "Roles cannot be requested on this hub; ask an admin."
    elif role not in rules.roles or role not in table.roles:
        refusal = (f"The role '{role}' cannot be requested; these can: "
                   f"{', '.join(rules.roles)}.")
    elif role in table.role_names_for(user, groups):
        refusal = f"You already hold the role '{role}'."
    elif ends <= now:
        refusal = "The window you asked for has already ended; choose an end in the future."
    elif ends <= starts:
        refusal = "The window must end after it starts."
    elif starts > now + REQUEST_HORIZON_DAYS * DAY:
        refusal = (f"A request may start at most {REQUEST_HORIZON_DAYS} days from now; "
                   "ask again closer to the time.")
    elif ends - starts > rules.max_seconds:
        refusal = (f"The window you asked for is {_days(ends - starts)} long; the longest "
                   f"this hub grants is {_days(rules.max_seconds)}.")
    elif not reason:
        refusal = "Please say why you need this role; admins decide on the reason."
    elif len(reason) > MAX_REASON:
        refusal = f"Please keep the reason under {MAX_REASON} characters."
    if refusal:
        return Outcome(refusal=refusal)
    try:
        with engine.begin() as connection:
            # this user's asks one at a time: the count and the check see every ask before
            one_at_a_time(connection, REQUESTS_LOCK, user)
            mine = [_row(r) for r in connection.execute(select(role_requests).where(and_(
                role_requests.c.user_name == user,
                role_requests.c.state.in_((PENDING, APPROVED)))))]
            refusal = _refusal(mine, role, starts, ends, now, rules.max_open)
            if refusal:
                return Outcome(refusal=refusal)
            new_id = connection.execute(insert(role_requests).values(
                user_name=user, groups=",".join(groups), role=role, starts=starts, ends=ends,
                reason=reason, state=PENDING, asked_at=now)).inserted_primary_key[0]
    except IntegrityError:
        # the unique index on open requests: another writer stored this one first
        waiting = [r for r in requests_of(engine, user) if r.role == role and r.state == PENDING]
        if not waiting:
            raise
        return Outcome(refusal=_asked_already(waiting[0]))
    request = RoleRequest(new_id, user, groups, role, starts, ends, reason, PENDING, now)
    deciders = "Admins" + (", or an instructor of your class," if rules.instructors_approve
                           else "")
    return _event(RoleRequestAsked, request,
                  f"You asked for the role '{role}' {request.window}. {deciders} will "
                  "decide, and you are told either way.")


def _asked_already(other: RoleRequest) -> str:
    return (f"You already asked for the role '{other.role}' on {when(other.asked_at)}; "
            "that request is still waiting for a decision.")


def _refusal(mine: list[RoleRequest], role: str, starts: float, ends: float, now: float,
             max_open: int) -> str | None:
    """Why the user, with their pending and approved requests ``mine``, may not ask for
    ``role`` for this window now; None when they may."""
    for other in mine:
        if other.role == role and other.state == PENDING:
            return _asked_already(other)
        if (other.role == role and other.starts < ends and starts < other.ends
                and other.ends > now):
            return f"You already have the role '{role}' granted {other.window}."
    waiting = sum(r.state == PENDING for r in mine)
    if waiting >= max_open:
        have = f"{waiting} request{'' if waiting == 1 else 's'} waiting for a decision"
        return (f"You have {have}, and this hub allows {max_open} at once: withdraw one on "
                "the requests page (its Withdraw button), or wait for a decision, before "
                "you ask for another.")
    return None


def decider(table: QuotaTable, *, admin: bool, instructor_of: Iterable[str] = (),
            groups_of: Callable[[str], Iterable[str]] | None = None
            ) -> Callable[[RoleRequest], bool]:
    """Who may decide a request: an admin always; an instructor of a group (the caller
    knows whose groups those are) only when the table's ``instructors_approve`` is true
    and the requester is a member, by ``groups_of`` (now), else by their groups when they
    asked."""
    taught = set(instructor_of)

    def may(request: RoleRequest) -> bool:
        if admin:
            return True
        if not table.requests.instructors_approve or not taught:
            return False
        groups = groups_of(request.user_name) if groups_of else request.groups
        return bool(taught & set(groups))

    return may


def decide(engine: Engine, table: QuotaTable, request_id: int, who: str, approve: bool,
           comment: str, may_decide: bool | Callable[[RoleRequest], bool],
           now: float) -> Outcome:
    """Approve or refuse a pending request, or say why not."""
    request = get(engine, request_id)
    if request is None:
        return Outcome(refusal=f"There is no request {request_id}.")
    allowed = may_decide(request) if callable(may_decide) else may_decide
    if not allowed:
        return Outcome(refusal=f"You may not decide the requests of {request.user_name}.")
    if request.state != PENDING:
        by = f" by {request.decided_by}" if request.decided_by else ""
        return Outcome(refusal=f"This request was already {request.state}{by}.")
    if who == request.user_name:
        return Outcome(refusal="You cannot decide your own request.")
    comment = comment.strip()
    if approve:
        # the table as it is now: an admin may have changed it since the request
        rules = table.requests
        if request.broken:
            return Outcome(refusal=("This request's window holds a time no calendar can "
                                    "show; it can only be refused or deleted."))
        if request.role not in table.roles:
            return Outcome(refusal=(f"The role '{request.role}' is no longer in the quota "
                                    "table; refuse this request."))
        if request.role not in rules.roles:
            return Outcome(refusal=(f"The role '{request.role}' can no longer be requested: "
                                    "the quota table's requests: roles does not list it now. "
                                    "Refuse this request, or have an admin add the role back "
                                    "first."))
        if request.ends - max(request.starts, now) > rules.max_seconds:
            return Outcome(refusal=(f"This request's window is longer than the "
                                    f"{_days(rules.max_seconds)} the quota table now allows; "
                                    "refuse it and ask for a shorter one."))
        if request.ends <= now:
            return Outcome(refusal=("The window of this request has already ended; it can "
                                    "only be refused."))
    elif not comment:
        return Outcome(refusal="Please say why you refuse: the user is told.")
    state = APPROVED if approve else REFUSED
    with engine.begin() as connection:
        changed = connection.execute(update(role_requests).where(and_(
            role_requests.c.id == request_id, role_requests.c.state == PENDING)).values(
            state=state, decided_by=who, decided_at=now, decision_comment=comment)).rowcount
    if not changed:  # decided or withdrawn meanwhile
        return decide(engine, table, request_id, who, approve, comment, may_decide, now)
    request = RoleRequest(**{**asdict(request), "state": state, "decided_by": who,
                             "decided_at": now, "decision_comment": comment})
    whose = f"{request.user_name}'s request for the role '{request.role}'"
    if approve:
        return _event(RoleRequestApproved, request,
                      f"You approved {whose}: they hold it {request.window}. They are told.")
    return _event(RoleRequestRefused, request,
                  f"You refused {whose}. They are told, with your comment.")


def withdraw(engine: Engine, request_id: int, user: str, now: float) -> Outcome:
    """The user takes back a pending request, or gives up a grant not yet ended."""
    request = get(engine, request_id)
    if request is None or request.user_name != user:
        return Outcome(refusal=f"You have no request {request_id}.")
    if request.state not in (PENDING, APPROVED) or (
            request.state == APPROVED and request.ends <= now):
        return Outcome(refusal=f"This request is {request.state} and has nothing to withdraw."
                       if request.state != APPROVED else "This grant has already ended.")
    with engine.begin() as connection:
        changed = connection.execute(update(role_requests).where(and_(
            role_requests.c.id == request_id, role_requests.c.state == request.state)).values(
            state=WITHDRAWN, decided_by=user, decided_at=now)).rowcount
    if not changed:
        return withdraw(engine, request_id, user, now)
    was = request.state
    request = RoleRequest(**{**asdict(request), "state": WITHDRAWN, "decided_by": user,
                             "decided_at": now, "decision_comment": ""})
    reply = (f"You gave up your grant of the role '{request.role}'." if was == APPROVED
             else f"You withdrew your request for the role '{request.role}'.")
    return _event(RoleRequestWithdrawn, request, reply)


def delete_broken(engine: Engine, request_id: int) -> Outcome:
    """An admin deletes a request whose window cannot be shown (stored before the input
    checks); any other request stays, as the grants' audit trail."""
    request = get(engine, request_id)
    if request is None:
        return Outcome(refusal=f"There is no request {request_id}.")
    if not request.broken:
        return Outcome(request, refusal=("Only a request whose window holds a time no calendar can "
                                "show may be deleted; the others are the grants' record. "
                                "Refuse it instead."))
    with engine.begin() as connection:
        connection.execute(delete(role_requests).where(role_requests.c.id == request_id))
    return Outcome(request, reply=f"Request {request_id} of {request.user_name}, whose window "
                                  "could not be shown, is deleted.")


def pending(engine: Engine, groups: Iterable[str] | None = None) -> list[RoleRequest]:
    """Requests waiting for a decision, oldest first; with ``groups``, only those of
    users who were in one of them when they asked (an instructor's page)."""
    with engine.connect() as connection:
        rows = [_row(r) for r in connection.execute(
            select(role_requests).where(role_requests.c.state == PENDING)
            .order_by(role_requests.c.asked_at, role_requests.c.id))]
    if groups is None:
        return rows
    wanted = set(groups)
    return [r for r in rows if wanted & set(r.groups)]


def requests_of(engine: Engine, user: str) -> list[RoleRequest]:
    """Every request of ``user``, newest first: their page's history."""
    with engine.connect() as connection:
        return [_row(r) for r in connection.execute(
            select(role_requests).where(role_requests.c.user_name == user)
            .order_by(role_requests.c.asked_at.desc(), role_requests.c.id.desc()))]


def granted_roles(engine: Engine, user: str, now: float) -> set[str]:
    """The roles granted to ``user`` at ``now``: approved requests whose window holds it."""
    with engine.connect() as connection:
        return set(connection.execute(select(role_requests.c.role).where(and_(
            role_requests.c.user_name == user, role_requests.c.state == APPROVED,
            role_requests.c.starts <= now, role_requests.c.ends > now))).scalars())
