"""Usage reports from the ledger: hours reserved and the share used, how sessions ended,
and right-sizing advice per user and role (docs/usage.md#reports).

Every sum is taken in SQL (GROUP BY over the window), so a month of a large ledger
costs one pass over that month's sessions, not a row per session in Python.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta, timezone, tzinfo
from typing import Any, TypeVar

from sqlalchemy import Engine, and_, case, func, literal, or_, select

from spawner.contract import home_is_full
from spawner.quota.model import QuotaTable, Role
from spawner.quota.units import format_human, hours_text, size_of
from spawner.usage.ledger import REASONS
from spawner.usage.queries import in_window, seconds_in_window
from spawner.usage.schema import session_groups, sessions

UTC = timezone.utc
T = TypeVar("T")

BY = ("user", "role", "group", "image")
FORMATS = ("table", "csv", "json")
RUNNING = "running"  # still open at the window's end
UNKNOWN = "unknown"  # stopped with no reason recorded
NO_GROUP = "(no group)"  # by group: sessions recorded without any group
TOTAL = "(total)"

# The advice rule (docs/usage.md#right-sizing-advice).
MIN_SESSIONS = 5  # sessions with samples needed before any advice
SERVE_SHARE = 0.9  # a smaller role must have served this share of them
MEMORY_HEADROOM = 0.9  # a session's memory peak must fit in this share of the role's memory
# ... and its home's peak in this share of the role's disk: the share at which the
# watchdog warns of a full home. A home that reached it needed a bigger one.
HOME_HEADROOM = 0.9

_GIB = 2**30


@dataclass(frozen=True)
class Row:
    """One line of a report: a user, role, group or image ("" for the total)."""

    key: str
    sessions: int  # held resources in the window, or a failed start requested in it
    ended: dict[str, int]  # reason -> count; "running" for those open at the window's end
    gpu_hours: float
    gpu_used: float | None  # share 0..1; None without GPU samples
    cpu_hours: float
    cpu_used: float | None
    memory_gib_hours: float
    memory_used: float | None
    # the largest home size of its sessions and the most any of their homes held, in
    # bytes: one user's home at its largest and fullest; None: no size, never sampled
    home_size: int | None = None
    home_peak: int | None = None


@dataclass(frozen=True)
class Advice:
    """What size would have served one user's sessions of one role, with the evidence."""

    user: str
    role: str
    sessions: int  # sessions with samples (the evidence)
    memory_peak: int | None
    memory_limit: int
    cpu_peak: float | None
    cpu_limit: float
    gpu_memory_peak: int | None
    gpu_util_peak: float | None
    suggestion: str | None  # the smaller role that would have served, or None
    served: int  # how many of `sessions` it (or, without one, the best smaller role) served
    text: str
    home_sessions: int = 0  # of `sessions`, those whose home's use was sampled
    home_peak: int | None = None  # the most their home held, bytes
    home_size: int | None = None  # the home's size they had (the largest), bytes
    home_suggestion: int | None = None  # a smaller home size that would have held it
    home_bigger: bool = False  # the home reached HOME_HEADROOM of its size: it needs more


@dataclass(frozen=True)
class Report:
    since: float
    until: float
    now: float
    by: str
    rows: list[Row]
    total: Row
    advice: list[Advice]
    group: str | None = None


# --- the sums --------------------------------------------------------------------------


