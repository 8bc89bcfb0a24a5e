"""The class dashboard's logic: a class's members and their servers, what a pre-warm may
start, and the scheduled pre-warms in the usage ledger.

Everything here is plain or blocking (the ledger); the usage service's class API
(spawner/webapp/classes.py) calls it on its worker threads and does the hub calls.

- ``members(users, group)``: the hub's user models (``GET /hub/api/users``) of a group;
- ``common_choices(table, members)``: the role and image pairs every member may start,
  the pre-warm picker's choices; ``partial_choices`` those only some hold, with who
  lacks them; ``lacking`` says who may not start one;
- ``member_row``: one member's server state, role, image, last activity, with the
  ledger's CPU and memory of the open session and the watchdog's GPU memory;
- ``add_schedule``, ``schedules``, ``cancel``, ``due``, ``finish``: the pre-warm
  schedules (``prewarm_schedules``);
- ``class_service_scopes(classes)``: what the service's own role needs to run
  the schedules of these classes when no instructor is there.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import quote

from sqlalchemy import Engine, and_, insert, select, update

from spawner.quota.model import QuotaTable
from spawner.usage.schema import prewarm_schedules, sessions
from spawner.webapp.gpu_map import usage_state

PENDING, DONE, CANCELLED, FAILED = "pending", "done", "cancelled", "failed"
STATES = (PENDING, DONE, CANCELLED, FAILED)

# Asked for by the usage service's OAuth client: the hub intersects them with the
# visitor's own scopes, so an instructor's token carries list:users!group=G,
# read:users!group=G and servers!group=G and nothing wider (spawner/hubconfig/rbac.py).
CLASS_OAUTH_SCOPES = ("list:users", "read:users", "servers")


def class_service_scopes(classes: Mapping[str, Iterable[str]] | Iterable[str]) -> list[str]:
    """The service's own scopes to start (and stop) the servers of these classes'
    members: ``{group: [instructor, ...]}``, as ``instructor_roles`` takes, or groups."""
    return [f"servers!group={group}" for group in sorted(set(classes))]


# --- the hub's users ----------------------------------------------------------------------


def groups_of(users: Iterable[dict[str, Any]]) -> list[str]:
    """Every group these users belong to."""
    return sorted({g for user in users for g in (user.get("groups") or [])})


def members(users: Iterable[dict[str, Any]], group: str) -> list[dict[str, Any]]:
    """The users of ``group``, by name."""
    return sorted((u for u in users if group in (u.get("groups") or [])),
                  key=lambda u: str(u.get("name")))


def default_server(user: dict[str, Any]) -> dict[str, Any] | None:
    return (user.get("servers") or {}).get("")


def server_state(user: dict[str, Any]) -> str:
    """"running", "starting", "stopping" or "stopped": the user's default server."""
    server = default_server(user)
    if not server:
        return "stopped"
    pending = server.get("pending")
    if pending == "stop":
        return "stopping"
    if pending or not server.get("ready"):
        return "starting"
    return "running"


# --- what a pre-warm may start -----------------------------------------------------------------


def _pairs(table: QuotaTable, user: dict[str, Any]) -> list[tuple[str, str]]:
    return [(c.role.name, c.image.key)
            for c in table.choices_for(str(user["name"]), user.get("groups") or [])]


def common_choices(table: QuotaTable, users: Sequence[dict[str, Any]]) -> list[dict[str, str]]:
    """The role and image pairs every one of ``users`` may start, in the table's order of
    the first user's choices; none for no users."""
    if not users:
        return []
    first = _pairs(table, users[0])
    common = set(first)
    for user in users[1:]:
        common &= set(_pairs(table, user))
    return [{"role": role, "image": image} for role, image in first if (role, image) in common]


def partial_choices(table: QuotaTable, users: Sequence[dict[str, Any]]
                    ) -> list[dict[str, Any]]:
    """The role and image pairs some of ``users`` may start but not all, each with the
    names of those who may not (``lacking``): the page shows why a pair is not offered."""
    held = {str(u["name"]): _pairs(table, u) for u in users}
    every = [pair for pairs in held.values() for pair in pairs]
    found = []
    for pair in dict.fromkeys(every):
        missing = [name for name, pairs in held.items() if pair not in pairs]
        if missing:
            found.append({"role": pair[0], "image": pair[1], "lacking": missing})
    return found


