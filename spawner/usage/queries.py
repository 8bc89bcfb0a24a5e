"""What reads the ledger's sessions besides the report: the SQL pieces every reading
shares (a session's time inside a window), and the small lookups of the usage service's
pages (the groups recorded, a user's groups, the members' open sessions).

Reports and budgets count the same hours: from the container's start to its
stop (or now, for a session still running), clipped to the window asked for.
The lookups block: call them from a thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Engine, and_, case, exists, func, literal, select

from spawner.usage.schema import session_groups, sessions


def _least(a: Any, b: Any) -> Any:
    return case((a < b, a), else_=b)


def _greatest(a: Any, b: Any) -> Any:
    return case((a > b, a), else_=b)


def end_time(now: float) -> Any:
    """When a session stopped, or ``now`` while it runs."""
    return func.coalesce(sessions.c.stopped, literal(now))


def in_window(since: float, until: float, now: float) -> Any:
    """Sessions that held resources at some time in [since, until)."""
    return and_(sessions.c.started.is_not(None), sessions.c.started < until,
                end_time(now) > since)


def seconds_in_window(since: float, until: float, now: float) -> Any:
    """Seconds a session held its resources inside [since, until); 0 when never."""
    span = _least(end_time(now), literal(until)) - _greatest(sessions.c.started, literal(since))
    return case((sessions.c.started.is_(None), 0.0), else_=_greatest(span, literal(0.0)))


def ledger_groups(engine: Engine) -> list[str]:
    """Every group a session was ever recorded with, by name."""
    with engine.connect() as connection:
        return [r[0] for r in connection.execute(
            select(session_groups.c.group_name).distinct().order_by(session_groups.c.group_name))]


def groups_of_user(engine: Engine, user: str, among: Sequence[str]) -> list[str]:
    """Which of ``among`` the user's sessions were ever recorded with."""
    found = []
    with engine.connect() as connection:
        for group in among:
            query = select(exists().where(
                sessions.c.user_name == user, session_groups.c.session_id == sessions.c.id,
                session_groups.c.group_name == group))
            if connection.execute(query).scalar():
                found.append(group)
    return found


def open_sessions(engine: Engine, names: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The open session of each user's default server: its CPU (average and peak,
    cores), memory (average and peak, bytes), limits and last sample."""
    if not names:
        return {}
    found: dict[str, dict[str, Any]] = {}
    query = (select(sessions).where(sessions.c.user_name.in_(list(names)),
                                    sessions.c.server_name == "", sessions.c.stopped.is_(None))
             .order_by(sessions.c.requested))
    with engine.connect() as connection:
        for row in connection.execute(query).mappings():
            found[row["user_name"]] = {  # the newest wins
                "cpu": row["cpu_sum"] / row["cpu_samples"] if row["cpu_samples"] else None,
                "cpu_peak": row["cpu_peak"],
                "cpu_limit": row["cpu_limit"],
                "memory": row["mem_sum"] / row["mem_samples"] if row["mem_samples"] else None,
                "memory_peak": row["mem_peak"],
                "memory_limit": row["mem_limit"],
                "gpu_count": row["gpu_count"],
                "last_seen": row["last_seen"],
                "started": row["started"],
            }
    return found
