"""The hub's event log, told: a preemption to the people of the server it stops, a
GPU-hour budget to the user it runs short for.

The hub appends its preemption and queue events to a JSON-lines file
(``spawner.usage.event_log``). Each cycle the watchdog reads what was appended since
the last one (``read_new``), from the position the incident book keeps
(``IncidentBook.events``), so a restart tells nothing twice and misses
nothing; the very first read starts at the file's end, so the hub's history
is not told again. Events of another hub (``for_hub``) are left out.

``preemption_events`` turns the hub's ``preemption``, ``preempted`` and
``preemption-withdrawn`` into the rules' ``Event``s, about the server that is
stopped: ``notify.py`` words them and routes them as that server's incidents
(admins, its user's groups, its role, its user). Each is one message, as an
OOM kill is: no reminder and no resolved message. The queue's events are
not told.

``budget_events`` turns the hub's ``budget-warning`` (a budget of a running
GPU server's user passed its warn_at) and ``budget-spent`` (spent; the
server is being stopped when ``stopping``) into messages about that server
(rule ``budget``): to its user, and for a group's budget to that group's
channels (its instructors), never to the user's other groups. The hub tells
each once per user, budget and period (``spawner.usage.budgets.BudgetWatch``).

``role_request_events`` turns the hub's requests for a bigger role
(``spawner.usage.grants``; rule ``role_request``) into messages about the user
and the role asked for: ``role-request`` to admins and the user's groups'
channels (their instructors, who may decide when the table allows it);
``role-request-approved``, ``-refused`` and ``-withdrawn`` to the user.

``hub_event_messages`` is all of them, in the log's order: what a cycle tells.
The app words each event on its own, so one it cannot word never holds up the
others. The log's fields are checked for their type (a NaN or infinite number
is left out), and what users typed (a reason, a comment, a name) is quoted
or shown plain as ``text.py`` says.

Only ``read_new`` blocks (file I/O).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from typing import Any

from sqlalchemy import Engine

from spawner.usage import event_store
from spawner.usage.event_log import read_events
from spawner.watchdog.model import Server, Snapshot
from spawner.watchdog.rules import (
    BUDGET,
    PREEMPTION,
    ROLE_REQUEST,
    Event,
    EventCursor,
    Incident,
    WatchdogRules,
    _instant,
)
from spawner.watchdog.text import duration, is_plain, quoted
from spawner.watchdog.text import name as shown

NOTICE, STOPPED, WITHDRAWN = "preemption", "preempted", "preemption-withdrawn"
PREEMPTION_EVENTS = (NOTICE, STOPPED, WITHDRAWN)
BUDGET_WARNING, BUDGET_SPENT = "budget-warning", "budget-spent"
BUDGET_EVENTS = (BUDGET_WARNING, BUDGET_SPENT)
ASKED, APPROVED, REFUSED, GIVEN_UP = ("role-request", "role-request-approved",
                                      "role-request-refused", "role-request-withdrawn")
REQUEST_EVENTS = (ASKED, APPROVED, REFUSED, GIVEN_UP)
_CHUNK = 1 << 16


# --- reading ---------------------------------------------------------------------


def read_new(path: str, cursor: EventCursor | None) -> tuple[list[dict[str, Any]], EventCursor]:
    """The whole events appended to ``path`` after ``cursor``, and the cursor after them.

    With no cursor, or one of another path: none, and a cursor at the end of
    the last whole line. A file with another inode than the cursor's (rotated,
    or created since) is read from its start; a shorter one too (truncated,
    ``read_events``). A missing file is no events. Blocks; raises OSError
    when the file cannot be read.
    """
    try:
        inode = os.stat(path).st_ino
    except FileNotFoundError:
        return [], EventCursor(path)
    if cursor is None or cursor.path != path:
        return [], EventCursor(path, _end_of_last_line(path), inode)
    offset = cursor.offset if cursor.inode == inode else 0
    events, offset = read_events(path, offset)
    return events, EventCursor(path, offset, inode)


def read_new_rows(engine: Engine, where: str, cursor: EventCursor | None,
                  node: str) -> tuple[list[dict[str, Any]], EventCursor]:
    """``read_new`` for the ledger's ``events`` table (usage/event_store.py), where a
    watchdog that shares no folder with the hub reads: ``where`` names the database (its
    URL without password) and the cursor's offset is the last id read. Only the events
    this watchdog (``node``) claimed first: with one per node, each is told once. With no
    cursor, or one of another log: none, and a cursor at the newest event. Blocks."""
    if cursor is None or cursor.path != where:
        return [], EventCursor(where, event_store.last_id(engine))
    found, last = event_store.claim_after(engine, cursor.offset, node)
    return found, EventCursor(where, last)


def _end_of_last_line(path: str) -> int:
    """The offset just after the file's last newline (0 if none), read from the end:
    the log only grows, and a line being written now is read whole next cycle."""
    with open(path, "rb") as f:
        end = os.fstat(f.fileno()).st_size
        while end > 0:
            start = max(0, end - _CHUNK)
            f.seek(start)
            newline = f.read(end - start).rfind(b"\n")
            if newline >= 0:
                return start + newline + 1
            end = start
    return 0


def for_hub(events: Iterable[dict[str, Any]], hub_id: str) -> list[dict[str, Any]]:
    """The events of hub ``hub_id``; all of them while the watchdog knows no hub id."""
    return [e for e in events if not hub_id or e.get("hub") == hub_id]


# --- telling ---------------------------------------------------------------------


def _text(value: Any) -> str:
    return value.strip() if isinstance(value, str) else ""


def _number(value: Any) -> float | None:
    # bool is an int, but never a time or a priority; NaN and infinity are no number
    # a message can use
    if isinstance(value, int | float) and not isinstance(value, bool):
        number = float(value)
        return number if math.isfinite(number) else None
    return None


def facts(event: dict[str, Any]) -> dict[str, Any]:
    """What the messages use of one preemption event, each field of its type or left out:
    the log is another program's file, and a wrong field must not break a cycle."""
    out: dict[str, Any] = {"event": _text(event.get("event"))}
    for name in ("by", "by_role", "reason", "why", "user", "role", "container", "hub"):
        if _text(event.get(name)):
            out[name] = _text(event[name])
    for name in ("time", "deadline", "grace_period", "ran_for", "priority", "by_priority"):
        if _number(event.get(name)) is not None:
            out[name] = _number(event[name])
    gpus = event.get("gpus")
    if isinstance(gpus, list):
        out["gpus"] = [g for g in gpus if isinstance(g, str) and g]
    return out


