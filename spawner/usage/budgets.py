"""GPU-hour budgets: how much of each is used, refusing starts, watching running servers.

A budget (the quota table's ``budgets``, docs/usage.md#gpu-hour-budgets) is a
number of GPU-hours a group or a user may reserve per day, week or month.
A group's budget counts the sessions recorded with that group (the user's
groups when the session started), whoever started them; a user's counts
that user's. Each budget that applies to a user applies on its own.

What counts is what was reserved, as the reports count it (``queries.py``):
from the container's start to its stop, or to now while it runs, times the
GPUs it held (1/N of a GPU shared N ways). Periods start at midnight in the
table's ``budgets: timezone`` (UTC by default); weeks start on Monday,
months on the 1st.

Everything here reads the ledger and blocks: call it from a thread.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta, timezone, tzinfo
from typing import Any

from sqlalchemy import Engine, and_, func, select

from spawner.quota.model import Budget, QuotaTable, Role, time_zone
from spawner.quota.units import hours_text
from spawner.usage.documents import BUDGET_MEMORY, BudgetMemory, Documents, Told
from spawner.usage.events import BudgetEvent, BudgetSpent, BudgetWarning, EventKind
from spawner.usage.queries import in_window, seconds_in_window
from spawner.usage.schema import session_groups, sessions

WARNING, SPENT = EventKind.BUDGET_WARNING, EventKind.BUDGET_SPENT  # the hub's events
# Sums of float seconds are not exact: 90% of a budget must read as 90%.
_EPSILON = 1e-9


# --- periods and what was used --------------------------------------------------------


def period(per: str, now: float, tz: tzinfo | str) -> tuple[float, float]:
    """The [start, end) of the day, week (from Monday) or month holding ``now``, in epoch
    seconds; each starts at midnight in ``tz`` (a zone or an IANA name), so a day in a
    zone with daylight saving may be 23 or 25 hours long."""
    zone = time_zone(tz) if isinstance(tz, str) else tz
    today = datetime.fromtimestamp(now, zone).date()
    if per == "day":
        first, after = today, today + timedelta(days=1)
    elif per == "week":
        first = today - timedelta(days=today.weekday())
        after = first + timedelta(days=7)
    elif per == "month":
        first = today.replace(day=1)
        after = (first + timedelta(days=32)).replace(day=1)
    else:
        raise ValueError(f"unknown budget period {per!r}")
    return _midnight(first, zone), _midnight(after, zone)


def _midnight(day: date, zone: tzinfo) -> float:
    return datetime.combine(day, time(0), tzinfo=zone).timestamp()


def used_gpu_hours(engine: Engine, kind: str, name: str, start: float, end: float,
                   now: float, *, hub: str | None = None) -> float:
    """GPU-hours reserved in [start, end) by the sessions of the user ``name`` (``kind``
    "user") or recorded with the group ``name`` ("group"); running ones count up to
    ``now``, and nothing after ``now`` counts. ``hub``: only that hub's sessions (None:
    every hub's in this ledger)."""
    until = min(end, now)
    if until <= start:
        return 0.0
    reserved = func.sum(sessions.c.gpu_reserved * seconds_in_window(start, until, now))
    query = select(func.coalesce(reserved, 0.0)).where(
        in_window(start, until, now), sessions.c.gpu_reserved > 0, _whose(kind, name))
    if hub is not None:
        query = query.where(sessions.c.hub == hub)
    with engine.connect() as connection:
        seconds = connection.execute(query).scalar_one()
    return float(seconds or 0.0) / 3600


def _whose(kind: str, name: str) -> Any:
    if kind == "user":
        return sessions.c.user_name == name
    if kind == "group":
        return sessions.c.id.in_(select(session_groups.c.session_id).where(
            session_groups.c.group_name == name))
    raise ValueError(f"unknown budget kind {kind!r}")


@dataclass(frozen=True)
class BudgetState:
    """One budget in the period holding some moment: GPU-hours used, and the period."""

    budget: Budget
    used: float  # GPU-hours reserved in this period so far
    start: float  # the period's start, epoch seconds
    resets_at: float  # the next period's start, epoch seconds

    @property
    def fraction(self) -> float:
        return self.used / self.budget.gpu_hours

    @property
    def spent(self) -> bool:
        """Used up: any more GPU time would pass it."""
        return self.used >= self.budget.gpu_hours - _EPSILON

    @property
    def warned(self) -> bool:
        """At or past the budget's warn_at."""
        return self.used >= self.budget.warn_at * self.budget.gpu_hours - _EPSILON


