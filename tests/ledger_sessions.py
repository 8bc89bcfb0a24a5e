"""Sessions in a test's usage ledger: what the ledger's own tests write and read back (the
hubs, the times, ``open_session``, ``ran``, ``row``, ``outcome``, ...), and the seeded
sessions of several users, roles and groups, hostile names included, that the usage
page's tests read (``seed_ledger``). ``LOG`` is the logger of the ``ledger`` fixture
(tests/conftest.py)."""

from __future__ import annotations

import logging
import time
from datetime import datetime, timezone

from sqlalchemy import select

from spawner.usage.ledger import Ledger, Sample
from spawner.usage.schema import session_groups, sessions

# --- the ledger's own tests (tests/unit/test_usage_*.py, test_event_store.py) ------------

G = 2**30
HUB = "hub-a"
OTHER_HUB = "hub-b"
DAY = 86400.0
# 2024-05-06T07:08:09Z, and Docker's spelling of it with nanoseconds
FINISHED = datetime(2024, 5, 6, 7, 8, 9, tzinfo=timezone.utc).timestamp()
FINISHED_AT = "2024-05-06T07:08:09.123456789Z"
FINISHED_NANO = 1714979289123456789
LOG = logging.getLogger("test-ledger")


def open_session(ledger: Ledger, user: str = "ada", *, hub: str = HUB, container: str = "",
                 server: str = "", requested: float = 100.0, groups=(), role: str = "gpu",
                 ) -> int:
    return ledger.open(hub=hub, user=user, container=container or f"jupyter-{user}",
                       role=role, image="torch", cpu_limit=4.0, mem_limit=16 * G,
                       groups=groups, server=server, requested=requested)


def row(ledger: Ledger, session_id: int) -> dict:
    with ledger.engine.connect() as connection:
        found = connection.execute(select(sessions).where(sessions.c.id == session_id)).first()
    assert found is not None, session_id
    return dict(found._mapping)


def all_rows(ledger: Ledger) -> list[dict]:
    with ledger.engine.connect() as connection:
        return [dict(r._mapping) for r in connection.execute(
            select(sessions).order_by(sessions.c.id))]


def group_rows(ledger: Ledger) -> list[tuple[int, str]]:
    with ledger.engine.connect() as connection:
        return [tuple(r) for r in connection.execute(
            select(session_groups.c.session_id, session_groups.c.group_name)
            .order_by(session_groups.c.session_id, session_groups.c.group_name))]


def ran(ledger: Ledger, container: str = "jupyter-ada", *, started: float = 110.0,
        ready: float | None = 115.0, hub: str = HUB, container_id: str = "cid-ada") -> None:
    ledger.started(hub, container, container_id, when=started)
    if ready is not None:
        ledger.ready(hub, container, when=ready)


def usage(ledger: Ledger, session: int) -> dict:
    found = row(ledger, session)
    return {k: found[k] for k in (
        "last_seen", "cpu_samples", "cpu_sum", "cpu_peak", "mem_samples", "mem_sum", "mem_peak",
        "gpu_samples", "gpu_util_sum", "gpu_util_peak", "gpu_mem_sum", "gpu_mem_peak",
        "oom_kills")}


def outcome(ledger: Ledger, session: int) -> tuple:
    found = row(ledger, session)
    return found["reason"], found["detail"], found["stopped"]


# --- the usage page's seeded ledger (tests/service/test_usage_service.py and
# tests/browser/test_browser_usage.py) ------------------------------------------------------

HOSTILE_USER = "<script>alert(1)</script>"
HOSTILE_GROUP = 'a"b&c'
GiB = 2**30
HOUR = 3600.0


# user, groups, role, image, GPUs reserved (count, mode), sessions:
# (hours before now it started, hours it ran, reason, CPU used, memory peak GiB, GPU busy)
SEEDED = [
    ("alice", ["cs101"], "gpu-lab", "pytorch", (1, "shared:4"),
     [(30, 2, "culled", 0.4, 1.2, 0.30), (26, 3, "stopped", 0.5, 1.5, 0.45),
      (5, 1, "oom", 1.8, 3.9, 0.90)]),
    ("student1", ["cs101"], "student", "pytorch", (0, ""),
     [(28, 1.5, "culled", 0.2, 0.5, None), (4, 1, "stopped", 0.3, 0.6, None)]),
    (HOSTILE_USER, ["cs101"], "student", "pytorch", (0, ""),
     [(20, 2, "max-age", 0.6, 1.0, None)]),
    ("bob", ["ml-platform"], "senior-engineer", "paddle", (0, ""),
     [(50 - 8 * i, 2, "stopped", 0.5, 1.2, None) for i in range(6)]),
    ("bob", ["ml-platform"], "gpu-training", "pytorch", (1, "exclusive"),
     [(12, 6, "preempted", 3.0, 10.0, 0.65), (3, None, None, 4.0, 12.0, 0.80)]),
    ("mallory", [HOSTILE_GROUP], "junior-researcher", "pytorch", (0, ""),
     [(10, 1, "stopped", 0.1, 0.3, None)]),
    ("dave", [], "pipeline", "pytorch", (0, ""), [(8, 0.5, "failed", None, None, None)]),
]
ROLE_LIMITS = {"gpu-lab": (2, 4), "student": (1, 2), "senior-engineer": (8, 32),
               "gpu-training": (8, 32), "junior-researcher": (2, 4), "pipeline": (1, 2)}
SEEDED_HUB = "seeded"  # not the test hub's id: its duties leave these sessions alone
# user: (their home's size, the most it held in GiB); the others' homes have no size
SEEDED_HOMES = {"alice": (20 * GiB, 3.0), "bob": (50 * GiB, 2.0)}


def seed_ledger(url: str, now: float | None = None) -> None:
    """Sessions of several users, roles and groups, hostile names included, with samples."""
    now = time.time() if now is None else now
    ledger = Ledger(url)
    n = 0
    for user, groups, role, image, (gpus, mode), runs in SEEDED:
        cpus, memory = ROLE_LIMITS[role]
        home_size, home_peak = SEEDED_HOMES.get(user, (None, None))
        for ago, ran, reason, cpu, mem, gpu in runs:
            n += 1
            container = f"seed-{n}"
            start = now - ago * HOUR
            ledger.open(hub=SEEDED_HUB, user=user, container=container, role=role,
                        image=image, cpu_limit=cpus, mem_limit=memory * GiB, groups=groups,
                        requested=start - 5)
            if gpus:
                ledger.set_gpus(SEEDED_HUB, container, [f"GPU-{n}"] * gpus, mode, None)
            if reason == "failed":
                ledger.close(SEEDED_HUB, container, "failed", "image missing", when=start + 60)
                continue
            ledger.started(SEEDED_HUB, container, f"id{n}", when=start, home_size=home_size)
            ledger.ready(SEEDED_HUB, container, when=start + 10)
            end = now if ran is None else start + ran * HOUR
            for k in range(1, 4):
                ledger.fold([Sample(
                    SEEDED_HUB, container, start + (end - start) * k / 4, cpu=cpu * k / 3,
                    memory=int(mem * GiB * k / 3),
                    gpu_util=None if gpu is None else gpu * k / 3,
                    gpu_memory=None if gpu is None else int(gpu * 8 * GiB),
                    home_used=None if home_peak is None else int(home_peak * GiB * k / 3))])
            if ran is not None:
                ledger.close(SEEDED_HUB, container, reason, when=end)
    ledger.dispose()


ALL_USERS = {"alice", "student1", HOSTILE_USER, "bob", "mallory", "dave"}
CS101 = {"alice", "student1", HOSTILE_USER}
