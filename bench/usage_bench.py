"""Usage reports over a large ledger, and the ledger's write cost per sample.

Builds a SQLite ledger of 1,000,000 sessions (``--sessions``) over 12 months for
500 users in 20 groups, with five roles (two CPU-only, a shared-GPU one and two
with whole GPUs; four with a home size), four images, durations from minutes to
days, 1% failed starts, most sessions with samples (the home's peak too), and the
last 200 still running. It is made by ``Ledger(url)`` (the real schema and indexes)
and filled with executemany in transactions of 50,000 rows. Then, on that ledger:

- ``build_report`` for the last full month by user (with the quota table, so the
  right-sizing advice is in it, as ``quota-spawner report --quota-file`` does),
  by role and by group, and for a month in the middle of the year by user;
  each also with ``format_report(..., "table")`` on top; target under 2 s for a
  month by user. No other tool reports reserved against used per user, so there
  is no yardstick to divide by: the times are absolute, against the target.
- ``daily_gpu_hours`` and ``user_sessions`` for that month (the usage page's charts).
- ``Ledger.fold``: one watchdog cycle of 50 samples into 50 open sessions, in one
  transaction, repeated (ms per cycle, µs per sample).

    .venv/bin/python bench/usage_bench.py                       # about 2 minutes
    .venv/bin/python bench/usage_bench.py --sessions 100000 --runs 3

The ledger lives in a temporary folder, removed at the end.
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from spawner.quota.model import QuotaTable, Role  # noqa: E402
from spawner.usage.ledger import REASONS, Ledger, Sample, gpu_reserved  # noqa: E402
from spawner.usage.report import (  # noqa: E402
    build_report,
    daily_gpu_hours,
    format_report,
    user_sessions,
)
from spawner.usage.schema import session_groups, sessions  # noqa: E402

G = 2**30
UTC = timezone.utc
TARGET = 2.0  # seconds, a month by user
START = datetime(2025, 1, 1, tzinfo=UTC).timestamp()
END = datetime(2026, 1, 1, tzinfo=UTC).timestamp()
NOW = END - 3600  # the ledger's "now": 23:00 on its last day
ROLES = {  # name: (cpus, memory, gpus, mode, share, gpu_memory, disk)
    "student": (1, 2 * G, 0, "exclusive", 1, None, 5 * G),
    "researcher": (4, 16 * G, 0, "exclusive", 1, None, 50 * G),
    "gpu-shared": (4, 16 * G, 1, "shared", 4, 20 * G, 50 * G),
    "gpu-1": (8, 64 * G, 1, "exclusive", 1, None, 200 * G),
    "gpu-2": (16, 128 * G, 2, "exclusive", 1, None, None),
}
IMAGES = ("python", "pytorch", "tensorflow", "r")


def quota_table() -> QuotaTable:
    roles = {name: Role(name=name, cpus=c, memory=m, images=IMAGES, gpus=g, gpu_mode=mode,
                        gpu_share=share, gpu_memory=gm, disk=disk)
             for name, (c, m, g, mode, share, gm, disk) in ROLES.items()}
    groups = {f"g{i:02d}": tuple(ROLES) for i in range(20)}
    return QuotaTable(path="bench", images={}, roles=roles, groups=groups)


def seed(ledger: Ledger, count: int, users: int, rng: random.Random) -> None:
    """``count`` sessions over the year, started in time order; the last 200 still run."""
    names = list(ROLES)
    people = [(f"user{u:03d}", names[u % len(names)], rng.sample(range(20), 1 + u % 2))
              for u in range(users)]
    columns = [c.name for c in sessions.columns]
    statement = (f"INSERT INTO sessions ({', '.join(columns)}) "
                 f"VALUES ({', '.join('?' for _ in columns)})")
    groups_statement = "INSERT INTO session_groups (session_id, group_name) VALUES (?, ?)"
    step = (NOW - START) / count
    homes = random.Random(35)
    raw = ledger.engine.raw_connection()
    try:
        cursor = raw.cursor()
        batch: list[tuple] = []
        member: list[tuple] = []
        for i in range(1, count + 1):
            user, role, groups = people[rng.randrange(users)]
            cpus, memory, gpus, mode, share, gpu_memory, disk = ROLES[role]
            requested = START + (i - 1) * step + rng.random() * step
            kind = rng.random()
            hours = (rng.uniform(0.2, 6) if kind < 0.7 else rng.uniform(6, 48) if kind < 0.95
                     else rng.uniform(48, 168))
            failed = rng.random() < 0.01
            running = i > count - 200
            started = None if failed else requested + rng.uniform(2, 30)
            stopped = (None if running else requested + 60 if failed
                       else min(started + hours * 3600, NOW - 1))
            reason = (None if running else "failed" if failed
                      else rng.choice(REASONS[:5]) if rng.random() < 0.3 else "stopped")
            sampled = not failed and rng.random() < 0.9
            n = int(hours * 720) if sampled else 0
            cpu_peak = rng.uniform(0.05, 1.0) * cpus if sampled else None
            mem_peak = int(rng.uniform(0.05, 0.95) * memory) if sampled else None
            util_peak = rng.uniform(0, 1) if sampled and gpus else None
            gmem_peak = int(rng.uniform(0, 20) * G) if sampled and gpus else None
            # its own generator: every other value is the ledger of before the homes
            home_peak = int(homes.uniform(0.01, 1.0) * disk) if sampled and disk else None
            uuids = ",".join(f"GPU-{rng.randrange(64):04d}" for _ in range(gpus))
            gpu_mode = f"shared:{share}" if mode == "shared" else ("exclusive" if gpus else "")
            values = {
                "id": i, "hub": "bench", "user_name": user, "server_name": "",
                "container": f"jupyter-{user}-{i}", "container_id": None, "role": role,
                "image": IMAGES[i % len(IMAGES)], "gpus": uuids, "gpu_count": gpus,
                "gpu_mode": gpu_mode, "gpu_reserved": gpu_reserved(gpus, gpu_mode),
                "cpu_limit": float(cpus), "mem_limit": memory, "gpu_mem_limit": gpu_memory,
                "requested": requested, "started": started,
                "ready": None if failed else started + 3, "stopped": stopped, "reason": reason,
                "hint": None, "detail": None, "last_seen": stopped,
                "cpu_samples": n, "cpu_sum": n * (cpu_peak or 0) / 2, "cpu_peak": cpu_peak,
                "mem_samples": n, "mem_sum": n * (mem_peak or 0) / 2, "mem_peak": mem_peak,
                "gpu_samples": n if gpus else 0, "gpu_util_sum": n * (util_peak or 0) / 2,
                "gpu_util_peak": util_peak, "gpu_mem_sum": n * (gmem_peak or 0) / 2,
                "gpu_mem_peak": gmem_peak, "oom_kills": int(reason == "oom"),
                "home_size": None if failed else disk, "home_peak": home_peak,
            }
            batch.append(tuple(values[c] for c in columns))
            member += [(i, f"g{g:02d}") for g in groups]
            if len(batch) >= 50_000:
                cursor.executemany(statement, batch)
                cursor.executemany(groups_statement, member)
                raw.commit()
                batch, member = [], []
        if batch:
            cursor.executemany(statement, batch)
            cursor.executemany(groups_statement, member)
            raw.commit()
    finally:
        raw.close()
    assert session_groups.name == "session_groups"


def timed(runs: int, call) -> tuple[float, object]:
    took = []
    result = None
    for _ in range(runs):
        start = time.perf_counter()
        result = call()
        took.append(time.perf_counter() - start)
    return statistics.median(took), result


def month(year: int, number: int) -> tuple[float, float]:
    first = datetime(year, number, 1, tzinfo=UTC)
    following = datetime(year + number // 12, number % 12 + 1, 1, tzinfo=UTC)
    return first.timestamp(), following.timestamp()


def fold_cost(ledger: Ledger, cycles: int) -> tuple[float, float]:
    """ms per cycle of 50 samples into 50 open sessions (the running ones)."""
    from sqlalchemy import select

    with ledger.engine.connect() as connection:
        open_ = [r.container for r in connection.execute(
            select(sessions.c.container).where(sessions.c.stopped.is_(None)).limit(50))]
    took = []
    for cycle in range(cycles):
        t = NOW + cycle * 5
        samples = [Sample(hub="bench", container=c, time=t, cpu=0.5 + k / 100,
                          memory=(1 + k) * 2**26, gpu_util=0.3, gpu_memory=2**30,
                          home_used=(1 + k + cycle) * 2**26)
                   for k, c in enumerate(open_)]
        start = time.perf_counter()
        done = ledger.fold(samples)
        took.append(time.perf_counter() - start)
        assert done == len(samples), (done, len(samples))
    per_cycle = statistics.median(took)
    return per_cycle * 1000, per_cycle / len(open_) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=1_000_000)
    parser.add_argument("--users", type=int, default=500)
    parser.add_argument("--runs", type=int, default=5, help="runs of each report (median)")
    parser.add_argument("--cycles", type=int, default=200, help="fold cycles of 50 samples")
    args = parser.parse_args()
    rng = random.Random(14)
    folder = tempfile.mkdtemp(prefix="usage-bench-")
    try:
        ledger = Ledger(f"sqlite:///{folder}/ledger.sqlite")
        start = time.perf_counter()
        seed(ledger, args.sessions, args.users, rng)
        seeded = time.perf_counter() - start
        size = Path(folder, "ledger.sqlite").stat().st_size
        print(f"\n== usage reports: {args.sessions:,} sessions over 12 months, "
              f"{args.users} users, SQLite ({size / 2**20:.0f} MiB)")
        print(f"  seeded in {seeded:.1f} s ({args.sessions / seeded:,.0f} sessions/s)")
        table = quota_table()
        last = month(2025, 12)
        middle = month(2025, 6)
        cases = [
            ("month by user, with advice", last, "user", table),
            ("month by user, no quota table", last, "user", None),
            ("month by role", last, "role", None),
            ("month by group", last, "group", None),
            ("mid-year month by user, advice", middle, "user", table),
        ]
        print(f"  {'report (last month unless said)':<34} {'rows':>5} {'build s':>8} "
              f"{'+table s':>9}  target {TARGET:g} s")
        for name, (since, until), by, quota in cases:
            def build(since=since, until=until, by=by, quota=quota):
                return build_report(ledger.engine, since=since, until=until, by=by,
                                    table=quota, now=NOW)

            built, report = timed(args.runs, build)
            both, _ = timed(args.runs, lambda build=build: format_report(build(), "table"))
            ok = "ok" if both < TARGET else "OVER"
            print(f"  {name:<34} {len(report.rows):5d} {built:8.3f} {both:9.3f}  {ok}")
        since, until = last
        daily, days = timed(args.runs, lambda: daily_gpu_hours(
            ledger.engine, since=since, until=until, now=NOW))
        one, listed = timed(args.runs, lambda: user_sessions(
            ledger.engine, "user007", since=since, until=until, now=NOW))
        print(f"  daily_gpu_hours, a month: {daily:.3f} s ({len(days)} day-role rows); "
              f"user_sessions, one user's month: {one:.3f} s ({len(listed)} sessions)")
        ms, us = fold_cost(ledger, args.cycles)
        print(f"  Ledger.fold, 50 samples a cycle: {ms:.2f} ms per cycle, "
              f"{us:.0f} µs per sample (median of {args.cycles} cycles)")
        ledger.dispose()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