def _sentence(text: str) -> str:
    return text.rstrip(". ") + "." if text else ""


def _what(f: dict[str, Any]) -> str:
    """What happens, in the hub's words where it gave them."""
    by = shown(f["by"]) if f.get("by") else "another user"
    if f["event"] == STOPPED:
        ran = f.get("ran_for")
        after = f" after running for {duration(ran)}" if ran is not None else ""
        return f"The server was stopped{after}, to free its GPUs for {by}."
    if f["event"] == WITHDRAWN:
        why = _sentence(f.get("why", ""))
        return f"The preemption for {by} was called off{': ' + why if why else '.'} " \
               "The server keeps running."
    role = f" for the role {shown(f['by_role'])}" if f.get("by_role") else ""
    reason = _sentence(f.get("reason", ""))
    if reason:  # the hub's sentence names both roles and priorities
        return f"Preempted by {by}{role}. {reason}"
    ranks = (f" (priority {f['by_priority']:.0f}, above this server's {f['priority']:.0f})"
             if "by_priority" in f and "priority" in f else "")
    return f"Preempted by {by}{role}{ranks}."


def _server(f: dict[str, Any], servers: dict[str, Server]) -> Server:
    """The snapshot's server of the event's container (with its image and GPUs), else
    the server as the event names it."""
    user, container = f["user"], f.get("container", "")
    server = servers.get(container)
    if server is None or server.user != user:
        server = Server(container_id="", name=container, user=user, role=f.get("role", ""),
                        image="", hub_id=f.get("hub", ""), gpus=tuple(f.get("gpus", ())))
    return server


