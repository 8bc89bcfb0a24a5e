"""The baseline for bench/, and what the benchmarks share: the spawn measurement,
the quantile and the closing summary.

Plain DockerSpawner runs on the same network as QuotaSpawner: the shipped
config's user-defined bridge (``quota-spawner``), which stock DockerSpawner
supports as it is. It keeps the minimal host-network support of
QuotaSpawner (spawner.docker.network.HostNetworkMixin), for a run with
QUOTA_SPAWNER_NETWORK=host, and nothing else: no readiness wait, no quota
table, no GPUs, no checks before create. Hubs load it as
``baseline.PlainDockerSpawner``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from dockerspawner import DockerSpawner

from spawner.docker.network import HostNetworkMixin

# Hub config for the baseline: the same image and limits the bench roles use.
PLAIN_CONFIG = """
c.DockerSpawner.image = "quota-spawner/pytorch:latest"
c.DockerSpawner.cmd = ["jupyterhub-singleuser"]
c.DockerSpawner.mem_limit = "1G"
c.DockerSpawner.cpu_limit = 1.0
c.DockerSpawner.network_name = c.QuotaSpawner.network_name  # the shipped config's network
c.DockerSpawner.http_timeout = 120  # as generous as QuotaSpawner's wait
c.DockerSpawner.start_timeout = 300
"""
# Hub config for QuotaSpawner in the spawn benchmarks: the same generous waits.
QUOTA_CONFIG = """
c.QuotaSpawner.http_timeout = 120
c.QuotaSpawner.start_timeout = 300
"""
# Plain DockerSpawner admits everything. The quota hub's host admission queues the starts
# beyond the host's CPUs x cpu_overcommit (8 on 2 cores) until a server stops, which a
# storm or a class round never does: opened up for those, as an admin running such a
# class on such a host would.
OPEN_ADMISSION = "c.QuotaSpawner.cpu_overcommit = 32\nc.QuotaSpawner.memory_overcommit = 4\n"


class PlainDockerSpawner(HostNetworkMixin, DockerSpawner):
    pass


def spawn_and_wait(hub: Any, name: str, options: dict | None = None) -> float:
    """Seconds from the start request to the hub reporting the server ready."""
    start = time.perf_counter()
    r = hub.spawn(name, options if options is not None else {})
    assert r.status_code in (201, 202), f"{r.status_code} {r.text}"
    while True:
        server = hub.user(name)["servers"].get("")
        if server and server["ready"]:
            return time.perf_counter() - start
        assert server, f"{name}'s spawn failed:\n{hub.log()[-2000:]}"
        time.sleep(0.02)


def pct(values: list[float], q: float) -> float:
    """The q-quantile, nearest rank (no interpolation)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run_parts(bench: str, parts: list[tuple[str, Callable[[], dict[str, str]]]],
              note: Callable[[], str] = lambda: "") -> None:
    """Run each (name, part) in turn, then print what each part returned, one line a key."""
    begin = time.perf_counter()
    summary = [(name, run()) for name, run in parts]
    print(f"\n== summary ({bench}, {time.perf_counter() - begin:.0f}s{note()})")
    for name, result in summary:
        print(f"  {name}:")
        for key, value in result.items():
            print(f"    {key:<34} {value}")