@dataclass
class _Sums:
    """One key's sums as SQL returned them, before they become a Row."""

    sessions: int = 0
    ended: dict[str, int] = field(default_factory=dict)
    gpu: float = 0.0  # GPU-seconds reserved
    gpu_used: float = 0.0  # of those, GPU-seconds used (sampled sessions only)
    gpu_sampled: float = 0.0  # GPU-seconds reserved by sampled sessions
    cpu: float = 0.0
    cpu_used: float = 0.0
    cpu_sampled: float = 0.0
    mem: float = 0.0  # byte-seconds
    mem_used: float = 0.0
    mem_sampled: float = 0.0
    home_size: int | None = None  # the largest
    home_peak: int | None = None

    def _homes(self, size: int | None, peak: int | None) -> None:
        self.home_size = _larger(self.home_size, size)
        self.home_peak = _larger(self.home_peak, peak)

    def add(self, r: Any) -> None:
        self.sessions += r.n
        self.ended[r.ended] = self.ended.get(r.ended, 0) + r.n
        self.gpu += r.gpu or 0.0
        self.gpu_used += r.gpu_used or 0.0
        self.gpu_sampled += r.gpu_sampled or 0.0
        self.cpu += r.cpu or 0.0
        self.cpu_used += r.cpu_used or 0.0
        self.cpu_sampled += r.cpu_sampled or 0.0
        self.mem += r.mem or 0.0
        self.mem_used += r.mem_used or 0.0
        self.mem_sampled += r.mem_sampled or 0.0
        self._homes(r.home_size, r.home_peak)

    def merge(self, other: _Sums) -> None:
        self.sessions += other.sessions
        for reason, n in other.ended.items():
            self.ended[reason] = self.ended.get(reason, 0) + n
        for name in ("gpu", "gpu_used", "gpu_sampled", "cpu", "cpu_used", "cpu_sampled",
                     "mem", "mem_used", "mem_sampled"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self._homes(other.home_size, other.home_peak)

    def row(self, key: str) -> Row:
        def share(used: float, sampled: float) -> float | None:
            return used / sampled if sampled > 0 else None

        return Row(
            key=key, sessions=self.sessions, ended=_ordered(self.ended),
            gpu_hours=self.gpu / 3600, gpu_used=share(self.gpu_used, self.gpu_sampled),
            cpu_hours=self.cpu / 3600, cpu_used=share(self.cpu_used, self.cpu_sampled),
            memory_gib_hours=self.mem / _GIB / 3600,
            memory_used=share(self.mem_used, self.mem_sampled),
            home_size=self.home_size, home_peak=self.home_peak)


def _larger(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


def _ordered(ended: dict[str, int]) -> dict[str, int]:
    """The ledger's reasons in their documented order, then running, then anything else."""
    order = {r: i for i, r in enumerate((*REASONS, RUNNING))}
    return {r: ended[r] for r in sorted(ended, key=lambda r: (order.get(r, len(order)), r))}


def _counted(since: float, until: float, now: float) -> Any:
    """The sessions a report counts: those that held resources in the window, and the
    starts asked for in it that never started (failed, or still starting)."""
    c = sessions.c
    never_started = and_(c.started.is_(None), c.requested >= since, c.requested < until)
    return or_(in_window(since, until, now), never_started)


def _in_group(group: str | None) -> Any:
    if group is None:
        return literal(True)
    return sessions.c.id.in_(
        select(session_groups.c.session_id).where(session_groups.c.group_name == group))


def _sum_columns(since: float, until: float, now: float) -> list[Any]:
    c = sessions.c
    seconds = seconds_in_window(since, until, now)
    gpu_seconds = c.gpu_reserved * seconds
    cpu_seconds = c.cpu_limit * seconds
    mem_seconds = c.mem_limit * seconds
    gpu_sampled = and_(c.gpu_samples > 0, c.gpu_reserved > 0)

    def when(condition: Any, value: Any) -> Any:
        return func.sum(case((condition, value), else_=0.0))

    ended = case((or_(c.stopped.is_(None), c.stopped >= until), literal(RUNNING)),
                 else_=func.coalesce(c.reason, literal(UNKNOWN)))
    return [
        ended.label("ended"),
        func.count().label("n"),
        func.sum(gpu_seconds).label("gpu"),
        when(gpu_sampled, c.gpu_util_sum / c.gpu_samples * gpu_seconds).label("gpu_used"),
        when(gpu_sampled, gpu_seconds).label("gpu_sampled"),
        func.sum(cpu_seconds).label("cpu"),
        when(c.cpu_samples > 0, c.cpu_sum / c.cpu_samples * seconds).label("cpu_used"),
        when(c.cpu_samples > 0, cpu_seconds).label("cpu_sampled"),
        func.sum(mem_seconds).label("mem"),
        when(c.mem_samples > 0, c.mem_sum / c.mem_samples * seconds).label("mem_used"),
        when(c.mem_samples > 0, mem_seconds).label("mem_sampled"),
        func.max(c.home_size).label("home_size"),
        func.max(c.home_peak).label("home_peak"),
    ]


def build_report(engine: Engine, *, since: float, until: float, by: str = "user",
                 table: QuotaTable | None = None, group: str | None = None,
                 now: float | None = None) -> Report:
    """The report of [since, until) by ``by``; ``group``: only the sessions recorded with
    that group (an instructor's class). Advice only when ``table`` is given."""
    if by not in BY:
        raise ValueError(f"by must be one of {', '.join(BY)}, not {by!r}")
    now = _now() if now is None else now
    columns = _sum_columns(since, until, now)
    where = and_(_counted(since, until, now), _in_group(group))
    if by == "group":
        key = func.coalesce(session_groups.c.group_name, literal(NO_GROUP))
        source = sessions.outerjoin(session_groups,
                                    session_groups.c.session_id == sessions.c.id)
    else:
        key = {"user": sessions.c.user_name, "role": sessions.c.role,
               "image": sessions.c.image}[by]
        source = sessions
    query = (select(key.label("key"), *columns).select_from(source).where(where)
             .group_by(key, columns[0]))
    by_key: dict[str, _Sums] = {}
    total = _Sums()
    with engine.connect() as connection:
        for r in connection.execute(query):
            by_key.setdefault(r.key, _Sums()).add(r)
        if by == "group":
            # a session in two groups is in two rows, but once in the total
            total_query = (select(*columns).where(where).group_by(columns[0]))
            for r in connection.execute(total_query):
                total.add(r)
        else:
            for sums in by_key.values():
                total.merge(sums)
        advice = _advice(connection, table, since, until, now, group) if table else []
    rows = [by_key[k].row(k) for k in sorted(by_key)]
    return Report(since=since, until=until, now=now, by=by, rows=rows, total=total.row(""),
                  advice=advice, group=group)


def _now() -> float:
    return datetime.now(UTC).timestamp()


# --- right-sizing advice ---------------------------------------------------------------


def role_gpus(role: Role) -> float:
    """GPUs a role reserves: its count, or count/N of a GPU shared N ways."""
    if role.gpu_mode == "shared" and role.gpus:
        return role.gpus / max(1, role.gpu_share)
    return float(role.gpus)


def _serves(role: Role) -> Any:
    """SQL: 1 when a session's peaks fit in ``role``, by the advice rule."""
    c = sessions.c
    # the evidence has a CPU peak (``_advice``): a session without one fits nothing
    fits = [func.coalesce(c.mem_peak, 0) <= MEMORY_HEADROOM * role.memory,
            c.cpu_peak <= role.cpus]
    never_used_gpu = and_(c.gpu_samples > 0, func.coalesce(c.gpu_util_peak, 0.0) <= 0,
                          func.coalesce(c.gpu_mem_peak, 0) <= 0)
    if not role.gpus:
        fits.append(or_(c.gpu_count == 0, never_used_gpu))
    else:
        # fewer GPUs than the session had: its busiest moment must fit in them
        fits.append(or_(c.gpu_count <= role.gpus,
                        func.coalesce(c.gpu_util_peak, 0.0) * c.gpu_count <= role.gpus))
        if role.gpu_mode == "shared" and role.gpu_memory:
            fits.append(func.coalesce(c.gpu_mem_peak, 0) <= role.gpu_memory)
    if role.disk:  # what the home held must fit in the smaller home, as memory does
        fits.append(func.coalesce(c.home_peak, 0) <= HOME_HEADROOM * role.disk)
    return func.sum(case((and_(*fits), 1), else_=0))


def _advice(connection: Any, table: QuotaTable, since: float, until: float, now: float,
            group: str | None) -> list[Advice]:
    c = sessions.c
    names = list(table.roles)
    # A session's CPU peak leaves out its startup (ledger.STARTUP_WINDOW); one that has
    # CPU samples but no peak yet (all in that window) says nothing of the size it needs.
    sampled = and_(in_window(since, until, now), _in_group(group),
                   c.cpu_peak.is_not(None), c.mem_samples > 0)
    query = (select(
        c.user_name, c.role, func.count().label("n"),
        func.max(c.mem_peak).label("mem_peak"), func.max(c.mem_limit).label("mem_limit"),
        func.max(c.cpu_peak).label("cpu_peak"), func.max(c.cpu_limit).label("cpu_limit"),
        func.max(c.gpu_reserved).label("gpu_reserved"), func.max(c.gpu_count).label("gpus"),
        func.max(case((c.gpu_samples > 0, c.gpu_mem_peak))).label("gpu_mem_peak"),
        func.max(case((c.gpu_samples > 0, c.gpu_util_peak))).label("gpu_util_peak"),
        func.count(c.home_peak).label("home_n"), func.max(c.home_peak).label("home_peak"),
        func.max(c.home_size).label("home_size"),
        *(_serves(table.roles[name]).label(f"s{i}") for i, name in enumerate(names)),
    ).where(sampled).group_by(c.user_name, c.role).order_by(c.user_name, c.role))
    found = list(connection.execute(query))
    groups = _latest_groups(connection, sorted({r.user_name for r in found}))
    advice = []
    for r in found:
        served = {name: getattr(r, f"s{i}") or 0 for i, name in enumerate(names)}
        held = table.roles_for(r.user_name, groups.get(r.user_name, ()))
        advice.append(_advise(r, held, served))
    return advice


def _latest_groups(connection: Any, users: Sequence[str]) -> dict[str, list[str]]:
    """Each user's groups as their latest session recorded them: the roles they hold now."""
    result: dict[str, list[str]] = {u: [] for u in users}
    for chunk in _chunks(users, 500):
        latest = (select(func.max(sessions.c.id).label("id"))
                  .where(sessions.c.user_name.in_(chunk))
                  .group_by(sessions.c.user_name).subquery())
        query = (select(sessions.c.user_name, session_groups.c.group_name)
                 .join(session_groups, session_groups.c.session_id == sessions.c.id)
                 .where(sessions.c.id.in_(select(latest.c.id))))
        for user, name in connection.execute(query):
            result[user].append(name)
    return result


def _chunks(items: Sequence[T], size: int) -> Iterable[Sequence[T]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


def _smaller(role: Role, cpus: float, memory: int, gpus: float) -> bool:
    """No more CPUs, memory or GPUs than the sessions reserved, and less of one."""
    mine = (role.cpus, role.memory, role_gpus(role))
    theirs = (cpus, memory, gpus)
    eps = 1e-9
    return (all(a <= b + eps for a, b in zip(mine, theirs, strict=True))
            and any(a < b - eps for a, b in zip(mine, theirs, strict=True)))


def _cost(role: Role) -> tuple[float, int, float, str]:
    return (role_gpus(role), role.memory, role.cpus, role.name)


def _cpus(n: float) -> str:
    return f"{n:g} CPU" + ("" if n == 1 else "s")


def _describe(role: Role, had_gpu: bool, had_home: bool = False) -> str:
    """'junior-researcher with 2 GiB and 1 CPU', with its GPU and its home when they
    matter."""
    parts = [format_human(role.memory), _cpus(role.cpus)]
    if role.gpus:
        gpu = f"{role.gpus} GPU" + ("" if role.gpus == 1 else "s")
        if role.gpu_mode == "shared":
            gpu += f" shared {role.gpu_share} ways"
            if role.gpu_memory:
                gpu += f" ({format_human(role.gpu_memory)} of GPU memory)"
        parts.append(gpu)
    elif had_gpu:
        parts.append("no GPU")
    if had_home and role.disk:
        parts.append(f"a {format_human(role.disk)} home")
    return f"{role.name} with {', '.join(parts[:-1])} and {parts[-1]}"


def _evidence(r: Any) -> str:
    memory = format_human(r.mem_peak) if r.mem_peak is not None else "an unknown amount"
    # the same rounding as hours: an idle session's 0.03 cores is not "0.0"
    cpu = hours_text(r.cpu_peak) if r.cpu_peak is not None else "an unknown number"
    text = (f"{r.user_name} used at most {memory} of {format_human(r.mem_limit)} "
            f"and {cpu} of {_cpus(r.cpu_limit)}")
    if r.gpus:
        if r.gpu_util_peak is None and r.gpu_mem_peak is None:
            text += " (its GPU was never sampled)"
        elif not r.gpu_util_peak and not r.gpu_mem_peak:
            text += " and never used its GPU"
        else:
            text += (f", its GPU at most {r.gpu_util_peak or 0:.0%} busy with "
                     f"{format_human(r.gpu_mem_peak or 0)} of GPU memory")
    if r.home_peak is not None:
        text += f", its home at most {format_human(r.home_peak)}" + (
            f" of {format_human(r.home_size)}" if r.home_size else ", with no size limit")
    plural = "session" if r.n == 1 else "sessions"
    return f"{text} over {r.n} {plural} as {r.role}"


# The home sizes advice names: those people pick (docs/usage.md#right-sizing-advice).
HOME_SIZES = (*(2**20 * m for m in (64, 128, 256, 512)),
              *(_GIB * m * 10**e for e in range(5) for m in (1, 2, 5)))


def home_size_for(peak: int) -> int | None:
    """The smallest of ``HOME_SIZES`` whose ``HOME_HEADROOM`` holds ``peak``."""
    return next((size for size in HOME_SIZES if peak <= HOME_HEADROOM * size), None)


def _home_advice(r: Any) -> tuple[str, int | None, bool]:
    """The home's part of the advice: (its words, a smaller size that would have held
    it, whether it needs a bigger one). Nothing for fewer than ``MIN_SESSIONS``
    sampled sessions, or a home without a size."""
    if r.home_n < MIN_SESSIONS or r.home_peak is None or not r.home_size:
        return "", None, False
    if r.home_peak >= HOME_HEADROOM * r.home_size:
        full = "full" if home_is_full(r.home_peak, r.home_size) else "nearly full"
        return f"; its home was {full}: a bigger one is needed", None, True
    smaller = home_size_for(r.home_peak)
    if smaller is not None and smaller < r.home_size:
        return f"; a home of {format_human(smaller)} would do", smaller, False
    return "", None, False


def _advise(r: Any, held: list[Role], served: dict[str, int]) -> Advice:
    evidence = _evidence(r)
    candidates = sorted((role for role in held if role.name != r.role and _smaller(
        role, r.cpu_limit, r.mem_limit, r.gpu_reserved)), key=_cost)
    suggestion: str | None = None
    count = 0
    home_words, home_smaller, home_bigger = "", None, False
    had_home = bool(r.home_n)
    if r.n < MIN_SESSIONS:
        text = f"{evidence}: too few to advise on ({MIN_SESSIONS} sessions with samples needed)."
    else:
        home_words, home_smaller, home_bigger = _home_advice(r)
        if not candidates:
            text = f"{evidence}; {r.user_name} holds no smaller role"
        else:
            good = [role for role in candidates
                    if served[role.name] >= SERVE_SHARE * r.n - 1e-9]
            if good:
                best = good[0]
                suggestion, count = best.name, served[best.name]
                text = (f"{evidence}; {_describe(best, bool(r.gpus), had_home)} would have "
                        f"served {count} of them")
            else:
                # the evidence: the smaller role that came closest, the largest on a tie
                best = max(candidates, key=lambda role: (served[role.name], _cost(role)))
                count = served[best.name]
                text = (f"{evidence}; no smaller role would have served: "
                        f"{_describe(best, bool(r.gpus), had_home)} would have served only "
                        f"{count} of them")
        text += home_words + "."
    return Advice(
        user=r.user_name, role=r.role, sessions=r.n, memory_peak=r.mem_peak,
        memory_limit=int(r.mem_limit), cpu_peak=r.cpu_peak, cpu_limit=float(r.cpu_limit),
        gpu_memory_peak=r.gpu_mem_peak, gpu_util_peak=r.gpu_util_peak,
        suggestion=suggestion, served=count, text=text, home_sessions=int(r.home_n or 0),
        home_peak=r.home_peak, home_size=r.home_size, home_suggestion=home_smaller,
        home_bigger=home_bigger)


# --- GPU-hours per day, one user's sessions ----------------------------------------------


def _days(since: float, until: float, tz: tzinfo) -> list[tuple[str, float, float]]:
    """The calendar days of ``tz`` that [since, until) touches, each clipped to it."""
    days = []
    start = datetime.fromtimestamp(since, tz)
    day = start.replace(hour=0, minute=0, second=0, microsecond=0)
    while day.timestamp() < until:
        # midnight of the next date, found afresh so that DST changes keep days whole
        following = datetime.combine(day.date() + timedelta(days=1), datetime.min.time(),
                                     tzinfo=tz)
        days.append((day.date().isoformat(), max(since, day.timestamp()),
                     min(until, following.timestamp())))
        day = following
    return days


def daily_gpu_hours(engine: Engine, *, since: float, until: float, group: str | None = None,
                    now: float | None = None, tz: tzinfo = UTC
                    ) -> list[tuple[str, str, float, float]]:
    """(YYYY-MM-DD, role, reserved GPU-hours, used GPU-hours) for each day of ``tz`` and
    role with GPU-hours; a session's hours go to the days they fell in. Used hours count
    sampled sessions only, at their mean utilisation."""
    now = _now() if now is None else now
    c = sessions.c
    used_share = case((c.gpu_samples > 0, c.gpu_util_sum / c.gpu_samples), else_=0.0)
    result = []
    with engine.connect() as connection:
        # one pass over the window per 100 days: a column pair per day
        for days in _chunks(_days(since, until, tz), 100):
            columns = []
            for i, (_, lo, hi) in enumerate(days):
                seconds = c.gpu_reserved * seconds_in_window(lo, hi, now)
                columns += [func.sum(seconds).label(f"r{i}"),
                            func.sum(used_share * seconds).label(f"u{i}")]
            lo, hi = days[0][1], days[-1][2]
            query = (select(c.role, *columns)
                     .where(in_window(lo, hi, now), _in_group(group), c.gpu_reserved > 0)
                     .group_by(c.role))
            found = list(connection.execute(query))
            for i, (date, _, _) in enumerate(days):
                for r in sorted(found, key=lambda r: r.role):
                    reserved = getattr(r, f"r{i}") or 0.0
                    if reserved > 0:
                        result.append((date, r.role, reserved / 3600,
                                       (getattr(r, f"u{i}") or 0.0) / 3600))
    return result


def user_sessions(engine: Engine, user: str, *, since: float, until: float,
                  group: str | None = None, now: float | None = None,
                  limit: int = 500) -> list[dict]:
    """The user's sessions the report counts in [since, until): the latest ``limit``,
    oldest first. Averages and peaks are None where nothing was sampled."""
    now = _now() if now is None else now
    c = sessions.c

    def mean(total: Any, n: Any) -> Any:
        return case((n > 0, total / n))

    query = (select(
        c.id, c.role, c.image, c.gpus, c.requested, c.started, c.ready, c.stopped, c.reason,
        c.cpu_limit, c.mem_limit, c.gpu_reserved,
        mean(c.cpu_sum, c.cpu_samples).label("cpu_avg"), c.cpu_peak,
        mean(c.mem_sum, c.mem_samples).label("mem_avg"), c.mem_peak,
        mean(c.gpu_util_sum, c.gpu_samples).label("gpu_util_avg"), c.gpu_util_peak,
        c.gpu_mem_peak, c.home_size, c.home_peak,
    ).where(c.user_name == user, _counted(since, until, now), _in_group(group))
        .order_by(c.requested.desc(), c.id.desc()).limit(limit))
    with engine.connect() as connection:
        rows = [dict(r._mapping) for r in connection.execute(query)]
    for r in rows:
        r["gpus"] = [u for u in (r["gpus"] or "").split(",") if u]
    rows.reverse()
    return rows


# --- formats -------------------------------------------------------------------------------


def _when(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M UTC")


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _ended_text(ended: dict[str, int]) -> str:
    return ", ".join(f"{n} {reason}" for reason, n in ended.items()) or "-"


def _table(report: Report) -> str:
    header = (report.by.capitalize(), "Sessions", "GPU-h", "GPU used", "CPU-h", "CPU used",
              "Mem GiB-h", "Mem used", "Home", "Ended")
    lines = []
    for row in [*report.rows, report.total]:
        lines.append((row.key or TOTAL, str(row.sessions), hours_text(row.gpu_hours),
                      _share(row.gpu_used), hours_text(row.cpu_hours), _share(row.cpu_used),
                      hours_text(row.memory_gib_hours), _share(row.memory_used),
                      size_of(row.home_peak, row.home_size), _ended_text(row.ended)))
    widths = [max(len(line[i]) for line in (header, *lines)) for i in range(len(header))]

    def render(cells: Sequence[str]) -> str:
        out = [cells[0].ljust(widths[0])]
        out += [cell.rjust(width) for cell, width in zip(cells[1:-1], widths[1:-1],
                                                         strict=True)]
        out.append(cells[-1])
        return "  ".join(out).rstrip()

    scope = f", group {report.group}" if report.group else ""
    text = [f"Usage from {_when(report.since)} to {_when(report.until)}, "
            f"by {report.by}{scope}", "", render(header)]
    text += [render(line) for line in lines[:-1]]
    text.append("-" * len(render(header)))
    text.append(render(lines[-1]))
    if report.advice:
        text += ["", "Right-sizing advice:"]
        text += [f"- {a.text}" for a in report.advice]
    return "\n".join(text) + "\n"


# A cell that starts with one of these is a formula to a spreadsheet (OWASP, "CSV
# Injection"): a user named '=rt+7' must not run in the admin's spreadsheet.
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_text(value: str) -> str:
    """A text cell of a CSV (a user's, role's, group's or image's name), with a quote put
    before a start that would make a spreadsheet read it as a formula. Our own numbers
    are written as they are: a negative number is a number, not a name."""
    return "'" + value if value.startswith(_FORMULA_START) else value


def csv_header(report: Report) -> list[str]:
    reasons = list(REASONS) + [RUNNING]
    for row in [*report.rows, report.total]:
        reasons += [r for r in row.ended if r not in reasons]
    return [report.by, "sessions", *(f"ended_{r}" for r in reasons), "gpu_hours",
            "gpu_used", "cpu_hours", "cpu_used", "memory_gib_hours", "memory_used",
            "home_size", "home_peak"]


def _csv(report: Report) -> str:
    out = io.StringIO()
    # RFC 4180's CRLF: the writer quotes a cell holding any character of the line end, so
    # a name with a carriage return (or a line feed) in it stays one cell, not a new row
    writer = csv.writer(out, lineterminator="\r\n")
    header = csv_header(report)
    writer.writerow(header)
    reasons = [h.removeprefix("ended_") for h in header if h.startswith("ended_")]
    for row in [*report.rows, report.total]:
        writer.writerow([csv_text(row.key or TOTAL), row.sessions,
                         *(row.ended.get(r, 0) for r in reasons),
                         *("" if v is None else repr(v) for v in (
                             row.gpu_hours, row.gpu_used, row.cpu_hours, row.cpu_used,
                             row.memory_gib_hours, row.memory_used, row.home_size,
                             row.home_peak))])
    return out.getvalue()


def report_dict(report: Report) -> dict[str, Any]:
    return asdict(report)


def format_report(report: Report, fmt: str) -> str:
    """``table``: aligned text with units, then the advice sentences; ``csv``: one header
    row, then a row per key and the total ("(total)"), numbers unrounded, no advice;
    ``json``: the whole report, numbers unrounded."""
    if fmt == "table":
        return _table(report)
    if fmt == "csv":
        return _csv(report)
    if fmt == "json":
        return json.dumps(report_dict(report), indent=2) + "\n"
    raise ValueError(f"format must be one of {', '.join(FORMATS)}, not {fmt!r}")


# --- times on the command line ---------------------------------------------------------

_RELATIVE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_time(text: str, now: float) -> float:
    """Epoch seconds from an ISO date or time (UTC unless it has an offset), or a time
    back from ``now`` like ``30d``, ``12h`` or ``2w``."""
    match = _RELATIVE.match(text)
    if match:
        return now - float(match.group(1)) * _UNITS[match.group(2)]
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"cannot read {text!r} as a time: use a date like 2025-01-31, "
                         "a time like 2025-01-31T12:00+01:00, or 30d, 12h, 2w") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


def month_start(now: float) -> float:
    """The first of ``now``'s calendar month, UTC."""
    day = datetime.fromtimestamp(now, UTC)
    return day.replace(day=1, hour=0, minute=0, second=0, microsecond=0).timestamp()


__all__ = ["BY", "FORMATS", "Advice", "Report", "Row", "build_report", "daily_gpu_hours",
           "format_report", "month_start", "parse_time", "user_sessions"]