def preemption_events(events: Iterable[dict[str, Any]], rules: WatchdogRules,
                      snapshot: Snapshot) -> list[Event]:
    """The messages for this hub's preemption events, in the log's order.

    The server is the snapshot's when its container is there (with its image
    and GPUs), else as the event names it. An event without a user is left
    out: nobody to tell.
    """
    if not rules.enabled(PREEMPTION):
        return []
    servers = {s.server.name: s.server for s in snapshot.servers.values()}
    told = []
    for event in events:
        f = facts(event)
        if f["event"] not in PREEMPTION_EVENTS or "user" not in f:
            continue
        user, container = f["user"], f.get("container", "")
        server = _server(f, servers)
        gpus = f.get("gpus") or list(server.gpus)
        one = gpus[0] if len(gpus) == 1 else None
        sample = snapshot.gpus.get(one) if one else None
        at = f.get("time", snapshot.time)
        incident = Incident(
            key=f"{PREEMPTION}:{container or user}", rule=PREEMPTION,
            severity="warning" if f["event"] == NOTICE else "info", server=server, since=at,
            gpu_uuid=one, gpu_index=sample.index if sample else None,
            host=snapshot.host, what=_what(f), hub_event=f)
        told.append(_instant(incident, at))
    return told


# --- budgets ---------------------------------------------------------------------


def budget_facts(event: dict[str, Any]) -> dict[str, Any]:
    """What the messages use of one budget event, each field of its type or left out."""
    out: dict[str, Any] = {"event": _text(event.get("event"))}
    for name in ("user", "hub", "container", "role", "budget_kind", "budget_name", "per",
                 "text"):
        if _text(event.get(name)):
            out[name] = _text(event[name])
    for name in ("time", "used", "gpu_hours", "warn_at", "resets_at"):
        if _number(event.get(name)) is not None:
            out[name] = _number(event[name])
    if isinstance(event.get("stopping"), bool):
        out["stopping"] = event["stopping"]
    if out.get("budget_kind") not in ("group", "user"):
        out.pop("budget_kind", None)
    return out


def _budget_owner(f: dict[str, Any]) -> str:
    """'the group cs101' or 'alice': whose budget, for the sentence made of numbers."""
    if f.get("budget_kind") == "group" and f.get("budget_name"):
        return f"the group {shown(f['budget_name'])}"
    return shown(f.get("budget_name") or f.get("user", ""))


def _budget_what(f: dict[str, Any]) -> str:
    """The hub's sentence, or one made from the numbers when it gave none."""
    if f.get("text"):
        return _sentence(f["text"])
    numbers = ""
    if "used" in f and "gpu_hours" in f:
        numbers = f": {f['used']:.1f} of {f['gpu_hours']:g} GPU-hours used"
        numbers += f" this {f['per']}" if f.get("per") else ""
    state = "spent" if f["event"] == BUDGET_SPENT else "nearly spent"
    return f"The GPU-hour budget of {_budget_owner(f)} is {state}{numbers}."


