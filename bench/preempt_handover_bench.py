"""Preemption hand-over: from the preempting request to the freed GPU, beyond the grace.

Through a real hub, proxy and dockerd (the fake NVIDIA hook, a declared
inventory of one fake GPU). Each round: a low-priority server holds the GPU,
then an urgent start preempts it. Measured from the hub's event log:

- hand-over beyond the grace: the ``queue-granted`` event of the urgent start,
  less its ``preemption`` event, less the grace period (the victim's stop
  through the hub, the release and the grant; target under 2 s);
- the urgent start's whole time to a ready server, less the grace, against
  a start of the same role on a free GPU, and against plain DockerSpawner's
  start in the same run (the ratio is what preemption adds to a start).

    .venv/bin/python bench/preempt_handover_bench.py [-n 5] [--grace 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from baseline import PLAIN_CONFIG, QUOTA_CONFIG, pct, run_parts, spawn_and_wait  # noqa: E402

from harness import Hub, cleanup, ensure_engine  # noqa: E402

QUOTAS = """\
images:
  pytorch: {{image: "quota-spawner/pytorch:latest"}}
roles:
  low:
    {{cpus: 1, memory: 1G, gpus: 1, priority: 300000, grace_period: {grace}s,
     min_runtime: 0, images: [pytorch]}}
  urgent:
    {{cpus: 1, memory: 1G, gpus: 1, priority: 1000000, min_runtime: 0, images: [pytorch]}}
assignments:
  default: [low, urgent]
"""
PREFIX = "qsbenchpre"


def events(hub: Hub) -> list[dict]:
    return hub.events()  # its ledger's events table


def summary(values: list[float]) -> str:
    return (f"median {statistics.median(values):.2f} s, p95 {pct(values, 0.95):.2f} s, "
            f"max {max(values):.2f} s (n={len(values)})")


def run_quota(work: Path, n: int, grace: float) -> dict[str, str]:
    gpus = [{"uuid": f"GPU-{PREFIX}-0", "name": "Fake GPU", "memory": "16G"}]
    hub = Hub(work / "quota", quota_text=QUOTAS.format(grace=grace), prefix=PREFIX,
              extra_config=QUOTA_CONFIG + f"c.QuotaSpawner.gpu_inventory = {gpus!r}\n")
    hub.start()
    free, whole, handover = [], [], []
    try:
        for i in range(n):
            low, urgent = f"low{i}", f"urgent{i}"
            hub.create_user(low)
            hub.create_user(urgent)
            free.append(spawn_and_wait(hub, low, {"profile": "low"}))  # on a free GPU
            whole.append(spawn_and_wait(hub, urgent, {"profile": "urgent"}) - grace)
            by_kind = {e["event"]: e for e in events(hub) if urgent in
                       (e.get("by"), e.get("user"))}
            handover.append(by_kind["queue-granted"]["time"] - by_kind["preemption"]["time"]
                            - grace)
            hub.stop_server(urgent)
            hub.wait_stopped(low)
    finally:
        hub.stop()
        cleanup(ensure_engine(), PREFIX)
    print(f"  start on a free GPU:            {summary(free)}")
    print(f"  preempting start, less grace:   {summary(whole)}")
    print(f"  hand-over beyond the grace:     {summary(handover)}")
    return {"free": statistics.median(free), "whole": statistics.median(whole),
            "handover": statistics.median(handover), "handover_max": max(handover)}


def run_plain(work: Path, n: int) -> float:
    hub = Hub(work / "plain", prefix=PREFIX + "p", spawner_class="baseline.PlainDockerSpawner",
              pythonpath=str(HERE), extra_config=PLAIN_CONFIG)
    hub.start()
    times = []
    try:
        for i in range(n):
            name = f"plain{i}"
            hub.create_user(name)
            times.append(spawn_and_wait(hub, name))
            hub.stop_server(name)
    finally:
        hub.stop()
        cleanup(ensure_engine(), PREFIX + "p")
    print(f"  plain DockerSpawner start:      {summary(times)}")
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-n", type=int, default=5, help="preemptions to measure")
    parser.add_argument("--grace", type=float, default=3.0, help="the victim's grace_period")
    args = parser.parse_args()
    ensure_engine()
    with tempfile.TemporaryDirectory(prefix="preempt-bench-") as tmp:
        work = Path(tmp)
        results: dict[str, float] = {}

        def quota() -> dict[str, str]:
            results.update(run_quota(work, args.n, args.grace))
            return {"hand-over beyond the grace (median)": f"{results['handover']:.2f} s",
                    "hand-over beyond the grace (max)": f"{results['handover_max']:.2f} s "
                                                        "(target < 2 s)",
                    "preempting start less grace": f"{results['whole']:.2f} s",
                    "start on a free GPU": f"{results['free']:.2f} s"}

        def plain() -> dict[str, str]:
            results["plain"] = run_plain(work, args.n)
            return {"plain DockerSpawner start": f"{results['plain']:.2f} s",
                    "preempting start / plain start":
                        f"{results['whole'] / results['plain']:.2f}x",
                    "free-GPU start / plain start": f"{results['free'] / results['plain']:.2f}x"}

        run_parts("preempt_handover_bench", [("QuotaSpawner", quota), ("baseline", plain)])


if __name__ == "__main__":
    main()
