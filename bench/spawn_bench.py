"""Spawn latency: QuotaSpawner against plain DockerSpawner, in the same run.

Spawns N servers one after another, then N at once, with each spawner, on the
same image and the same limits, through a real hub, proxy and dockerd.
Latency is from the REST API's POST to the hub reporting the server ready.

Then the start CPU boost (QuotaSpawner.cpu_boost): single spawns of a
0.5-CPU role with and without the boost, and of a 2-CPU role, in turn.

    .venv/bin/python bench/spawn_bench.py [-n 10] [--storm 10] [--boost-n 4]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from baseline import OPEN_ADMISSION, PLAIN_CONFIG, QUOTA_CONFIG, pct, spawn_and_wait  # noqa: E402

from harness import Hub, cleanup, ensure_engine  # noqa: E402

QUOTAS = """\
images:
  pytorch: {image: "quota-spawner/pytorch:latest"}
roles:
  bench: {cpus: 1, memory: 1G, images: [pytorch]}
assignments:
  default: [bench]
"""



SIZES_QUOTAS = """\
images:
  pytorch: {image: "quota-spawner/pytorch:latest"}
roles:
  half: {cpus: 0.5, memory: 1G, images: [pytorch]}
  two: {cpus: 2, memory: 1G, images: [pytorch]}
assignments:
  default: [half, two]
"""


def stop_all(hub: Hub, names: list[str]) -> None:
    with ThreadPoolExecutor(len(names)) as pool:
        list(pool.map(hub.stop_server, names))



def run(label: str, hub: Hub, n: int, storm: int) -> dict[str, float]:
    hub.start()
    try:
        names = [f"bench-{i}" for i in range(max(n, storm))]
        for name in names:
            hub.create_user(name)
        spawn_and_wait(hub, names[0])  # warm-up: page cache, image layers
        stop_all(hub, names[:1])
        sequential = []
        for name in names[:n]:
            sequential.append(spawn_and_wait(hub, name))
            hub.stop_server(name)
        begin = time.perf_counter()
        with ThreadPoolExecutor(storm) as pool:
            concurrent = list(pool.map(lambda u: spawn_and_wait(hub, u), names[:storm]))
        wall = time.perf_counter() - begin
        stop_all(hub, names[:storm])
    finally:
        hub.stop()
    result = {
        "seq_median": statistics.median(sequential), "seq_p95": pct(sequential, 0.95),
        "storm_median": statistics.median(concurrent), "storm_p95": pct(concurrent, 0.95),
        "storm_wall": wall,
    }
    print(f"{label:<20} " + "  ".join(f"{k}={v:6.2f}s" for k, v in result.items()), flush=True)
    return result


def run_sizes(work: Path, prefix: str, n: int) -> dict[str, float]:
    """Median single spawn per (role, boost); the roles take turns, so drift hits both."""
    times: dict[str, list[float]] = {"half+boost": [], "two+boost": [], "half-noboost": []}
    for boost in (True, False):
        hub = Hub(work / f"sizes-{boost}", SIZES_QUOTAS, prefix=prefix,
                  extra_config=QUOTA_CONFIG + f"c.QuotaSpawner.cpu_boost = {boost}\n")
        hub.start()
        try:
            roles = ("half", "two") if boost else ("half",)
            for role in roles:
                hub.create_user(f"size-{role}")
            spawn_and_wait(hub, "size-half", {"profile": "half"})  # warm-up
            hub.stop_server("size-half")
            for _ in range(n):
                for role in roles:
                    key = f"{role}{'+boost' if boost else '-noboost'}"
                    times[key].append(spawn_and_wait(hub, f"size-{role}", {"profile": role}))
                    hub.stop_server(f"size-{role}")
        finally:
            hub.stop()
    result = {key: statistics.median(values) for key, values in times.items()}
    print(f"single spawn, median of {n}: "
          + "  ".join(f"{k}={v:5.2f}s" for k, v in result.items()), flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=10, help="sequential spawns (default 10)")
    parser.add_argument("--storm", type=int, default=10, help="concurrent spawns (default 10)")
    parser.add_argument("--boost-n", type=int, default=4,
                        help="single spawns per role for the CPU boost (default 4; 0 skips)")
    args = parser.parse_args()
    client = ensure_engine()
    prefix = f"qsbench{os.getpid()}"
    work = Path(tempfile.mkdtemp(prefix="quota-bench-"))
    print(f"spawn benchmark: {args.n} sequential, {args.storm} concurrent, "
          f"{os.cpu_count()} CPUs", flush=True)
    try:
        plain = run("plain DockerSpawner", Hub(
            work / "plain", prefix=prefix, spawner_class="baseline.PlainDockerSpawner",
            extra_config=PLAIN_CONFIG, pythonpath=str(HERE)), args.n, args.storm)
        quota = run("QuotaSpawner", Hub(work / "quota", QUOTAS, prefix=prefix,
                                        extra_config=QUOTA_CONFIG + OPEN_ADMISSION),
                    args.n, args.storm)
        sizes = run_sizes(work, prefix, args.boost_n) if args.boost_n else None
    finally:
        cleanup(client, prefix)
    print("\nratios (QuotaSpawner / plain DockerSpawner; lower is faster):")
    for key, target in (("seq_median", 0.6), ("seq_p95", None), ("storm_median", None),
                        ("storm_p95", None), ("storm_wall", 1.0)):
        print_ratio(key, quota[key] / plain[key], target)
    if sizes:
        print("\nthe start CPU boost (single spawn medians):")
        print_ratio("0.5 CPU boosted / 2 CPU", sizes["half+boost"] / sizes["two+boost"], 1.1)
        print_ratio("0.5 CPU unboosted / boosted", sizes["half-noboost"] / sizes["half+boost"])


def print_ratio(label: str, ratio: float, target: float | None = None) -> None:
    goal = f"  (target <= {target})" if target else ""
    verdict = "" if target is None else ("  ok" if ratio <= target else "  MISSED")
    print(f"  {label:<28} {ratio:5.2f}{goal}{verdict}")


if __name__ == "__main__":
    main()