def budget_events(events: Iterable[dict[str, Any]], rules: WatchdogRules,
                  snapshot: Snapshot) -> list[Event]:
    """The messages for this hub's budget events, in the log's order; each about the
    user's server (as ``preemption_events`` finds it). An event without a user is left
    out."""
    if not rules.enabled(BUDGET):
        return []
    servers = {s.server.name: s.server for s in snapshot.servers.values()}
    told = []
    for event in events:
        f = budget_facts(event)
        if f["event"] not in BUDGET_EVENTS or "user" not in f:
            continue
        server = _server(f, servers)
        at = f.get("time", snapshot.time)
        kind, name = f.get("budget_kind", "user"), f.get("budget_name", f["user"])
        # a group's budget concerns each member: one incident each
        key = f"{BUDGET}:{kind}:{name}" + (f":{f['user']}" if kind == "group" else "")
        incident = Incident(
            key=key, rule=BUDGET, severity="warning",
            server=server, since=at, host=snapshot.host, what=_budget_what(f), hub_event=f)
        told.append(_instant(incident, at))
    return told


# --- requests for a bigger role --------------------------------------------------


def request_facts(event: dict[str, Any]) -> dict[str, Any]:
    """What the messages use of one request event, each field of its type or left out."""
    out: dict[str, Any] = {"event": _text(event.get("event"))}
    for name in ("user", "hub", "role", "reason", "who", "comment", "text"):
        if _text(event.get(name)):
            out[name] = _text(event[name])
    for name in ("time", "starts", "ends"):
        if _number(event.get(name)) is not None:
            out[name] = _number(event[name])
    if isinstance(event.get("id"), int) and not isinstance(event.get("id"), bool):
        out["id"] = event["id"]
    return out


def _request_what(f: dict[str, Any]) -> str:
    """The hub's sentence, with what the user or the decider typed in it quoted; or one
    made from the fields when it gave none."""
    if f.get("text"):
        # the reason (a request) or the comment (a decision), where the hub wrote it
        said = f.get("reason") if f["event"] == ASKED else f.get("comment")
        before, found, after = f["text"].rpartition(said) if said else ("", "", "")
        if found:
            return before + quoted(said) + (_sentence(after) if after.strip(". ") else "")
        return _sentence(f["text"])
    role = f"the role {_role(f['role'])}" if f.get("role") else "a role"
    who = shown(f["who"]) if f.get("who") else ""
    if f["event"] == ASKED:
        return f"{shown(f['user'])} asks for {role}."
    if f["event"] == GIVEN_UP:
        return f"{shown(f['user'])} withdrew the request for {role}."
    state = "approved" if f["event"] == APPROVED else "refused"
    return f"The request for {role} was {state}{' by ' + who if who else ''}."


def _role(role: str) -> str:
    """'gpu-training', in single quotes as the hub writes it; an odd name quoted."""
    return f"'{role}'" if is_plain(role) else quoted(role)


def role_request_events(events: Iterable[dict[str, Any]], rules: WatchdogRules,
                        snapshot: Snapshot) -> list[Event]:
    """The messages for this hub's requests for a bigger role, in the log's order. The
    incident's server names the user and the role asked for (no container). An event
    without a user is left out."""
    if not rules.enabled(ROLE_REQUEST):
        return []
    told = []
    for event in events:
        f = request_facts(event)
        if f["event"] not in REQUEST_EVENTS or "user" not in f:
            continue
        at = f.get("time", snapshot.time)
        server = Server(container_id="", name="", user=f["user"], role=f.get("role", ""),
                        image="", hub_id=f.get("hub", ""))
        key = f"{ROLE_REQUEST}:{f.get('id', f['user'])}:{f['event']}"
        incident = Incident(key=key, rule=ROLE_REQUEST, severity="info", server=server,
                            since=at, host=snapshot.host, what=_request_what(f),
                            hub_event=f)
        told.append(_instant(incident, at))
    return told


def hub_event_messages(events: Iterable[dict[str, Any]], rules: WatchdogRules,
                       snapshot: Snapshot) -> list[Event]:
    """The messages of every hub event the watchdog tells (preemptions, budgets and
    requests for a role), in the log's order."""
    told = []
    for event in events:
        told += preemption_events([event], rules, snapshot)
        told += budget_events([event], rules, snapshot)
        told += role_request_events([event], rules, snapshot)
    return told
