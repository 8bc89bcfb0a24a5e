"""The hub's events in the watchdog's words: each kind told in one place.

``word`` gives what a message says of one event of the hub's event log (a payload of
spawner/usage/events.py): the title's subject, the ``What:`` line, when it happens, the
lines about a request, and what to do. hub_events.py makes the incidents of the events
and notify.py the messages; neither words an event itself. A preemption and its call-off
(``preemption``), a GPU-hour budget (``budget``) and a request for a role
(``role_request``) are each one function here.

Everything is read from the event's fields, never from a sentence: what a person typed (a
request's reason, a decider's comment) is quoted as data (``text.quoted``), names are
shown bare only when plain (``text.name``), and a sentence the hub wrote for the people
told (a preemption's ``reason``, a budget's ``text``) is shown as it is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from spawner.quota.units import valid_moment
from spawner.usage.events import (
    BudgetEvent,
    EventKind,
    HubEvent,
    Preempted,
    Preemption,
    PreemptionEvent,
    RoleRequestEvent,
)
from spawner.watchdog.text import day_and_time, duration, is_plain, name, quoted, utc


@dataclass(frozen=True)
class Words:
    """What a message says of one hub event."""

    subject: str  # the title's, after "[severity] "
    what: str  # the What line
    advice: str | None = None  # the What to do line
    when: str | None = None  # the When line: a preempted server's deadline
    lines: tuple[str, ...] = ()  # a request's Who, Role and Window lines
    gpus: tuple[str, ...] = ()  # the GPUs the event names


# What to do, by the hub's event; a call-off and a withdrawal need nothing.
ADVICE = {
    EventKind.PREEMPTION: (
        "Save your notebooks and files now. The kernels were sent SIGTERM: those that "
        "called spawner.checkpoint.on_preempt() save their checkpoints now, the others "
        "have ended. At the deadline the server stops; the home folder is kept."),
    EventKind.PREEMPTED: (
        "Start the server again from the hub when a GPU is free; the home folder, with "
        "the checkpoints saved in it, is as it was."),
    EventKind.BUDGET_WARNING: (
        "Stop the GPU servers you do not need: a budget counts the time GPUs are reserved, "
        "busy or not. Roles without GPUs do not count against it."),
    EventKind.BUDGET_SPENT: (
        "Save your work and stop the server when you are done: no new GPU server can start "
        "until the budget resets. Roles without GPUs can still be started."),
    EventKind.ROLE_REQUEST: (
        "Admins, and the user's instructors when the quota table allows it, approve or "
        "refuse it in the usage service's requests; a refusal needs a comment, which the "
        "user is told."),
    EventKind.ROLE_REQUEST_APPROVED: (
        "Choose the role on the spawn form while the window holds; the grant ends by "
        "itself at its end, and a running server keeps its limits until it stops. Give it "
        "up in the usage service's requests if you no longer need it."),
    EventKind.ROLE_REQUEST_REFUSED: (
        "Ask again with another window or a clearer reason, or ask whoever refused it."),
}
# a spent budget whose servers are being stopped
BUDGET_STOPPING = (
    "Go on with a role without GPUs, which budgets do not count; the home folder is "
    "kept. GPU roles can be started again when the budget resets.")


def word(event: HubEvent, now: float) -> Words:
    """What the messages say of ``event`` at ``now``; ValueError for a kind the watchdog
    does not tell (the queue's)."""
    if isinstance(event, PreemptionEvent):
        return preemption(event, now)
    if isinstance(event, BudgetEvent):
        return budget(event)
    if isinstance(event, RoleRequestEvent):
        return role_request(event)
    raise ValueError(f"the watchdog does not tell {event.kind} events")


def _sentence(text: str) -> str:
    return text.rstrip(". ") + "." if text else ""


def _whose(user: str) -> str:
    return f"{name(user)}'s server" if user else "a server"


def _clock(epoch: float) -> str:
    """'14:32 UTC': a time within minutes, for people."""
    return utc(epoch, "%H:%M UTC")


# --- preemptions ---------------------------------------------------------------------


def preemption(event: PreemptionEvent, now: float) -> Words:
    """A server preempted (``preemption``), stopped (``preempted``) or kept
    (``preemption-withdrawn``)."""
    whose, by = _whose(event.user), name(event.by) if event.by else "another user"
    if isinstance(event, Preempted):
        after = (f" after running for {duration(event.ran_for)}"
                 if event.ran_for is not None else "")
        return Words(f"{whose} was stopped: preempted by {by}",
                    f"The server was stopped{after}, to free its GPUs for {by}.",
                    ADVICE[event.kind], gpus=event.gpus)
    if not isinstance(event, Preemption):  # called off
        why = _sentence(event.why)
        return Words(f"{whose} will not be stopped: the preemption by {by} was called off",
                    f"The preemption for {by} was called off{': ' + why if why else '.'} "
                    "The server keeps running.")
    at = f" at {_clock(event.deadline)}" if event.deadline is not None else ""
    role = f" for the role {name(event.by_role)}" if event.by_role else ""
    reason = _sentence(event.reason)
    if reason:  # the hub's sentence names both roles and priorities
        what = f"Preempted by {by}{role}. {reason}"
    else:
        ranks = (f" (priority {event.by_priority:.0f}, above this server's "
                 f"{event.priority:.0f})"
                 if event.by_priority is not None and event.priority is not None else "")
        what = f"Preempted by {by}{role}{ranks}."
    return Words(f"{whose} will be stopped{at}: preempted by {by}", what, ADVICE[event.kind],
                when=_deadline(event, now), gpus=event.gpus)


def _deadline(event: Preemption, now: float) -> str | None:
    """When a preempted server stops, against ``now``: the deadline is what counts."""
    if event.deadline is None:
        return None
    given = (f" (a grace period of {duration(event.grace_period)})"
             if event.grace_period is not None else "")
    at = _clock(event.deadline)
    if not valid_moment(event.deadline):  # no countdown to a moment that cannot be
        return f"stopped at {at}{given}"
    left = event.deadline - now
    if left <= 0:
        return f"stopped at {at}, {duration(-left)} ago{given}"
    return f"stopped at {at}, in {duration(left)}{given}"


# --- GPU-hour budgets ------------------------------------------------------------------


def budget(event: BudgetEvent) -> Words:
    """A budget of the user nearly spent (``budget-warning``) or spent (``budget-spent``)."""
    whose = _whose(event.user)
    owner = event.budget_name or event.user
    owner = name(owner) if owner else ""
    if owner and event.budget_kind == "group":
        owner = f"the group {owner}"
    of = f"GPU-hour budget of {owner}" if owner else "a GPU-hour budget"
    spent = event.kind == EventKind.BUDGET_SPENT
    if spent and event.stopping:
        subject, advice = f"{whose} will be stopped: {of} spent", BUDGET_STOPPING
    elif spent:
        subject, advice = f"{of} spent: {whose} keeps running", ADVICE[event.kind]
    else:
        share = "nearly"
        if event.used is not None and event.gpu_hours:
            percent = event.used / event.gpu_hours * 100 + 1e-9
            share = f"{int(percent)}%" if math.isfinite(percent) else share
        subject, advice = f"{of} {share} used: {whose}", ADVICE[event.kind]
    return Words(subject, _budget_what(event), advice)


def _budget_what(event: BudgetEvent) -> str:
    """The hub's sentence, or one made from the numbers when it gave none."""
    if event.text:
        return _sentence(event.text)
    numbers = ""
    if event.used is not None and event.gpu_hours is not None:
        numbers = f": {event.used:.1f} of {event.gpu_hours:g} GPU-hours used"
        numbers += f" this {event.per}" if event.per else ""
    if event.budget_kind == "group" and event.budget_name:
        owner = f"the group {name(event.budget_name)}"
    else:
        owner = name(event.budget_name or event.user)
    state = "spent" if event.kind == EventKind.BUDGET_SPENT else "nearly spent"
    return f"The GPU-hour budget of {owner} is {state}{numbers}."


# --- requests for a bigger role ----------------------------------------------------------


def role_request(event: RoleRequestEvent) -> Words:
    """A request for a role (``role-request``), its decision (``-approved``,
    ``-refused``) or its withdrawal (``-withdrawn``): about a user and a role."""
    user = name(event.user) if event.user else "a user"
    role = f"the role {name(event.role)}" if event.role else "a role"
    by = f" by {name(event.who)}" if event.who else ""
    subject = {
        EventKind.ROLE_REQUEST_APPROVED: f"{user}'s request for {role} approved{by}",
        EventKind.ROLE_REQUEST_REFUSED: f"{user}'s request for {role} refused{by}",
        EventKind.ROLE_REQUEST_WITHDRAWN: f"{user} withdrew the request for {role}",
    }.get(event.kind, f"{user} asks for {role}")
    lines = [f"Who: {name(event.user)}"] if event.user else []
    if event.role:
        lines.append(f"Role: {name(event.role)}")
    if event.starts is not None and event.ends is not None:
        lines.append(f"Window: from {day_and_time(event.starts)} to "
                     f"{day_and_time(event.ends)}")
    return Words(subject, _request_what(event), ADVICE.get(event.kind), lines=tuple(lines))


def _request_what(event: RoleRequestEvent) -> str:
    """The request's sentence, with what the user or the decider typed quoted; a record
    without the hub's sentence (not one a hub wrote whole) in short, from what it names."""
    if event.whole:
        return event.sentence(quote=quoted)
    role = f"the role {_role(event.role)}" if event.role else "a role"
    user = name(event.user)
    if event.kind == EventKind.ROLE_REQUEST:
        return f"{user} asks for {role}."
    if event.kind == EventKind.ROLE_REQUEST_WITHDRAWN:
        return f"{user} withdrew the request for {role}."
    state = "approved" if event.kind == EventKind.ROLE_REQUEST_APPROVED else "refused"
    by = f" by {name(event.who)}" if event.who else ""
    return f"The request for {role} was {state}{by}."


def _role(role: str) -> str:
    """'gpu-training', in single quotes as the hub writes it; an odd name quoted."""
    return f"'{role}'" if is_plain(role) else quoted(role)
