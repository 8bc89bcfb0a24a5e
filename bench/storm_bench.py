"""GPU storms: simultaneous starts on 4 fake GPUs, measured, against plain DockerSpawner.

Through a real hub, proxy and dockerd (the test engine's fake NVIDIA hook, a declared
inventory of 4 fake GPUs). The suite keeps a short test of each guarantee
(tests/e2e/test_e2e_gpus.py::test_simultaneous_starts_never_double_book,
tests/e2e/test_e2e_preemption.py::test_two_preempting_starts_at_once_take_one_victim_each_and_share_no_gpu);
the storms themselves are measurements of behaviour under load, here:

--spawns      rounds of 12 exclusive starts at once (queue_timeout 0): 4 start, 8 are
              refused at once; no GPU is held twice. Timed: the refusals' answers, and
              from the first POST to the 4 servers ready, against 4 plain DockerSpawner
              starts at once on the same image and limits.
--priorities  rounds of 7 starts of three priorities (low never preempts; mid and high
              preempt with a 3 s grace; every role queues 8 s), arriving over a few
              seconds at random (fixed seed). A sampler reads the engine's containers
              every 0.3 s: no GPU is ever on two running containers. Each preempting
              start takes one victim and exactly its GPU. Timed: each start's answer
              (ready or refused), and the ready ones against a plain DockerSpawner start.

    .venv/bin/python bench/storm_bench.py [--spawns] [--priorities] [--rounds 3] [--seed 12]

Both parts run unless one is chosen. Containers and volumes are named qsbench-storm<pid>-…
and removed at the end.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from baseline import PLAIN_CONFIG, QUOTA_CONFIG, pct, run_parts, spawn_and_wait  # noqa: E402

from harness import (  # noqa: E402
    Hub,
    cleanup,
    ensure_engine,
    gpu_inventory_config,
    running_gpus,
    spawn_in_background,
    spawn_outcome,
)

N_GPUS = 4
SPAWNS_QUOTAS = """\
images:
  pytorch: {image: "quota-spawner/pytorch:latest"}
roles:
  excl: {cpus: 1, memory: 1G, gpus: 1, queue_timeout: 0, images: [pytorch]}
assignments:
  default: [excl]
"""
PRIORITY_QUOTAS = """\
images:
  pytorch:
    image: quota-spawner/pytorch:latest
roles:
  low:
    cpus: 0.25
    memory: 256M
    gpus: 1
    priority: 300000
    preempts: never
    grace_period: 3s
    min_runtime: 0
    queue_timeout: 8s
    images: [pytorch]
  mid:
    cpus: 0.25
    memory: 256M
    gpus: 1
    priority: 500000
    grace_period: 3s
    min_runtime: 0
    queue_timeout: 8s
    images: [pytorch]
  high:
    cpus: 0.25
    memory: 256M
    gpus: 1
    priority: 1000000
    grace_period: 3s
    min_runtime: 0
    queue_timeout: 8s
    images: [pytorch]
assignments:
  default: [low, mid, high]
