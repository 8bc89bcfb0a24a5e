"""Spawn latency: QuotaSpawner against plain DockerSpawner, in the same run.

Spawns N servers one after another, then N at once, with each spawner, on the
same image and the same limits, through a real hub, proxy and dockerd.
Latency is from the REST API's POST to the hub reporting the server ready.

    .venv/bin/python bench/spawn_bench.py [-n 10] [--storm 10]
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

from baseline import PLAIN_CONFIG, pct, spawn_and_wait  # noqa: E402

from harness import Hub, cleanup, ensure_engine  # noqa: E402

QUOTA_CONFIG = """
c.QuotaSpawner.http_timeout = 120
c.QuotaSpawner.start_timeout = 300
"""
QUOTAS = """\
images:
  pytorch: {image: "quota-spawner/pytorch:latest"}
roles:
  bench: {cpus: 1, memory: 1G, images: [pytorch]}
assignments:
  default: [bench]
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=10, help="sequential spawns (default 10)")
    parser.add_argument("--storm", type=int, default=10, help="concurrent spawns (default 10)")
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
                                        extra_config=QUOTA_CONFIG), args.n, args.storm)
    finally:
        cleanup(client, prefix)
    print("\nratios (QuotaSpawner / plain DockerSpawner; lower is faster):")
    for key, target in (("seq_median", 0.6), ("seq_p95", None), ("storm_median", None),
                        ("storm_p95", None), ("storm_wall", 1.0)):
        ratio = quota[key] / plain[key]
        goal = f"  (target <= {target})" if target else ""
        verdict = "" if target is None else ("  ok" if ratio <= target else "  MISSED")
        print(f"  {key:<13} {ratio:5.2f}{goal}{verdict}")


if __name__ == "__main__":
    main()
