"""End to end: the usage ledger from real spawns, stops, culls, OOM kills and crashes.

Real hub, proxy, engine, containers and culler; the watchdog runs as its own
process and folds its samples into the ledger. Only NVML is FAKE (on the
host for the watchdog, mounted into the containers for the GPU monitor).
"""

from __future__ import annotations

import os
import re
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from gpu_hours import midday_zone, seed
from hubs import ONE_GPU, ONE_GPU_HUB_ID, ONE_GPU_PREFIX, on_hub
from sqlalchemy import select

from harness import (
    ARTIFACTS,
    Hub,
    WatchdogProcess,
    container_for,
    install_fake_nvml,
    wait_for,
    write_fake_nvml_state,
)
from spawner.usage.ledger import STARTUP_WINDOW, Ledger
from spawner.usage.schema import session_groups, sessions

pytestmark = pytest.mark.e2e

# the shared one-GPU hub's (tests/hubs.py): its culler checks every second and tells the
# ledger why, the budgets are checked every second
PREFIX, HUB_ID, GPU = ONE_GPU_PREFIX, ONE_GPU_HUB_ID, ONE_GPU
G = 2**30
M = 2**20
IDLE = 6  # the idle role's idle_timeout, seconds
MAX_AGE = 8  # the aged role's max_age, seconds
QUOTAS = f"""\
images:
  pytorch: {{image: "quota-spawner/pytorch:latest"}}
roles:
  small: {{cpus: 0.5, memory: 512M, images: [pytorch]}}
  idle: {{cpus: 0.5, memory: 512M, images: [pytorch], idle_timeout: {IDLE}s}}
  aged: {{cpus: 0.5, memory: 512M, images: [pytorch], idle_timeout: 10m, max_age: {MAX_AGE}s}}
  gpu: {{cpus: 1, memory: 768M, images: [pytorch], gpus: 1, queue_timeout: 0}}
assignments:
  default: [small, idle, aged, gpu]
"""


@pytest.fixture(scope="module")
def setup(one_gpu_hub, tmp_path_factory):
    """The session's one-GPU hub with this module's table, and a watchdog beside it that
    folds its samples into the hub's ledger."""
    work = tmp_path_factory.mktemp("usage")
    host_fake = install_fake_nvml(work)
    write_fake_nvml_state(host_fake, {"gpus": [
        {"uuid": GPU, "name": "Fake GPU", "memory": 16 * G, "utilization": 0}]})
    with on_hub(one_gpu_hub, QUOTAS) as hub:
        url = f"sqlite:///{hub.workdir / 'quota-spawner-usage.sqlite'}"
        watchdog = WatchdogProcess(work, host_fake, "", env={
            "QUOTA_SPAWNER_HUB_ID": HUB_ID, "QUOTA_SPAWNER_USAGE_DB": url})
        try:
            watchdog.start()
            yield hub, watchdog, url, host_fake
        finally:
            watchdog.stop()
            ARTIFACTS.mkdir(exist_ok=True)
            (ARTIFACTS / "watchdog-usage.log").write_text(watchdog.log())


def rows(url: str, user: str) -> list[dict[str, Any]]:
    ledger = Ledger(url, create=False)
    try:
        with ledger.engine.connect() as db:
            found = [dict(r._mapping) for r in db.execute(
                select(sessions).where(sessions.c.user_name == user).order_by(sessions.c.id))]
            for row in found:
                row["groups"] = sorted(db.execute(select(session_groups.c.group_name).where(
                    session_groups.c.session_id == row["id"])).scalars())
        return found
    finally:
        ledger.dispose()


def closed(url: str, user: str, count: int = 1, timeout: float = 60) -> list[dict[str, Any]]:
    """``user``'s sessions, once ``count`` of them are closed."""
    deadline = time.monotonic() + timeout
    while True:
        found = rows(url, user)
        if sum(r["stopped"] is not None for r in found) >= count or time.monotonic() > deadline:
            return found
        time.sleep(0.5)


