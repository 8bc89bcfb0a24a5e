"""A class starting at once: N students (``--students``, default 24) of a 0.5-CPU, 1 GiB
role asking at the same moment, QuotaSpawner against plain DockerSpawner with the same
image and limits, in one run, rounds alternating (plain, then quota, ``--rounds``).

Two real hubs (the shipped config; plain is ``baseline.PlainDockerSpawner``), their
proxies and the test engine. Per round and spawner:

- each student's wait: from the start request (POST .../server, all at once) to the
  server answering through the proxy (``GET /user/<name>/api``: 200);
- the CPU seconds one start costs: the hub process's (its /proc stat, from the first
  request to the last server answering), the engine's (dockerd's /proc stat, the same
  span), and each container's own until it answered (its cgroup's ``cpu.stat``
  ``usage_usec``, read as soon as it answered), summed and divided by N;
- the class's stop: every server asked to stop by the class dashboard's own code
  ("stop the class": ``HubApi.stop_servers``, STOPS_AT_ONCE requests at a time), until the
  hub reports none.

It prints each round, then the p95 of the waits for each, their ratio (quota / plain),
the CPU seconds per start and the stop times.

    .venv/bin/python bench/class_start_bench.py                       # 24 students, 3 rounds
    .venv/bin/python bench/class_start_bench.py --students 4 --rounds 1  # a smoke run

Containers and volumes are named qsbench-class<pid>-… and removed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import requests

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from baseline import OPEN_ADMISSION, PLAIN_CONFIG, QUOTA_CONFIG, pct  # noqa: E402

from harness import TEST_DOCKER_HOST, Hub, cleanup, ensure_engine  # noqa: E402
from spawner.webapp.hub_api import HubApi  # noqa: E402

IMAGE = "quota-spawner/pytorch:latest"
CLASS_QUOTAS = f"""\
images:
  pytorch: {{image: "{IMAGE}"}}
roles:
  student: {{cpus: 0.5, memory: 1G, images: [pytorch]}}
assignments:
  default: [student]