def state_of(engine: Engine, budget: Budget, now: float, zone: tzinfo, *,
             hub: str | None = None) -> BudgetState:
    start, end = period(budget.per, now, zone)
    used = used_gpu_hours(engine, budget.kind, budget.name, start, end, now, hub=hub)
    return BudgetState(budget, used, start, end)


def states_for(engine: Engine, table: QuotaTable, user: str, groups: Iterable[str],
               now: float, *, hub: str | None = None) -> list[BudgetState]:
    """Each budget that applies to ``user`` in ``groups``: their own, then their groups'
    (in the table's order). No budget: no query."""
    zone = table.budget_zone
    return [state_of(engine, b, now, zone, hub=hub) for b in table.budgets_for(user, groups)]


def check_start(engine: Engine, table: QuotaTable, user: str, groups: Iterable[str],
                role: Role, now: float, *, hub: str | None = None) -> str | None:
    """The refusal sentence for a start of ``role`` by ``user`` when one of their budgets
    is spent; None when it may start. A role without GPUs is never refused.

    With several spent budgets the sentence names the one that resets last: the
    start is refused until then.
    """
    groups = list(groups)
    if not role.gpus or not table.budgets_for(user, groups):
        return None
    spent = [s for s in states_for(engine, table, user, groups, now, hub=hub) if s.spent]
    if not spent:
        return None
    last = max(spent, key=lambda s: s.resets_at)
    return budget_spent(last, table.budget_zone)


# --- running servers --------------------------------------------------------------------


@dataclass(frozen=True)
class RunningSession:
    """An open session of the ledger that holds GPUs."""

    id: int
    hub: str
    user: str
    server_name: str
    container: str
    role: str
    gpu_reserved: float
    groups: tuple[str, ...]  # the user's groups when it started


def running_gpu_sessions(engine: Engine, *, hub: str | None = None) -> list[RunningSession]:
    """The open sessions with GPUs reserved (of ``hub`` only, unless None), oldest first."""
    c = sessions.c
    query = select(c.id, c.hub, c.user_name, c.server_name, c.container, c.role,
                   c.gpu_reserved).where(and_(c.stopped.is_(None), c.gpu_reserved > 0))
    if hub is not None:
        query = query.where(c.hub == hub)
    with engine.connect() as connection:
        rows = connection.execute(query.order_by(c.id)).all()
        groups: dict[int, list[str]] = {}
        if rows:
            found = connection.execute(
                select(session_groups.c.session_id, session_groups.c.group_name)
                .where(session_groups.c.session_id.in_([r.id for r in rows]))
                .order_by(session_groups.c.group_name))
            for session_id, group in found:
                groups.setdefault(session_id, []).append(group)
    return [RunningSession(r.id, r.hub, r.user_name, r.server_name, r.container, r.role,
                           float(r.gpu_reserved), tuple(groups.get(r.id, ())))
            for r in rows]


@dataclass(frozen=True)
class BudgetNotice:
    """One message for one user about one budget: ``event`` is ``budget-warning`` (it
    passed its warn_at) or ``budget-spent``; ``stopping`` says whether the user's GPU
    servers under it are stopped (the budget's ``stop: true``)."""

    event: EventKind
    user: str
    state: BudgetState
    text: str  # the sentence for the user
    stopping: bool
    sessions: tuple[RunningSession, ...]  # the user's running GPU servers under the budget

    def payload(self) -> BudgetEvent:
        """The hub's event: ``EventLog.append(notice.payload())``."""
        budget, first = self.state.budget, self.sessions[0]
        kind = BudgetSpent if self.event == SPENT else BudgetWarning
        # `used` to a millionth: 0.0046 of a 0.005 budget must not read as all of it
        return kind(
            hub=first.hub, user=self.user, budget_kind=budget.kind,
            budget_name=budget.name, used=round(self.state.used, 6),
            gpu_hours=budget.gpu_hours, per=budget.per, warn_at=budget.warn_at,
            period_start=self.state.start, resets_at=self.state.resets_at,
            text=self.text, stopping=self.stopping,
            container=first.container, server_name=first.server_name,
            role=first.role, containers=tuple(s.container for s in self.sessions),
        )

    def fields(self) -> dict[str, Any]:
        """The event log's fields (``payload``'s)."""
        return self.payload().fields()