def test_sessions_end_with_why_they_ended(setup, docker_client):
    hub, watchdog, url, _ = setup
    roles = {"use-stop": "small", "use-idle": "idle", "use-aged": "aged", "use-oom": "small"}
    for name in roles:
        hub.create_user(name, ["usage-class"] if name == "use-stop" else [])
    began = time.time()
    with ThreadPoolExecutor(len(roles)) as pool:
        list(pool.map(lambda n: hub.start_server(n, {"profile": roles[n]}), roles))
    ready = time.time()

    # killed for memory: the notebook server is made the OOM killer's first choice
    # (raising one's own oom_score_adj needs no privilege), then memory runs out and
    # the kernel kills it, which ends the container as an OOM kill
    c = container_for(docker_client, "use-oom")
    code, out = c.exec_run(["python3", "-c", (
        "import os\n"
        "for p in os.listdir('/proc'):\n"
        "    if p.isdigit() and int(p) != os.getpid():\n"
        "        try:\n"
        "            if b'jupyter' in open(f'/proc/{p}/cmdline', 'rb').read():\n"
        "                open(f'/proc/{p}/oom_score_adj', 'w').write('1000')\n"
        "        except OSError: pass\n")], user="1000")
    assert code == 0, out
    for _ in range(4):  # each smaller than the server's score: the server is the one killed
        c.exec_run(["python3", "-c", "import time; b = bytearray(150 * 2**20); "
                    "b[::4096] = b'x' * len(b[::4096]); time.sleep(120)"],
                   user="1000", detach=True)
    hub.stop_server("use-stop")

    stop = closed(url, "use-stop")[0]
    assert stop["reason"] == "stopped", stop
    assert (stop["role"], stop["image"], stop["cpu_limit"], stop["mem_limit"]) == \
        ("small", "pytorch", 0.5, 512 * M)
    assert stop["groups"] == ["usage-class"] and stop["hub"] == HUB_ID
    assert stop["container"] == f"{PREFIX}-use-2dstop" and stop["container_id"]  # escaped
    assert began <= stop["requested"] <= stop["started"] <= stop["ready"] <= ready
    assert stop["ready"] <= stop["stopped"] <= time.time()
    assert stop["gpu_count"] == 0 and stop["gpus"] == "" and stop["gpu_reserved"] == 0

    oom = closed(url, "use-oom", timeout=60)[0]
    assert oom["reason"] == "oom", (oom, hub.log()[-3000:])
    assert "killed for memory" in oom["detail"]
    idle = closed(url, "use-idle", timeout=90)[0]
    assert idle["reason"] == "culled", idle
    assert idle["stopped"] - idle["requested"] >= IDLE
    aged = closed(url, "use-aged", timeout=90)[0]
    assert aged["reason"] == "max-age", aged
    assert aged["stopped"] - aged["requested"] >= MAX_AGE
    # every server's samples were folded while it ran: CPU and memory from its cgroup
    for row in (stop, idle, aged):
        assert row["mem_samples"] > 0 and 0 < row["mem_peak"] <= 512 * M, row
        assert row["mem_sum"] / row["mem_samples"] <= row["mem_peak"]
        assert row["cpu_samples"] > 0 and row["cpu_sum"] >= 0, row
        # the CPU peak leaves out the first minute after ready (the server's own start)
        if row["stopped"] - row["ready"] < STARTUP_WINDOW:
            assert row["cpu_peak"] is None, row
        else:
            assert row["cpu_peak"] is not None, row
        assert row["gpu_samples"] == 0 and row["gpu_util_peak"] is None


def test_a_gpu_session_gets_its_gpu_samples_and_a_refused_start_is_a_failed_session(
        setup, docker_client):
    hub, watchdog, url, host_fake = setup
    hub.create_user("use-gpu")
    hub.create_user("use-late")
    hub.start_server("use-gpu", {"profile": "gpu"})
    pid = container_for(docker_client, "use-gpu").attrs["State"]["Pid"]
    write_fake_nvml_state(host_fake, {"gpus": [
        {"uuid": GPU, "name": "Fake GPU", "memory": 16 * G, "utilization": 60, "used": 3 * G,
         "processes": [[pid, 3 * G]]}]})
    # the one GPU is held, and the role does not queue: refused at once, recorded as failed
    r = hub.spawn("use-late", {"profile": "gpu"})
    assert r.status_code in (201, 202, 503), r.text
    hub.wait_stopped("use-late", timeout=60)
    late = closed(url, "use-late")[0]
    assert late["reason"] == "failed" and "GPU" in late["detail"], late
    assert late["started"] is None and late["gpu_count"] == 0

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        (row,) = rows(url, "use-gpu")
        if row["gpu_util_peak"] == pytest.approx(0.6):
            break
        time.sleep(0.5)
    hub.stop_server("use-gpu")
    (row,) = closed(url, "use-gpu")
    assert row["reason"] == "stopped"
    assert (row["gpus"], row["gpu_count"], row["gpu_mode"], row["gpu_reserved"]) == \
        (GPU, 1, "exclusive", 1.0)
    assert row["gpu_mem_limit"] == 16 * G
    assert row["gpu_util_peak"] == pytest.approx(0.6), (row, watchdog.log()[-2000:])
    assert row["gpu_mem_peak"] == 3 * G and row["gpu_samples"] > 0
    assert 0 < row["gpu_util_sum"] / row["gpu_samples"] <= 0.6 + 1e-9


