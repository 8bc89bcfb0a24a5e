"""End to end: the notebooks' parent cgroup keeps the kernel's OOM killer off the hub and
the proxy (spawner/docker/parent_cgroup.py, docs/deployment.md#the-notebooks-cgroup).

This module's hub counts 2 GiB of memory and keeps 1 GiB back, so its notebooks' parent
cgroup may hold 1 GiB; with ``memory_overcommit`` 2 it admits 2 GiB of limits. Two
servers of 768 MiB each then allocate 600 MiB at once: each stays within its own limit,
but together they pass the parent's, and the kernel OOM-kills inside a notebook
container. The hub, directly and through the proxy, is asked every 50 ms throughout,
and must answer every time; the latencies are printed and kept in test-artifacts/.
Without the fence nothing would be killed on this host: the test fails if the parent
cgroup does not act.
"""

from __future__ import annotations

import json
import re
import statistics
import threading
import time
from pathlib import Path

import pytest
import requests
from hubs import own_hub

from harness import ARTIFACTS, Hub, container_for, exec_text

pytestmark = pytest.mark.e2e
PREFIX = "qsfence"
GiB = 2**30

QUOTAS = """\
images:
  pytorch: {image: "quota-spawner/pytorch:latest"}
roles:
  hog: {cpus: 0.25, memory: 768M, images: [pytorch]}
assignments:
  default: [hog]
"""
HOST = """
c.QuotaSpawner.host_memory = "2G"
c.QuotaSpawner.host_reserve_memory = "1G"
c.QuotaSpawner.memory_overcommit = 2
"""
USERS = ("ann", "ben")
ALLOCATE = ("import time; x = b'1' * (600 << 20); print('allocated', flush=True); "
            "time.sleep(8)")
CGROUP = Path("/sys/fs/cgroup")


@pytest.fixture(scope="module")
def fenced(docker_client, tmp_path_factory):
    yield from own_hub(tmp_path_factory.mktemp(PREFIX), docker_client, "host-fence",
                       quota_text=QUOTAS, prefix=PREFIX, extra_config=HOST, users=USERS)


def fence_of(hub: Hub) -> tuple[str, str]:
    """(the parent cgroup, what the hub said) from the hub's log line."""
    match = re.search(r"Notebooks' memory fenced: (the notebooks together may use (.+?) of "
                      r"memory, in the cgroup (\S+) \((.+?)\);.*)", hub.log())
    assert match, hub.log()[-3000:]
    return match.group(3), match.group(1)


def memory_folder(docker_client, parent: str) -> Path:
    info = docker_client.info()
    if str(info.get("CgroupVersion")) == "2":
        return CGROUP / parent.strip("/")
    return CGROUP / "memory" / parent.strip("/")


def limit_of(folder: Path) -> int:
    name = "memory.max" if (folder / "memory.max").exists() else "memory.limit_in_bytes"
    return int((folder / name).read_text())


def oom_kills(folder: Path) -> int:
    """The OOM kills counted in a memory cgroup (v1: memory.oom_control; v2: memory.events)."""
    for name in ("memory.events", "memory.oom_control"):
        path = folder / name
        if path.exists():
            for line in path.read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
    return 0


def memory_cgroup_of(pid: int) -> str:
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(",") or controllers == "":
            return path
    return ""


class Pinger(threading.Thread):
    """Asks ``url`` every 50 ms until stopped: the latencies, and every failure."""

    def __init__(self, url: str, headers: dict[str, str]):
        super().__init__(daemon=True)
        self.url, self.headers = url, headers
        self.latencies: list[float] = []
        self.failures: list[str] = []
        self.done = threading.Event()

    def run(self) -> None:
        session = requests.Session()
        while not self.done.is_set():
            started = time.monotonic()
            try:
                r = session.get(self.url, headers=self.headers, timeout=10)
                if r.status_code != 200:
                    self.failures.append(f"{r.status_code} {r.text[:200]}")
            except requests.RequestException as e:
                self.failures.append(repr(e))
            self.latencies.append(time.monotonic() - started)
            self.done.wait(0.05)

    def summary(self) -> dict[str, float]:
        ordered = sorted(self.latencies)
        return {"requests": len(ordered), "failures": len(self.failures),
                "p50_ms": round(statistics.median(ordered) * 1000, 1),
                "p99_ms": round(ordered[int(len(ordered) * 0.99) - 1] * 1000, 1),
                "max_ms": round(ordered[-1] * 1000, 1)}


def test_the_hub_fences_its_notebooks_memory(fenced, docker_client):
    parent, said = fence_of(fenced)
    assert said.startswith("the notebooks together may use 1 GiB of memory")
    assert "never on the hub or the proxy" in said
    fenced.start_servers({"ann": {"profile": "hog"}})
    container = container_for(docker_client, "ann")
    assert container.attrs["HostConfig"]["CgroupParent"] == parent
    folder = memory_folder(docker_client, parent)
    assert limit_of(folder) == GiB
    assert (folder / container.id).is_dir() or any(folder.glob(f"*{container.id}*"))
    fenced.stop_servers(["ann"])


def test_notebooks_past_the_share_are_oom_killed_inside_it_and_the_hub_keeps_answering(
        fenced, docker_client):
    parent, _ = fence_of(fenced)
    folder = memory_folder(docker_client, parent)
    fenced.start_servers({u: {"profile": "hog"} for u in USERS})
    boxes = [container_for(docker_client, u) for u in USERS]
    # the hub and the proxy are outside the notebooks' cgroup: never the OOM killer's choice
    proxy_pid = int((fenced.workdir / "jupyterhub-proxy.pid").read_text())
    for pid in (fenced.proc.pid, proxy_pid):
        assert not memory_cgroup_of(pid).startswith(parent), memory_cgroup_of(pid)
    before = sum(oom_kills(folder / b.id) for b in boxes)
    # the hub itself, where it listens for its servers (the notebook network's gateway)
    hub_api = re.search(r"Hub API listening on (\S+?)/hub/", fenced.log())
    assert hub_api, fenced.log()[-2000:]
    pingers = {
        "hub": Pinger(f"{hub_api.group(1)}/hub/api/users/ann",
                      {"Authorization": f"token {fenced.token}"}),
        "proxy": Pinger(f"{fenced.url}/hub/api/users/ann",
                        {"Authorization": f"token {fenced.token}"}),
    }
    for p in pingers.values():
        p.start()
    time.sleep(2)  # a baseline before the episode
    results: dict[str, tuple[int, str]] = {}

    def allocate(box) -> None:
        results[box.name] = exec_text(box, f'python -c "{ALLOCATE}"')

    workers = [threading.Thread(target=allocate, args=(b,)) for b in boxes]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    time.sleep(2)
    for p in pingers.values():
        p.done.set()
        p.join(15)
    after = sum(oom_kills(folder / b.id) for b in boxes)
    summary = {name: p.summary() for name, p in pingers.items()}
    summary["oom_kills"] = after - before
    summary["exec"] = {name: code for name, (code, _) in results.items()}
    print("fence episode:", json.dumps(summary))
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "fence-latency.json").write_text(json.dumps(summary, indent=2))
    assert after > before, summary  # the parent's limit acted: a kill inside a notebook
    assert sorted(code for code, _ in results.values()) != [0, 0], results
    for name, p in pingers.items():
        assert not p.failures, (name, p.failures[:5])
        assert summary[name]["max_ms"] < 5000, summary
    # the hub still serves both users, and their records did not change
    assert fenced.user("ann")["name"] == "ann"
