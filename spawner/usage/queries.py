"""SQL pieces every reading of the ledger shares: a session's time inside a window.

Reports and budgets count the same hours: from the container's start to its
stop (or now, for a session still running), clipped to the window asked for.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import and_, case, func, literal

from spawner.usage.schema import sessions


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
