"""The hub's event log, told: a preemption to the people of the server it stops, a
GPU-hour budget to the user it runs short for.

The hub appends its preemption and queue events to a JSON-lines file
(``spawner.usage.event_log``). Each cycle the watchdog reads what was appended since
the last one (``read_new``), from the position the incident book keeps
(``IncidentBook.events``), so a restart tells nothing twice and misses
nothing; the very first read starts at the file's end, so the hub's history
is not told again. Events of another hub (``for_hub``) are left out.

Each record is read as its payload (``HubEvent.from_json``, spawner/usage/events.py)
and worded by hub_words.py, the one place each kind is told.

``preemption_events`` turns the hub's ``preemption``, ``preempted`` and
``preemption-withdrawn`` into the rules' ``Event``s, about the server that is
stopped: ``notify.py`` routes them as that server's incidents
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
or shown plain as ``text.py`` says: from its own field, never found in a sentence.

Only ``read_new`` blocks (file I/O).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from sqlalchemy import Engine

from spawner.usage import event_store
from spawner.usage.event_log import read_events
from spawner.usage.events import (
    BudgetEvent,
    HubEvent,
    Preempted,
    Preemption,
    PreemptionEvent,
    RoleRequestEvent,
    ServerEvent,
)
from spawner.watchdog.hub_words import word
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


def facts(event: dict[str, Any]) -> dict[str, Any]:
    """What the messages use of one event of the log, each field of its type or left out
    (``HubEvent.from_json``): the log is another program's file, and a wrong field must
    not break a cycle. The incident keeps it (``Incident.hub_event``)."""
    payload = HubEvent.from_json(event)
    if payload is None:
        kind = event.get("event")
        return {"event": kind.strip() if isinstance(kind, str) else ""}
    return payload.facts()


# one reading for every kind, also under the names it had for budgets and requests
budget_facts = request_facts = facts


def _server(event: ServerEvent, gpus: tuple[str, ...], servers: dict[str, Server]) -> Server:
    """The snapshot's server of the event's container (with its image and GPUs), else
    the server as the event names it."""
    server = servers.get(event.container)
    if server is None or server.user != event.user:
        server = Server(container_id="", name=event.container, user=event.user,
                        role=event.role, image="", hub_id=event.hub, gpus=gpus)
    return server


def _at(event: HubEvent, snapshot: Snapshot) -> float:
    return event.time if event.time is not None else snapshot.time


def _servers(snapshot: Snapshot) -> dict[str, Server]:
    return {s.server.name: s.server for s in snapshot.servers.values()}


def _preemption(event: PreemptionEvent, snapshot: Snapshot,
                servers: dict[str, Server]) -> Incident:
    named = event.gpus if isinstance(event, Preemption | Preempted) else ()
    server = _server(event, named, servers)
    gpus = named or server.gpus
    one = gpus[0] if len(gpus) == 1 else None
    sample = snapshot.gpus.get(one) if one else None
    return Incident(
        key=f"{PREEMPTION}:{event.container or event.user}", rule=PREEMPTION,
        severity="warning" if isinstance(event, Preemption) else "info", server=server,
        since=_at(event, snapshot), gpu_uuid=one,
        gpu_index=sample.index if sample else None, host=snapshot.host,
        what=word(event, snapshot.time).what, hub_event=event.facts())


def _budget(event: BudgetEvent, snapshot: Snapshot, servers: dict[str, Server]) -> Incident:
    kind, name = event.budget_kind or "user", event.budget_name or event.user
    # a group's budget concerns each member: one incident each
    key = f"{BUDGET}:{kind}:{name}" + (f":{event.user}" if kind == "group" else "")
    return Incident(
        key=key, rule=BUDGET, severity="warning", server=_server(event, (), servers),
        since=_at(event, snapshot), host=snapshot.host,
        what=word(event, snapshot.time).what, hub_event=event.facts())


def _role_request(event: RoleRequestEvent, snapshot: Snapshot) -> Incident:
    # about the user and the role asked for: no container
    server = Server(container_id="", name="", user=event.user, role=event.role,
                    image="", hub_id=event.hub)
    key = f"{ROLE_REQUEST}:{event.user if event.id is None else event.id}:{event.kind}"
    return Incident(key=key, rule=ROLE_REQUEST, severity="info", server=server,
                    since=_at(event, snapshot), host=snapshot.host,
                    what=word(event, snapshot.time).what, hub_event=event.facts())


def _tell(record: dict[str, Any], rules: WatchdogRules, snapshot: Snapshot,
          servers: dict[str, Server], rule: str | None = None) -> Event | None:
    """The message of one record of the log, when its rule (``rule`` only, if given) is
    on; None for an event the watchdog does not tell, or one without a user (nobody
    to tell)."""
    event = HubEvent.from_json(record)
    if not isinstance(event, PreemptionEvent | BudgetEvent | RoleRequestEvent) \
            or not event.user:
        return None
    incident = None
    if isinstance(event, PreemptionEvent) and rule in (None, PREEMPTION) \
            and rules.enabled(PREEMPTION):
        incident = _preemption(event, snapshot, servers)
    elif isinstance(event, BudgetEvent) and rule in (None, BUDGET) and rules.enabled(BUDGET):
        incident = _budget(event, snapshot, servers)
    elif isinstance(event, RoleRequestEvent) and rule in (None, ROLE_REQUEST) \
            and rules.enabled(ROLE_REQUEST):
        incident = _role_request(event, snapshot)
    return _instant(incident, incident.since) if incident is not None else None


def _told(events: Iterable[dict[str, Any]], rules: WatchdogRules, snapshot: Snapshot,
          rule: str | None = None) -> list[Event]:
    servers = _servers(snapshot)
    return [e for e in (_tell(r, rules, snapshot, servers, rule) for r in events)
            if e is not None]


def preemption_events(events: Iterable[dict[str, Any]], rules: WatchdogRules,
                      snapshot: Snapshot) -> list[Event]:
    """The messages for this hub's preemption events, in the log's order.

    The server is the snapshot's when its container is there (with its image
    and GPUs), else as the event names it. An event without a user is left
    out: nobody to tell.
    """
    return _told(events, rules, snapshot, PREEMPTION)


def budget_events(events: Iterable[dict[str, Any]], rules: WatchdogRules,
                  snapshot: Snapshot) -> list[Event]:
    """The messages for this hub's budget events, in the log's order; each about the
    user's server (as ``preemption_events`` finds it). An event without a user is left
    out."""
    return _told(events, rules, snapshot, BUDGET)


def role_request_events(events: Iterable[dict[str, Any]], rules: WatchdogRules,
                        snapshot: Snapshot) -> list[Event]:
    """The messages for this hub's requests for a bigger role, in the log's order. The
    incident's server names the user and the role asked for (no container). An event
    without a user is left out."""
    return _told(events, rules, snapshot, ROLE_REQUEST)


def hub_event_messages(events: Iterable[dict[str, Any]], rules: WatchdogRules,
                       snapshot: Snapshot) -> list[Event]:
    """The messages of every hub event the watchdog tells (preemptions, budgets and
    requests for a role), in the log's order."""
    return _told(events, rules, snapshot)