def lacking(table: QuotaTable, users: Sequence[dict[str, Any]], role: str,
            image: str) -> list[str]:
    """The names of those among ``users`` who may not start ``role`` with ``image``."""
    return [str(u["name"]) for u in users if (role, image) not in set(_pairs(table, u))]


# --- a member's row -------------------------------------------------------------------------------


def open_sessions(engine: Engine, names: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The ledger's open session of each user's default server: its CPU (average and
    peak, cores), memory (peak, bytes), limits and last sample."""
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


def gpu_memory_by_user(usage: dict[str, Any] | None, now: float) -> dict[str, int]:
    """Each user's GPU memory (bytes, over all their servers' GPUs) from the watchdog's
    ``quota-spawner-gpu-usage.json``, when it is fresh; else nothing."""
    if usage_state(usage, now) != "fresh" or not usage:
        return {}
    found: dict[str, int] = {}
    for server in (usage.get("servers") or {}).values():
        if not isinstance(server, dict) or not server.get("user"):
            continue
        memory = sum(v for v in (server.get("gpu_memory") or {}).values()
                     if isinstance(v, (int, float)) and not isinstance(v, bool))
        found[server["user"]] = found.get(server["user"], 0) + int(memory)
    return found


def member_row(user: dict[str, Any], used: Mapping[str, dict[str, Any]],
               gpu: Mapping[str, int], gpu_fresh: bool, hub_base: str = "/") -> dict[str, Any]:
    """One member of a class, for the dashboard: the hub's server model merged with the
    ledger's session and the watchdog's GPU memory (None where not known)."""
    name = str(user["name"])
    server = default_server(user) or {}
    options = server.get("user_options") or {}
    state = server_state(user)
    session = used.get(name, {}) if state != "stopped" else {}
    return {
        "name": name,
        "state": state,
        "role": options.get("profile") if server else None,
        "image": options.get("image") if server else None,
        "started": server.get("started"),
        "last_activity": user.get("last_activity") or server.get("last_activity"),
        # escaped as the hub escapes it in its own URLs: a name may hold any character
        "url": (f"{hub_base.rstrip('/')}/user/{quote(name, safe='@~')}/"
                if state == "running" else None),
        "cpu": session.get("cpu"),
        "cpu_peak": session.get("cpu_peak"),
        "cpu_limit": session.get("cpu_limit"),
        "memory": session.get("memory"),
        "memory_peak": session.get("memory_peak"),
        "memory_limit": session.get("memory_limit"),
        "gpu_count": session.get("gpu_count"),
        "gpu_memory": gpu.get(name, 0 if gpu_fresh else None) if state != "stopped" else None,
        "last_seen": session.get("last_seen"),
    }


# --- the schedules --------------------------------------------------------------------------------


def _schedule(row: Any) -> dict[str, Any]:
    return {"id": row["id"], "group": row["group_name"], "role": row["role"],
            "image": row["image"], "at": row["at"], "created_by": row["created_by"],
            "created_at": row["created_at"], "state": row["state"], "result": row["result"]}


def add_schedule(engine: Engine, group: str, role: str, image: str, at: float, who: str,
                 now: float | None = None) -> dict[str, Any]:
    with engine.begin() as connection:
        new = connection.execute(insert(prewarm_schedules).values(
            group_name=group, role=role, image=image, at=float(at), created_by=who,
            created_at=time.time() if now is None else now, state=PENDING, result=""))
        (key,) = new.inserted_primary_key
    found = schedule(engine, int(key))
    assert found is not None
    return found


def schedule(engine: Engine, schedule_id: int) -> dict[str, Any] | None:
    with engine.connect() as connection:
        row = connection.execute(select(prewarm_schedules).where(
            prewarm_schedules.c.id == schedule_id)).mappings().first()
    return _schedule(row) if row else None


def schedules(engine: Engine, group: str) -> list[dict[str, Any]]:
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