"""
# a start's answer: its queue_timeout, the victim's grace, the stop's limit and a start
BOUND = 8 + 3 + 60 + 30


def summary(values: list[float]) -> str:
    if not values:
        return "none"
    return (f"median {statistics.median(values):.2f} s, p95 {pct(values, 0.95):.2f} s, "
            f"max {max(values):.2f} s (n={len(values)})")


def gpu_hub(work: Path, prefix: str, quotas: str) -> Hub:
    gpus = [f"GPU-{prefix}-{i}" for i in range(N_GPUS)]
    hub = Hub(work / prefix, quota_text=quotas, prefix=prefix,
              extra_config=QUOTA_CONFIG + gpu_inventory_config(gpus)
              + "c.QuotaSpawner.gpu_sync_interval = 1\n")
    hub.gpus = gpus
    return hub


class Sampler:
    """Every 0.3 s, the running containers of PREFIX and their GPUs: any GPU on two of
    them is recorded."""

    def __init__(self, client, prefix: str):
        self.client, self.prefix = client, prefix
        self.twice: list[dict[str, str]] = []
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            holders = running_gpus(self.client, self.prefix)
            held = [g for label in holders.values() for g in label.split(",")]
            if len(held) != len(set(held)):
                self.twice.append(holders)
            self.samples += 1
            self._stop.wait(0.3)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


def stop_all(hub: Hub, names: list[str]) -> None:
    running = [n for n in names if hub.user(n)["servers"]]
    if running:
        with ThreadPoolExecutor(len(running)) as pool:
            list(pool.map(hub.stop_server, running))


def plain_starts(work: Path, prefix: str, n: int, rounds: int) -> list[float]:
    """Seconds from the first POST to the last of ``n`` plain DockerSpawner servers
    ready, ``n`` at once, per round."""
    hub = Hub(work / "plain", prefix=prefix, spawner_class="baseline.PlainDockerSpawner",
              pythonpath=str(HERE), extra_config=PLAIN_CONFIG)
    hub.start()
    walls = []
    try:
        names = [f"plain{i}" for i in range(n)]
        for name in names:
            hub.create_user(name)
        spawn_and_wait(hub, names[0])  # warm-up: page cache, image layers
        stop_all(hub, names[:1])
        for _ in range(rounds):
            begin = time.perf_counter()
            with ThreadPoolExecutor(n) as pool:
                list(pool.map(lambda u: spawn_and_wait(hub, u), names))
            walls.append(time.perf_counter() - begin)
            stop_all(hub, names)
    finally:
        hub.stop()
    return walls


def storm_of_spawns(work: Path, prefix: str, client, rounds: int) -> dict[str, str]:
    hub = gpu_hub(work, prefix, SPAWNS_QUOTAS)
    hub.start()
    names = [f"storm{i}" for i in range(3 * N_GPUS)]
    refusals, walls, double = [], [], 0
    try:
        for name in names:
            hub.create_user(name)
        def post(name: str, begin: float) -> tuple[str, int, float]:
            r = hub.spawn(name, {"profile": "excl"})
            return name, r.status_code, time.perf_counter() - begin

        for round_ in range(rounds):
            begin = time.perf_counter()
            with ThreadPoolExecutor(len(names)) as pool:
                answers = list(pool.map(post, names, [begin] * len(names)))
            started = [n for n, code, _ in answers if code in (201, 202)]
            refusals += [at for _, code, at in answers if code == 503]
            for name in started:
                hub.wait_ready(name)
            walls.append(time.perf_counter() - begin)
            held = [g for label in running_gpus(client, prefix).values()
                    for g in label.split(",")]
            ok = len(started) == N_GPUS and sorted(held) == sorted(hub.gpus)
            double += not ok
            print(f"  round {round_}: {len(started)} started, "
                  f"{sum(code == 503 for _, code, _ in answers)} refused, "
                  f"GPUs held {sorted(held)}{'' if ok else '  VIOLATED'}", flush=True)
            stop_all(hub, names)
    finally:
        hub.stop()
    plain = plain_starts(work, prefix + "p", N_GPUS, rounds)
    ratio = statistics.median(walls) / statistics.median(plain)
    return {"rounds with a GPU held twice": f"{double} of {rounds}",
            "refusals answered in": summary(refusals),
            f"{N_GPUS} of {len(names)} ready, from 1st POST": summary(walls),
            f"{N_GPUS} plain starts at once": summary(plain),
            "storm / plain (medians)": f"{ratio:.2f}x"}


def storm_of_priorities(work: Path, prefix: str, client, rounds: int,
                        seed: int) -> dict[str, str]:
    hub = gpu_hub(work, prefix, PRIORITY_QUOTAS)
    hub.start()
    rng = random.Random(seed)
    ready_times, refused_times, unanswered = [], [], 0
    try:
        with Sampler(client, prefix) as sampler:
            for round_ in range(rounds):
                names = [f"s{round_}u{i}" for i in range(7)]
                roles = {n: rng.choice(["low", "mid", "high"]) for n in names}
                for name in names:
                    hub.create_user(name)
                starts = {}
                for name in names:
                    starts[name] = spawn_in_background(hub, name, {"profile": roles[name]})
                    starts[name]["asked"] = time.monotonic()
                    time.sleep(rng.uniform(0, 1.0))
                for start in starts.values():
                    start["thread"].join(BOUND)
                    unanswered += start["thread"].is_alive()
                for name, start in starts.items():
                    outcome = spawn_outcome(hub, name, timeout=BOUND)
                    took = time.monotonic() - start["asked"]
                    (ready_times if outcome == "ready" else refused_times).append(took)
                print(f"  round {round_}: "
                      + ", ".join(f"{n} {roles[n]}" for n in names), flush=True)
                stop_all(hub, names)
        evs = hub.events()
        log = hub.log()
    finally:
        hub.stop()
    preemptions = [e for e in evs if e["event"] == "preemption"]
    per_start: dict[str, int] = {}
    wrong = 0
    for e in preemptions:
        per_start[e["for_container"]] = per_start.get(e["for_container"], 0) + 1
        ended = any(x["event"] in ("preempted", "preemption-withdrawn")
                    and x["container"] == e["container"] and x["time"] >= e["time"]
                    for x in evs)
        wrong += not (e["by_priority"] > e["priority"] and len(e["for_gpus"]) == 1
                      and e["for_gpus"][0] in e["gpus"] and ended)
    wrong += sum(n != 1 for n in per_start.values())
    plain = plain_starts(work, prefix + "p", 1, 3)
    ratio = statistics.median(ready_times) / statistics.median(plain) if ready_times else 0
    return {"samples with a GPU held twice": f"{len(sampler.twice)} of {sampler.samples}"
                                             + ("  VIOLATED" if sampler.twice else ""),
            "'double-booked' in the hub log": "yes  VIOLATED" if "double-booked" in log
                                              else "no",
            "preemptions (1 victim, its GPU)": f"{len(preemptions)}, {wrong} wrong",
            "queue timeouts": str(sum(e["event"] == "queue-timeout" for e in evs)),
            "queued starts served": str(sum(e["event"] == "queue-granted" for e in evs)),
            "starts unanswered in time": str(unanswered),
            "ready starts, from the POST": summary(ready_times),
            "refused starts, from the POST": summary(refused_times),
            "plain DockerSpawner start": summary(plain),
            "ready / plain start (medians)": f"{ratio:.2f}x"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spawns", action="store_true", help="only the storm of spawns")
    parser.add_argument("--priorities", action="store_true",
                        help="only the storm of priorities")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each (default 3)")
    parser.add_argument("--seed", type=int, default=12, help="the priorities' seed")
    args = parser.parse_args()
    both = not (args.spawns or args.priorities)
    client = ensure_engine()
    prefix = f"qsbench-storm{os.getpid()}"
    work = Path(tempfile.mkdtemp(prefix="storm-bench-"))
    parts = []
    if both or args.spawns:
        parts.append(("storm of spawns", lambda: storm_of_spawns(
            work, prefix + "s", client, args.rounds)))
    if both or args.priorities:
        parts.append(("storm of priorities", lambda: storm_of_priorities(
            work, prefix + "q", client, args.rounds, args.seed)))
    try:
        run_parts("storm_bench", parts)
    finally:
        for hub_prefix in ("s", "sp", "q", "qp"):  # each part's hubs, QuotaSpawner and plain
            cleanup(client, prefix + hub_prefix)


if __name__ == "__main__":
    main()
