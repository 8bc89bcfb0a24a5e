"""GPU-hours already spent, for the budget tests on a real hub (test_e2e_usage.py on the
shared one-GPU hub, test_e2e_cluster.py on its own): ``seed`` writes a finished session
into the hub's ledger, and ``midday_zone`` gives a budget a day that does not turn over
while the test runs."""

from __future__ import annotations

import time

from hubs import ONE_GPU_HUB_ID as HUB_ID
from sqlalchemy import insert

from spawner.usage.ledger import STOPPED, Ledger
from spawner.usage.schema import sessions

M = 2**20


def midday_zone() -> str:
    """A fixed-offset zone where it is about noon now: the test's day never turns over."""
    offset = (time.gmtime().tm_hour - 12 + 12) % 24 - 12  # Etc/GMT+N is N hours behind UTC
    return "UTC" if offset == 0 else f"Etc/GMT{offset:+d}"


def seed(url: str, user: str, gpu_hours: float, ended_ago: float = 60,
         hub: str = HUB_ID) -> None:
    """A finished session of ``user`` that reserved ``gpu_hours`` on 4 GPUs, just now,
    written whole in one transaction: the hub's budget check never sees it half-made."""
    ledger = Ledger(url, create=False)
    stopped = time.time() - ended_ago
    started = stopped - gpu_hours * 900
    try:
        with ledger.engine.begin() as db:
            db.execute(insert(sessions).values(
                hub=hub, user_name=user, container=f"seed-{user}-{time.monotonic_ns()}",
                role="gpu", image="pytorch", gpus=",".join(f"GPU-seed-{i}" for i in range(4)),
                gpu_count=4, gpu_mode="exclusive", gpu_reserved=4.0, cpu_limit=1,
                mem_limit=768 * M, requested=started - 5, started=started, ready=started + 1,
                stopped=stopped, reason=STOPPED))
    finally:
        ledger.dispose()
