"""The hub's events: every kind, and what each one records.

``EventKind`` names every event the hub's event log (usage/event_log.py) holds; its values
are the log's ``event`` field, in the ledger's ``events`` table and the events file, so
they never change. Each kind has one frozen dataclass, its payload: who, what, the
numbers, and what a person typed (a role request's reason, a decider's comment) as a
field of its own. Writers make the payload (the evictor, the GPU queue, the budgets, the
role requests) and ``EventLog.append`` writes it; readers (the watchdog, the tests) read a
record back with ``HubEvent.from_json`` and word it themselves, so nothing takes a
sentence apart to find what it holds.

The JSON fields are those docs/preemption.md#the-event-log lists. Two of them hold a
sentence the hub words itself: a preemption's ``reason`` (the evictor's, also in the
victim's notice) and a budget's ``text`` (budgets.py's, in the table's time zone). A role
request's ``text`` is written for readers of the log (SQL, ``jq``, a watchdog of 0.1):
``RoleRequestEvent.sentence`` words it from the fields, and a reader words the fields.

``from_json`` takes another program's record: each field of its type or left at its
default (a string stripped, a number finite and not a bool), a kind this version does not
know is None. Records written by 0.1, with the same fields, read the same.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar

from spawner.quota.units import format_moment


class EventKind(StrEnum):
    """Every event of the hub's event log (docs/preemption.md#the-event-log)."""

    PREEMPTION = "preemption"  # victims chosen, the grace starts
    PREEMPTED = "preempted"  # the victim was stopped
    PREEMPTION_WITHDRAWN = "preemption-withdrawn"  # called off
    QUEUED = "queued"  # a start began to wait for GPUs or room on the host
    QUEUE_GRANTED = "queue-granted"
    QUEUE_TIMEOUT = "queue-timeout"
    QUEUE_LEFT = "queue-left"  # stopped while it waited
    BUDGET_WARNING = "budget-warning"  # a GPU-hour budget passed its warn_at
    BUDGET_SPENT = "budget-spent"
    ROLE_REQUEST = "role-request"  # a user asks for a role (docs/role-requests.md#events)
    ROLE_REQUEST_APPROVED = "role-request-approved"
    ROLE_REQUEST_REFUSED = "role-request-refused"
    ROLE_REQUEST_WITHDRAWN = "role-request-withdrawn"


# --- reading another program's fields ---------------------------------------------------


def _text(value: Any) -> str | None:
    return value.strip() if isinstance(value, str) else None


def _number(value: Any) -> float | None:
    # bool is an int, but never a time or a priority; NaN and infinity are no number
    # a reader can use
    if isinstance(value, int | float) and not isinstance(value, bool):
        number = float(value)
        return number if math.isfinite(number) else None
    return None