@dataclass(frozen=True)
class BudgetStop:
    """A running server to stop: ``state``'s budget is spent and says ``stop: true``."""

    session: RunningSession
    state: BudgetState
    text: str  # the sentence for the user, the same as the budget-spent notice's


@dataclass(frozen=True)
class BudgetCheck:
    """What one check found: messages to log (each once per user, budget and period) and
    servers to stop (every check, while they run under a spent ``stop: true`` budget)."""

    notices: list[BudgetNotice]
    stops: list[BudgetStop]


class BudgetWatch:
    """The hub's periodic look at its running GPU servers against their budgets.

    ``check`` returns data and does nothing itself: the hub appends each notice
    to its event log and stops each server of ``stops`` with the reason ``budget``.

    Each user is told of a budget once per period: once when it passes its
    warn_at, once when it is spent (only that, when a check finds it spent
    first). What was told is remembered in the hub's ``BUDGET_MEMORY`` document
    (spawner/usage/documents.py: the ledger's database, or a file in the state folder of a hub
    without a ledger), written whole on each change, so a hub restart tells nothing
    twice; an entry is forgotten when its period ends. A new period, or a new
    ``gpu_hours`` in the table, is a new budget to tell of. Without ``documents`` it is
    remembered for the life of this object only.
    """

    def __init__(self, documents: Documents | None = None,
                 log: logging.Logger | logging.LoggerAdapter | None = None):
        self.documents = documents
        self.log = log or logging.getLogger(__name__)
        self._lock = threading.Lock()
        self._told: dict[tuple[str, str, float, float, str], float] = self._load()

    # what was told: (event, budget key, gpu_hours, period start, user) -> period end

    def _load(self) -> dict[tuple[str, str, float, float, str], float]:
        if self.documents is None:
            return {}
        try:
            found = self.documents.read(BUDGET_MEMORY)
        except Exception as e:  # unreadable now: telling again beats never telling
            return self._forgotten(e)
        if found is None:
            return {}
        memory = BudgetMemory.from_text(found.text)
        if memory is None:  # damaged, or of another version
            return self._forgotten("it is damaged or of another version")
        return {(t.event, t.budget, t.gpu_hours, t.period, t.user): t.resets_at
                for t in memory.told}

    def _forgotten(self, why: object) -> dict[tuple[str, str, float, float, str], float]:
        self.log.warning("Budget warnings: cannot read what was told (%s); users may be "
                         "told again of budgets they were told of this period", why)
        return {}

    def _save(self) -> None:
        if self.documents is None:
            return
        memory = BudgetMemory(tuple(Told(*key, resets_at=end)
                                    for key, end in sorted(self._told.items())))
        try:
            memory.write(self.documents)
        except Exception as e:
            self.log.error("Budget warnings: cannot save what was told: %s", e)

    def _key(self, event: str, state: BudgetState, user: str
             ) -> tuple[str, str, float, float, str]:
        return (event, state.budget.key, state.budget.gpu_hours, state.start, user)

    def check(self, engine: Engine, table: QuotaTable, running: Sequence[RunningSession],
              now: float, *, hub: str | None = None) -> BudgetCheck:
        """The notices due and the servers to stop, for ``running`` (``running_gpu_sessions``)
        at ``now``. ``hub`` as for ``used_gpu_hours``. Blocks (the ledger, the file)."""
        with self._lock:
            before = dict(self._told)
            self._told = {k: end for k, end in self._told.items() if end > now}
            notices, stops = self._check(engine, table, running, now, hub)
            if self._told != before:
                self._save()
        return BudgetCheck(notices, stops)

    def _check(self, engine: Engine, table: QuotaTable, running: Sequence[RunningSession],
               now: float, hub: str | None) -> tuple[list[BudgetNotice], list[BudgetStop]]:
        notices: list[BudgetNotice] = []
        stops: list[BudgetStop] = []
        if not table.budgets:
            return notices, stops
        zone = table.budget_zone
        states: dict[str, BudgetState] = {}  # a group's budget is read once for all
        by_user: dict[str, list[RunningSession]] = {}
        for session in running:
            by_user.setdefault(session.user, []).append(session)
        for user, theirs in by_user.items():
            budgets = dict.fromkeys(b for s in theirs for b in table.budgets_for(user, s.groups))
            for budget in budgets:
                if budget.key not in states:
                    states[budget.key] = state_of(engine, budget, now, zone, hub=hub)
                state = states[budget.key]
                under = tuple(s for s in theirs
                              if budget.kind == "user" or budget.name in s.groups)
                if state.spent:
                    text = budget_spent_running(state, zone)
                    if budget.stop:
                        stops.extend(BudgetStop(s, state, text) for s in under)
                    if self._tell(SPENT, state, user):
                        self._told[self._key(WARNING, state, user)] = state.resets_at
                        notices.append(BudgetNotice(SPENT, user, state, text, budget.stop,
                                                    under))
                elif state.warned and self._tell(WARNING, state, user):
                    notices.append(BudgetNotice(WARNING, user, state,
                                                budget_warning(state, zone),
                                                False, under))
        return notices, stops

    def _tell(self, event: str, state: BudgetState, user: str) -> bool:
        """Whether ``event`` is still to be told to ``user`` this period; noted as told."""
        key = self._key(event, state, user)
        if key in self._told:
            return False
        self._told[key] = state.resets_at
        return True