def crash(hub: Hub) -> None:
    """SIGKILL the hub and the processes it started (its proxy, the culler), as a crash
    of the machine's hub side would; its notebook containers keep running."""
    children = [int(p) for p in os.listdir("/proc") if p.isdigit()
                and _parent(int(p)) == hub.proc.pid]
    os.kill(hub.proc.pid, signal.SIGKILL)
    hub.proc.wait()
    for pid in children:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def test_crashes_lose_no_finished_session(setup, docker_client):
    """The watchdog killed, then the hub killed while a server runs and its container
    removed while the hub is down: the finished sessions are all there, and the cut-off
    one is closed as lost when its container died."""
    hub, watchdog, url, host_fake = setup
    write_fake_nvml_state(host_fake, {"gpus": [
        {"uuid": GPU, "name": "Fake GPU", "memory": 16 * G, "utilization": 0}]})
    names = ("crash-done", "crash-cut", "crash-kept")
    for name in names:
        hub.create_user(name)
    hub.start_servers({name: {"profile": "small"} for name in names})
    time.sleep(3)  # a few samples each
    hub.stop_server("crash-done")
    before = closed(url, "crash-done")[0]
    assert before["reason"] == "stopped"

    watchdog.proc.send_signal(signal.SIGKILL)
    watchdog.proc.wait()
    cut_seen = rows(url, "crash-cut")[0]["last_seen"]
    assert cut_seen is not None
    crash(hub)
    container_for(docker_client, "crash-cut").remove(force=True)
    removed = time.time()
    hub.start()
    watchdog.start()

    assert rows(url, "crash-done") == [before]  # untouched by both crashes
    cut = closed(url, "crash-cut", timeout=60)[0]
    assert cut["reason"] == "lost", (cut, hub.log()[-3000:])
    # what is known: the engine's record of when the container died
    assert cut_seen <= cut["stopped"] <= removed + 1, (cut, cut_seen, removed)
    assert "exit code 137" in cut["detail"]
    kept = rows(url, "crash-kept")[0]
    assert kept["stopped"] is None  # still running, and still sampled
    samples = kept["mem_samples"]
    deadline = time.monotonic() + 20
    while rows(url, "crash-kept")[0]["mem_samples"] <= samples:
        assert time.monotonic() < deadline, watchdog.log()[-2000:]
        time.sleep(0.5)
    hub.stop_server("crash-kept")
    assert closed(url, "crash-kept")[0]["reason"] == "stopped"


def hub_events(hub: Hub, event: str, user: str) -> list[dict[str, Any]]:
    return [e for e in hub.events() if e["event"] == event and e.get("user") == user]


def test_a_gpu_hour_budget_warns_stops_and_refuses(setup, docker_client):
    """bud-a's budget: 1 GPU-hour a day, stop: true. Seeded at 0.899 h, a running GPU
    server passes 90% within seconds (warned once), is stopped when more hours land
    (the budget is spent), and the next GPU start is refused with the sentence; a
    CPU role still starts."""
    hub, watchdog, url, _ = setup
    table = hub.quota_file.read_text()
    hub.quota_file.write_text(table + f"""budgets:
  timezone: {midday_zone()}
  users:
    bud-a: {{gpu_hours: 1, per: day, stop: true}}
""")
    try:
        hub.create_user("bud-a")
        seed(url, "bud-a", 0.899)
        hub.start_server("bud-a", {"profile": "gpu"})  # 0.899 of 1: allowed
        warned = wait_for(lambda: hub_events(hub, "budget-warning", "bud-a"), 30,
                          f"no budget warning:\n{hub.log()[-3000:]}")
        assert warned[0]["budget_kind"] == "user" and warned[0]["budget_name"] == "bud-a"
        assert "is 90% used" in warned[0]["text"] and "stopped" in warned[0]["text"]
        assert (hub.user("bud-a")["servers"]), "a warning must not stop the server"

        seed(url, "bud-a", 0.2)  # spent: stop: true stops the running server
        hub.wait_stopped("bud-a", timeout=60)
        (spent,) = wait_for(lambda: hub_events(hub, "budget-spent", "bud-a"), 10, "no spent")
        assert spent["stopping"] is True
        assert len(hub_events(hub, "budget-warning", "bud-a")) == 1  # told once
        gpu = [r for r in closed(url, "bud-a", count=3) if not r["container"].startswith("seed")]
        assert gpu[0]["reason"] == "budget", gpu

        r = hub.spawn("bud-a", {"profile": "gpu"})
        assert r.status_code == 403, r.text
        message = r.json()["message"]
        # 0.899 + 0.2 seeded, and what the stopped server reserved: 1.1 or a bit more
        assert re.fullmatch(
            r"Your GPU-hour budget is spent: 1\.[12] of 1 GPU-hours used today\. Budgets count "
            r"the time GPUs were reserved, busy or not\. It resets on \d+ \w+ \d{4} at "
            r"00:00 \S+\. Roles without GPUs can still be started\.", message), message
        assert not hub.user("bud-a")["servers"]
        assert len(rows(url, "bud-a")) == 3  # the refusal opened no session
        hub.start_server("bud-a", {"profile": "small"})  # a CPU role is never refused
        hub.stop_server("bud-a")
    finally:
        hub.quota_file.write_text(table)