def _whole(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _flag(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def _names(value: Any) -> tuple[str, ...] | None:
    if not isinstance(value, list | tuple):
        return None
    return tuple(v for v in value if isinstance(v, str) and v)


# by a field's annotation (this module's annotations are strings)
_READERS: dict[str, Callable[[Any], Any]] = {
    "str": _text, "float | None": _number, "int | None": _whole, "bool": _flag,
    "tuple[str, ...]": _names,
}


def _json(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


@functools.cache
def _fields_of(payload: type[HubEvent]) -> tuple[tuple[str, Callable[[Any], Any], Any], ...]:
    """Each field of a payload: its name, its reader, its default as JSON."""
    return tuple((f.name, _READERS[str(f.type)], _json(f.default))
                 for f in dataclasses.fields(payload))


# --- the payloads -------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class HubEvent:
    """What every event has: the hub that wrote it and when (set by the log)."""

    kind: ClassVar[EventKind]
    hub: str = ""
    time: float | None = None  # Unix seconds; the log sets it when it appends the event

    def fields(self) -> dict[str, Any]:
        """The record's fields as the log writes them, but ``event``, ``version``, ``time``."""
        return {name: _json(getattr(self, name)) for name, _, _ in _fields_of(type(self))
                if name != "time"}

    def to_json(self) -> dict[str, Any]:
        """The record (without the log's ``version``)."""
        record = {"event": self.kind.value, **self.fields()}
        if self.time is not None:
            record["time"] = self.time
        return record

    def facts(self) -> dict[str, Any]:
        """``to_json`` without the fields left at their default: what the record said that
        a reader can use (the watchdog keeps it with the incident it tells)."""
        defaults = {name: default for name, _, default in _fields_of(type(self))}
        return {k: v for k, v in self.to_json().items()
                if k not in defaults or v != defaults[k]}

    @staticmethod
    def from_json(record: Mapping[str, Any]) -> HubEvent | None:
        """The payload of a record of the log, each field of its type or at its default;
        None for a kind this version does not know."""
        try:
            payload = PAYLOADS[EventKind(record.get("event"))]
        except (ValueError, TypeError, KeyError):
            return None
        values = {}
        for name, read, _ in _fields_of(payload):
            if name in record:
                value = read(record[name])
                if value is not None:
                    values[name] = value
        return payload(**payload._tidy(values, record))

    @classmethod
    def _tidy(cls, values: dict[str, Any], record: Mapping[str, Any]) -> dict[str, Any]:
        """The fields read, checked as a whole (a kind's own rules)."""
        return values


@dataclass(frozen=True, kw_only=True)
class ServerEvent(HubEvent):
    """About one server: its user, its role and its container."""

    user: str = ""
    role: str = ""
    container: str = ""


# preemptions (docker/evictor.py)


@dataclass(frozen=True, kw_only=True)
class PreemptionEvent(ServerEvent):
    """This server is preempted for ``by``'s start (the user it is stopped for)."""

    by: str = ""


@dataclass(frozen=True, kw_only=True)
class Preemption(PreemptionEvent):
    """Victims chosen: this server is stopped at ``deadline`` for ``by``'s start."""

    kind = EventKind.PREEMPTION
    priority: float | None = None
    by_role: str = ""
    by_priority: float | None = None
    for_container: str = ""
    gpus: tuple[str, ...] = ()  # the victim's
    for_gpus: tuple[str, ...] = ()  # what the start will get
    grace_period: float | None = None
    deadline: float | None = None
    ran_for: float | None = None  # seconds so far
    reason: str = ""  # the hub's sentence, as the victim's notice says it (evictor.reason)
    server_url: str = ""


@dataclass(frozen=True, kw_only=True)
class Preempted(PreemptionEvent):
    """The victim was stopped (``ran_for`` includes the grace)."""

    kind = EventKind.PREEMPTED
    gpus: tuple[str, ...] = ()
    by_role: str = ""
    ran_for: float | None = None


@dataclass(frozen=True, kw_only=True)
class PreemptionWithdrawn(PreemptionEvent):
    """Called off: the server keeps running; ``why`` is the hub's sentence."""

    kind = EventKind.PREEMPTION_WITHDRAWN
    why: str = ""


# the GPU queue (docker/gpus.py)


@dataclass(frozen=True, kw_only=True)
class QueueEvent(ServerEvent):
    """A start that waits for GPUs or room on the host."""

    priority: float | None = None


@dataclass(frozen=True, kw_only=True)
class Queued(QueueEvent):
    kind = EventKind.QUEUED
    position: int | None = None  # 1 is the head


@dataclass(frozen=True, kw_only=True)
class QueueGranted(QueueEvent):
    kind = EventKind.QUEUE_GRANTED
    waited: float | None = None  # seconds
    preempted: bool = False  # whether a preemption was made for it


@dataclass(frozen=True, kw_only=True)
class QueueTimeout(QueueEvent):
    kind = EventKind.QUEUE_TIMEOUT
    waited: float | None = None


@dataclass(frozen=True, kw_only=True)
class QueueLeft(QueueEvent):
    kind = EventKind.QUEUE_LEFT
    waited: float | None = None


# GPU-hour budgets (usage/budgets.py): about the user's first GPU server under the budget


@dataclass(frozen=True, kw_only=True)
class BudgetEvent(ServerEvent):
    """A budget of ``user``: its numbers, and the sentence the user is told (``text``,
    worded by budgets.py in the table's time zone)."""

    budget_kind: str = ""  # "group" or "user"
    budget_name: str = ""
    used: float | None = None  # GPU-hours
    gpu_hours: float | None = None
    per: str = ""  # day, week or month
    warn_at: float | None = None
    period_start: float | None = None
    resets_at: float | None = None
    text: str = ""
    stopping: bool = False  # the user's GPU servers under it are being stopped
    server_name: str = ""
    containers: tuple[str, ...] = ()  # all of the user's GPU servers under it

    @classmethod
    def _tidy(cls, values: dict[str, Any], record: Mapping[str, Any]) -> dict[str, Any]:
        if values.get("budget_kind") not in ("group", "user"):
            values.pop("budget_kind", None)
        return values


@dataclass(frozen=True, kw_only=True)
class BudgetWarning(BudgetEvent):
    kind = EventKind.BUDGET_WARNING


@dataclass(frozen=True, kw_only=True)
class BudgetSpent(BudgetEvent):
    kind = EventKind.BUDGET_SPENT


# requests for a bigger role (usage/grants.py)


def _as_typed(text: str) -> str:
    return text


@dataclass(frozen=True, kw_only=True)
class RoleRequestEvent(HubEvent):
    """A request of ``user`` for ``role`` from ``starts`` to ``ends``, with their
    ``reason``; ``who`` changed it (the user, or its decider) and ``comment`` is the
    decider's. ``whole``: the record had the hub's ``text`` (every hub writes one); a
    record without it is a damaged or foreign one, told in short."""

    id: int | None = None
    user: str = ""
    role: str = ""
    starts: float | None = None
    ends: float | None = None
    reason: str = ""
    who: str = ""
    comment: str = ""
    whole: bool = True

    def fields(self) -> dict[str, Any]:
        out = super().fields()
        del out["whole"]
        if self.whole:
            out["text"] = self.sentence()
        return out

    @classmethod
    def _tidy(cls, values: dict[str, Any], record: Mapping[str, Any]) -> dict[str, Any]:
        text = record.get("text")
        values["whole"] = isinstance(text, str) and bool(text.strip())
        return values

    @property
    def window(self) -> str:
        """'from 2026-12-20 14:00 UTC to 2026-12-27 14:00 UTC'; "" without both times."""
        if self.starts is None or self.ends is None:
            return ""
        return f"from {format_moment(self.starts)} to {format_moment(self.ends)}"

    def sentence(self, quote: Callable[[str], str] = _as_typed) -> str:
        """The event in one sentence for the people told, with what they typed (the
        reason, the comment) passed through ``quote``: as typed in the log's ``text``,
        quoted as data in the watchdog's messages."""
        role = f"the role '{self.role}'" if self.role else "a role"
        window = f" {self.window}" if self.window else ""
        if self.kind == EventKind.ROLE_REQUEST:
            why = f": {quote(self.reason)}" if self.reason else "."
            return f"{self.user} asks for {role}{window}{why}"
        if self.kind == EventKind.ROLE_REQUEST_WITHDRAWN:
            return f"{self.user} withdrew the request for {role}."
        by = f" by {self.who}" if self.who else ""
        said = f": {quote(self.comment)}" if self.comment else "."
        if self.kind == EventKind.ROLE_REQUEST_APPROVED:
            hold = f"; you hold it{window}" if window else ""
            return f"Your request for {role} was approved{by}{hold}{said}"
        return f"Your request for {role} was refused{by}{said}"


@dataclass(frozen=True, kw_only=True)
class RoleRequestAsked(RoleRequestEvent):
    kind = EventKind.ROLE_REQUEST


@dataclass(frozen=True, kw_only=True)
class RoleRequestApproved(RoleRequestEvent):
    kind = EventKind.ROLE_REQUEST_APPROVED


@dataclass(frozen=True, kw_only=True)
class RoleRequestRefused(RoleRequestEvent):
    kind = EventKind.ROLE_REQUEST_REFUSED


@dataclass(frozen=True, kw_only=True)
class RoleRequestWithdrawn(RoleRequestEvent):
    kind = EventKind.ROLE_REQUEST_WITHDRAWN


# Each kind's payload (tests/unit/test_events.py checks there is one for each kind).
PAYLOADS: dict[EventKind, type[HubEvent]] = {cls.kind: cls for cls in (
    Preemption, Preempted, PreemptionWithdrawn, Queued, QueueGranted, QueueTimeout,
    QueueLeft, BudgetWarning, BudgetSpent, RoleRequestAsked, RoleRequestApproved,
    RoleRequestRefused, RoleRequestWithdrawn)}