# --- what users are told (spawner/policy/refusals.py has the other refusals) ---------------

_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August",
           "September", "October", "November", "December")
_THIS = {"day": "today", "week": "this week", "month": "this month"}
_RESERVED = "Budgets count the time GPUs were reserved, busy or not."


def local_time(epoch: float, zone: tzinfo) -> str:
    """'1 December 2026 at 00:00 UTC', '30 March 2026 at 00:00 CEST': a date and time
    in ``zone``, named by its abbreviation, or by its offset where it has none."""
    local = datetime.fromtimestamp(epoch, zone)
    name = "UTC" if zone is timezone.utc else (local.tzname() or "")
    if not name.isalpha():  # many zones are named '+03': say 'UTC+03:00'
        offset = int((local.utcoffset() or timedelta()).total_seconds()) // 60
        sign = "-" if offset < 0 else "+"
        name = f"UTC{sign}{abs(offset) // 60:02d}:{abs(offset) % 60:02d}"
    return f"{local.day} {_MONTHS[local.month - 1]} {local.year} at {local:%H:%M} {name}"


def _owner(budget: Budget) -> str:
    if budget.kind == "group":
        return f"The GPU-hour budget of the group {budget.name}"
    return "Your GPU-hour budget"


def _used(state: BudgetState) -> str:
    budget = state.budget
    return (f"{hours_text(state.used)} of {hours_text(budget.gpu_hours)} GPU-hours "
            f"used {_THIS.get(budget.per, 'this ' + budget.per)}")


def budget_spent(state: BudgetState, zone: tzinfo) -> str:
    """A GPU start refused because a budget of the user is spent."""
    return (f"{_owner(state.budget)} is spent: {_used(state)}. {_RESERVED} It resets on "
            f"{local_time(state.resets_at, zone)}. Roles without GPUs can still be started.")


def budget_warning(state: BudgetState, zone: tzinfo) -> str:
    """A running GPU server's user, told that a budget passed its warn_at."""
    budget = state.budget
    percent = int(state.used / budget.gpu_hours * 100 + 1e-9)
    then = ("your running GPU servers are stopped and no new one can start until it resets"
            if budget.stop else
            "no new GPU server can start until it resets; running servers keep running")
    return (f"{_owner(budget)} is {percent}% used: {_used(state)}. {_RESERVED} When it is "
            f"spent, {then}. It resets on {local_time(state.resets_at, zone)}.")


def budget_spent_running(state: BudgetState, zone: tzinfo) -> str:
    """A running GPU server's user, told that a budget is spent: stopped, when the table
    says ``stop: true``, else kept running."""
    budget = state.budget
    if budget.stop:
        now = ("Your GPU servers are being stopped now, as the quota table says; "
               "the home folder is kept.")
    else:
        now = "Your running servers keep running, but no new GPU server can start."
    return (f"{_owner(budget)} is spent: {_used(state)}. {now} {_RESERVED} It resets on "
            f"{local_time(state.resets_at, zone)}. Roles without GPUs can still be started.")