"""
PLAIN_ROLE = 'c.DockerSpawner.cpu_limit = 0.5\nc.DockerSpawner.mem_limit = "1G"\n'
TICKS = os.sysconf("SC_CLK_TCK")
ANSWER_TIMEOUT = 600.0
# Until a server's route is in the proxy, a request for it is answered by the hub (a
# redirect). Each student's poll every 0.05 s made that most of the hub's CPU during a
# round (a profile: 8,000 redirects for 24 starts), more the longer the wait; every
# 0.25 s it is a fifth of that, and a wait of about 25 s is measured to within 1%.
POLL_INTERVAL = 0.25


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def engine_pid() -> int | None:
    """The pid of the bench's dockerd: the one whose command line names the socket the
    bench speaks to (harness.TEST_DOCKER_HOST); None when there is none here."""
    socket = TEST_DOCKER_HOST.removeprefix("unix://")
    for proc in Path("/proc").iterdir():
        try:
            args = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if proc.name.isdigit() and args and args[0].endswith(b"dockerd") \
                and any(socket.encode() in a for a in args):
            return int(proc.name)
    return None


def container_cpu(client, name: str) -> float | None:
    """CPU seconds the container has used: its cgroup's ``cpu.stat`` ``usage_usec``
    (cgroup v2; on a hybrid host the unified hierarchy's), else v1's ``cpuacct.usage``."""
    try:
        pid = client.api.inspect_container(name)["State"]["Pid"]
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except Exception:
        return None  # gone already
    paths = {controllers: path for _, controllers, path in
             (line.split(":", 2) for line in lines)}
    unified = paths.get("")
    for root in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
        stat = Path(f"{root}{unified}/cpu.stat")
        if unified is not None and stat.exists():
            usage = dict(entry.split() for entry in stat.read_text().splitlines())
            return int(usage["usage_usec"]) / 1e6
    v1 = next((path for controllers, path in paths.items()
               if "cpuacct" in controllers.split(",")), None)
    usage_file = Path(f"/sys/fs/cgroup/cpuacct{v1}/cpuacct.usage")
    if v1 is not None and usage_file.exists():
        return int(usage_file.read_text()) / 1e9
    return None  # not readable here (another machine's engine)


@dataclass
class Round:
    waits: list[float] = field(default_factory=list)
    hub_cpu: float = 0.0
    engine_cpu: float | None = None
    container_cpu: list[float] = field(default_factory=list)
    stop: float = 0.0

    def cpu_per_start(self) -> str:
        parts = [f"hub {self.hub_cpu / len(self.waits):.2f}"]
        if self.engine_cpu is not None:
            parts.append(f"engine {self.engine_cpu / len(self.waits):.2f}")
        if self.container_cpu:
            parts.append(f"container {statistics.mean(self.container_cpu):.2f}")
        total = (self.hub_cpu + (self.engine_cpu or 0)) / len(self.waits) + (
            statistics.mean(self.container_cpu) if self.container_cpu else 0)
        return f"{total:.2f} s ({', '.join(parts)})"


def wait_answering(hub: Hub, name: str, asked: float, client, found: Round) -> None:
    session = requests.Session()
    session.headers["Authorization"] = f"token {hub.token}"
    url = f"{hub.url}/user/{name}/api"
    deadline = asked + ANSWER_TIMEOUT
    while time.monotonic() < deadline:
        try:
            if session.get(url, timeout=5, allow_redirects=False).status_code == 200:
                found.waits.append(time.monotonic() - asked)
                cpu = container_cpu(client, f"{hub.prefix}-{name}")
                if cpu is not None:
                    found.container_cpu.append(cpu)
                return
        except requests.RequestException:
            pass
        time.sleep(POLL_INTERVAL)
    raise RuntimeError(f"{name}'s server did not answer in {ANSWER_TIMEOUT:.0f} s")


def stop_class(hub: Hub, names: list[str]) -> None:
    """The class stopped by the class dashboard's own code (``HubApi.stop_servers``:
    STOPS_AT_ONCE requests to the hub's API at a time, each answering when its server has
    stopped or after the hub's slow-stop wait), then until the hub reports none running."""
    results = asyncio.run(HubApi(f"{hub.url}/hub/api", hub.token).stop_servers(hub.token, names))
    failed = [r for r in results if r["outcome"] not in ("stopped", "stopping")]
    assert not failed, failed
    for name in names:
        hub.wait_stopped(name, timeout=300)


def class_round(hub: Hub, names: list[str], options: dict | None, client,
                dockerd: int | None) -> Round:
    found = Round()
    hub_before = process_cpu(hub.proc.pid)
    engine_before = process_cpu(dockerd) if dockerd else None

    def one(name: str) -> None:
        asked = time.monotonic()
        r = hub.spawn(name, options)
        assert r.status_code in (201, 202), f"{name}: {r.status_code} {r.text}"
        wait_answering(hub, name, asked, client, found)

    with ThreadPoolExecutor(len(names)) as pool:
        list(pool.map(one, names))
    found.hub_cpu = process_cpu(hub.proc.pid) - hub_before
    if dockerd:
        found.engine_cpu = process_cpu(dockerd) - (engine_before or 0)
    begin = time.monotonic()
    stop_class(hub, names)
    found.stop = time.monotonic() - begin
    return found


def describe(rounds: list[Round]) -> str:
    waits = [w for r in rounds for w in r.waits]
    return (f"p95 {pct(waits, 0.95):.2f} s, median {statistics.median(waits):.2f} s; "
            f"stop of the class {statistics.median(r.stop for r in rounds):.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--students", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    client = ensure_engine()
    dockerd = engine_pid()
    prefix = f"qsbench-class{os.getpid()}"
    names = [f"student{i}" for i in range(args.students)]
    work = Path(tempfile.mkdtemp(prefix="class-bench-"))
    plain = Hub(work / "plain", prefix=f"{prefix}-p", spawner_class="baseline.PlainDockerSpawner",
                pythonpath=str(HERE), extra_config=PLAIN_CONFIG + PLAIN_ROLE)
    quota = Hub(work / "quota", quota_text=CLASS_QUOTAS, prefix=f"{prefix}-q",
                extra_config=QUOTA_CONFIG + OPEN_ADMISSION)
    results: dict[str, list[Round]] = {"plain": [], "quota": []}
    try:
        for hub in (plain, quota):
            hub.start()
            for name in names:
                hub.create_user(name)
        for hub, options in ((plain, {}), (quota, {"profile": "student", "image": "pytorch"})):
            # warm-up: image layers and page cache, not charged to either
            class_round(hub, names[:1], options, client, None)
        print(f"{args.students} students at once, {args.rounds} rounds, engine pid {dockerd}")
        for i in range(args.rounds):
            for kind, hub, options in (("plain", plain, {}),
                                       ("quota", quota, {"profile": "student",
                                                         "image": "pytorch"})):
                found = class_round(hub, names, options, client, dockerd)
                results[kind].append(found)
                print(f"  round {i + 1} {kind:<5} p95 {pct(found.waits, 0.95):.2f} s, "
                      f"CPU per start {found.cpu_per_start()}, stop {found.stop:.2f} s",
                      flush=True)
    finally:
        for hub in (plain, quota):
            hub.stop()
        for hub in (plain, quota):
            cleanup(client, hub.prefix)
    p95 = {k: pct([w for r in v for w in r.waits], 0.95) for k, v in results.items()}
    print("\n== summary (class start)")
    for kind, rounds in results.items():
        print(f"  {kind:<5} {describe(rounds)}")
        for r in rounds:
            print(f"        CPU per start {r.cpu_per_start()}")
    print(f"  p95 ratio quota/plain: {p95['quota'] / p95['plain']:.2f}")


if __name__ == "__main__":
    main()
