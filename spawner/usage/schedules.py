"""The class dashboard's scheduled pre-warms, in the ledger's ``prewarm_schedules``.

An instructor asks for a class's servers to be started at a time; the usage service's
``Prewarmer`` (spawner/webapp/prewarm.py) runs each one when it is due and marks it
done or failed, with a line per member. A pending one can be cancelled.

Everything here reads or writes the ledger and blocks: call it from a thread.
"""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import Engine, and_, insert, select, update

from spawner.usage.schema import prewarm_schedules

PENDING, DONE, CANCELLED, FAILED = "pending", "done", "cancelled", "failed"
STATES = (PENDING, DONE, CANCELLED, FAILED)


def _schedule(row: Any) -> dict[str, Any]:
    return {"id": row["id"], "group": row["group_name"], "role": row["role"],
            "image": row["image"], "at": row["at"], "created_by": row["created_by"],
            "created_at": row["created_at"], "state": row["state"], "result": row["result"]}


def add(engine: Engine, group: str, role: str, image: str, at: float, who: str,
        now: float | None = None) -> dict[str, Any]:
    """A new pending schedule: start ``group``'s servers with ``role`` and ``image`` at
    ``at`` (epoch seconds)."""
    with engine.begin() as connection:
        new = connection.execute(insert(prewarm_schedules).values(
            group_name=group, role=role, image=image, at=float(at), created_by=who,
            created_at=time.time() if now is None else now, state=PENDING, result=""))
        (key,) = new.inserted_primary_key
    found = get(engine, int(key))
    assert found is not None
    return found


def get(engine: Engine, schedule_id: int) -> dict[str, Any] | None:
    with engine.connect() as connection:
        row = connection.execute(select(prewarm_schedules).where(
            prewarm_schedules.c.id == schedule_id)).mappings().first()
    return _schedule(row) if row else None


def of_group(engine: Engine, group: str) -> list[dict[str, Any]]:
    """A class's schedules, the next one first, then those done, newest first."""
    with engine.connect() as connection:
        rows = connection.execute(select(prewarm_schedules).where(
            prewarm_schedules.c.group_name == group)).mappings().all()
    found = [_schedule(r) for r in rows]
    return sorted(found, key=lambda s: (s["state"] != PENDING,
                                        s["at"] if s["state"] == PENDING else -s["at"], s["id"]))


def cancel(engine: Engine, group: str, schedule_id: int) -> tuple[bool, str | None]:
    """(whether this call cancelled it, the schedule's state before: None when this group
    has no such schedule)."""
    with engine.begin() as connection:
        row = connection.execute(select(prewarm_schedules).where(and_(
            prewarm_schedules.c.id == schedule_id,
            prewarm_schedules.c.group_name == group))).mappings().first()
        if row is None:
            return False, None
        if row["state"] != PENDING:
            return False, str(row["state"])
        connection.execute(update(prewarm_schedules).where(and_(
            prewarm_schedules.c.id == schedule_id, prewarm_schedules.c.state == PENDING))
            .values(state=CANCELLED))
    return True, PENDING


def due(engine: Engine, now: float) -> list[dict[str, Any]]:
    """The pending schedules whose time has come, the earliest first."""
    with engine.connect() as connection:
        rows = connection.execute(select(prewarm_schedules).where(and_(
            prewarm_schedules.c.state == PENDING, prewarm_schedules.c.at <= now))
            .order_by(prewarm_schedules.c.at, prewarm_schedules.c.id)).mappings().all()
    return [_schedule(r) for r in rows]


def finish(engine: Engine, schedule_id: int, state: str, result: str) -> bool:
    """Marks a pending schedule done or failed; False when it was cancelled meanwhile."""
    assert state in (DONE, FAILED)
    with engine.begin() as connection:
        changed = connection.execute(update(prewarm_schedules).where(and_(
            prewarm_schedules.c.id == schedule_id, prewarm_schedules.c.state == PENDING))
            .values(state=state, result=result))
    return bool(changed.rowcount)
