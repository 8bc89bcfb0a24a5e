"""End to end: priorities, preemption with a grace period, and the GPU wait queue.

A real hub, proxy and dockerd with the fake NVIDIA hook and a declared
inventory of fake GPUs (the only fakes, at the GPU boundary). The victim's
kernel is a real ipykernel started through the notebook server's API; it
installs spawner.checkpoint.on_preempt and writes its checkpoint into the
home volume when the hub's SIGTERM arrives.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from pathlib import Path

import pytest
import requests
from tornado.httpclient import HTTPRequest
from tornado.websocket import websocket_connect

from harness import Hub, container_for, containers, exec_text, teardown

pytestmark = pytest.mark.e2e

QUOTAS = """\
images:
  pytorch:
    display_name: PyTorch
    image: quota-spawner/pytorch:latest
roles:
  cpu:
    cpus: 0.5
    memory: 512M
    images: [pytorch]
  train:
    description: long training, preemptible
    cpus: 0.5
    memory: 512M
    gpus: 1
    priority: 300000
    preempts: never
    grace_period: 6s
    min_runtime: 0
    queue_timeout: 60s
    images: [pytorch]
  experiment:
    cpus: 0.5
    memory: 512M
    gpus: 1
    priority: 500000
    preempts: never
    grace_period: 6s
    min_runtime: 0
    queue_timeout: 8s
    images: [pytorch]
  urgent:
    description: urgent debugging
    cpus: 0.5
    memory: 512M
    gpus: 1
    priority: 1000000
    grace_period: 6s
    min_runtime: 0
    queue_timeout: 60s
    images: [pytorch]
  protected:
    cpus: 0.5
    memory: 512M
    gpus: 1
    priority: 100
    preemptible: false
    reclaim_after: 25s
    grace_period: 3s
    min_runtime: 0
    images: [pytorch]
  young:
    cpus: 0.5
    memory: 512M
    gpus: 1
    priority: 100
    min_runtime: 10m
    images: [pytorch]
assignments:
  default: [cpu, train, experiment, urgent, protected, young]
"""

CHECKPOINT_CODE = """
import json, os, time
from spawner.checkpoint import on_preempt
state = {"step": 41}
def save(notice):
    with open("/home/jovyan/ckpt.json.tmp", "w") as f:
        json.dump({"step": state["step"], "by": notice and notice["by"],
                   "pid": os.getpid(), "at": time.time()}, f)
    os.replace("/home/jovyan/ckpt.json.tmp", "/home/jovyan/ckpt.json")
on_preempt(save)
print("armed")
"""


def opt(role: str) -> dict:
    return {"profile": role}


@pytest.fixture(scope="module")
def hub(docker_client, tmp_path_factory):
    prefix = "qspre"
    gpus = [{"uuid": f"GPU-{prefix}-{i}", "name": "Fake GPU", "memory": "16G"}
            for i in range(2)]
    hub = Hub(tmp_path_factory.mktemp(prefix), quota_text=QUOTAS, prefix=prefix,
              extra_config=(f"c.QuotaSpawner.gpu_inventory = {gpus!r}\n"
                            "c.QuotaSpawner.gpu_sync_interval = 1\n"
                            "c.JupyterHub.cleanup_servers = True\n"))
    hub.gpus = [g["uuid"] for g in gpus]
    hub.start()
    yield hub
    teardown(hub, docker_client, "preemption")


@pytest.fixture(autouse=True)
def stop_all(hub):
    yield
    for user in hub.api("GET", "/users").json():
        if user["servers"]:
            hub.api("DELETE", f"/users/{user['name']}/server")
    for user in hub.api("GET", "/users").json():
        if user["servers"]:
            hub.wait_stopped(user["name"], timeout=60)


def events(hub: Hub) -> list[dict]:
    path = Path(hub.workdir) / "quota-spawner-events.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def gpus_of(docker_client, user: str) -> str:
    return container_for(docker_client, user).attrs["Config"]["Labels"]["quota-spawner.gpus"]


def new_users(hub: Hub, *names: str) -> list[str]:
    suffix = uuid.uuid4().hex[:5]
    made = [f"{n}{suffix}" for n in names]
    for name in made:
        hub.create_user(name)
    return made


def wait_for(check, timeout: float, what: str, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def spawn_in_background(hub: Hub, name: str, options: dict) -> dict:
    """POST the start in a thread (a queued start answers only when it is served)."""
    result: dict = {}

    def run() -> None:
        r = hub.spawn(name, options)
        result["status"], result["text"] = r.status_code, r.text
        result["at"] = time.monotonic()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    result["thread"] = thread
    return result


def spawn_outcome(hub: Hub, name: str, timeout: float) -> str:
    """'ready', or the message of a failed start."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        server = hub.user(name)["servers"].get("")
        if server and server["ready"]:
            return "ready"
        if not server and not hub.user(name).get("pending"):
            r = hub.session.get(f"{hub.url}/hub/api/users/{name}/server/progress", timeout=10)
            return r.text if r.status_code == 200 else f"stopped ({r.status_code})"
        time.sleep(0.2)
    raise AssertionError(f"{name}'s start had no answer in {timeout}s")


def progress_messages(hub: Hub, name: str, until: str, timeout: float = 5) -> list[str]:
    """The spawn page's messages (the event stream the page reads), up to one
    that holds ``until``, or for ``timeout`` seconds."""
    found: list[str] = []
    end = time.monotonic() + timeout
    while time.monotonic() < end and not any(until in m for m in found):
        found = []
        try:
            with hub.session.get(f"{hub.url}/hub/api/users/{name}/server/progress",
                                 stream=True, timeout=timeout) as r:
                if r.status_code != 200:  # not pending yet
                    time.sleep(0.2)
                    continue
                for line in r.iter_lines(decode_unicode=True):
                    if line and line.startswith("data:"):
                        found.append(json.loads(line[5:]).get("message", ""))
                    if time.monotonic() > end or any(until in m for m in found):
                        break
        except requests.RequestException:
            pass
    return found


def run_in_kernel(hub: Hub, name: str, code: str, timeout: float = 60) -> str:
    """Start a real kernel in NAME's server and run CODE in it; its stdout."""
    token = hub.user_token(name)
    base = f"{hub.url}/user/{name}/api/kernels"
    r = requests.post(base, json={"name": "python3"},
                      headers={"Authorization": f"token {token}"}, timeout=60)
    assert r.status_code == 201, r.text
    kernel = r.json()["id"]
    ws_url = base.replace("http://", "ws://") + f"/{kernel}/channels"

    async def run() -> str:
        conn = await websocket_connect(
            HTTPRequest(ws_url, headers={"Authorization": f"token {token}"}))
        msg_id = uuid.uuid4().hex
        await conn.write_message(json.dumps({
            "header": {"msg_id": msg_id, "username": name, "session": uuid.uuid4().hex,
                       "msg_type": "execute_request", "version": "5.3"},
            "parent_header": {}, "metadata": {}, "channel": "shell",
            "content": {"code": code, "silent": False, "store_history": False,
                        "user_expressions": {}, "allow_stdin": False,
                        "stop_on_error": True}}))
        out = []
        while True:
            text = await asyncio.wait_for(conn.read_message(), timeout)
            assert text is not None, "the kernel's websocket closed"
            msg = json.loads(text)
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])
            if msg["msg_type"] == "error":
                raise AssertionError("\n".join(msg["content"]["traceback"]))
            if msg["msg_type"] == "execute_reply":
                conn.close()
                return "".join(out)

    return asyncio.run(run())


def home_file(docker_client, hub: Hub, name: str, path: str) -> str:
    """A file in NAME's home volume, read by a throwaway container."""
    volume = f"{hub.prefix}-home-{name}"
    out = docker_client.containers.run(
        "quota-spawner/base:local", ["cat", f"/home/jovyan/{path}"], remove=True,
        volumes={volume: {"bind": "/home/jovyan", "mode": "ro"}}, network_mode="none")
    return out.decode()


def test_urgent_preempts_the_cheapest_victim_and_its_checkpoint_is_kept(hub, docker_client):
    alice, carol, bob = new_users(hub, "alice", "carol", "bob")
    hub.start_server(alice, opt("train"))  # priority 300000: the cheapest victim
    hub.start_server(carol, opt("experiment"))  # 500000
    alice_gpu, carol_gpu = gpus_of(docker_client, alice), gpus_of(docker_client, carol)
    assert {alice_gpu, carol_gpu} == set(hub.gpus)
    assert "armed" in run_in_kernel(hub, alice, CHECKPOINT_CODE)
    victim = container_for(docker_client, alice)

    asked = time.monotonic()
    start = spawn_in_background(hub, bob, opt("urgent"))
    # the victim is told at once: the notice, and its kernel's on_preempt ran
    notice = wait_for(lambda: exec_text(victim, "cat /tmp/quota-spawner/preemption.json")[1]
                      if exec_text(victim, "test -s /tmp/quota-spawner/preemption.json")[0] == 0
                      else None, 10, "the preemption notice")
    notice = json.loads(notice)
    assert notice["by"] == bob and notice["by_role"] == "urgent" and notice["role"] == "train"
    assert notice["gpus"] == [alice_gpu]
    assert 4 <= notice["deadline"] - notice["signalled_at"] <= 7
    checkpoint = json.loads(wait_for(
        lambda: exec_text(victim, "cat /home/jovyan/ckpt.json")[1]
        if exec_text(victim, "test -s /home/jovyan/ckpt.json")[0] == 0 else None,
        10, "the checkpoint written by the kernel's SIGTERM handler"))
    assert checkpoint["step"] == 41 and checkpoint["by"] == bob
    # bob's start page says whom it waits for; nobody else takes the GPU meanwhile
    messages = progress_messages(hub, bob, "server (role")
    assert any(f"Waiting for {alice}'s server (role 'train')" in m for m in messages), messages
    assert hub.user(alice)["servers"], "the victim must run through its grace period"

    hub.wait_ready(bob, timeout=60)
    handed_over = time.monotonic() - asked
    assert gpus_of(docker_client, bob) == alice_gpu  # exactly the GPU freed for it
    assert gpus_of(docker_client, carol) == carol_gpu  # the dearer server is untouched
    hub.wait_stopped(alice, timeout=10)
    assert not containers(docker_client, alice, all=False)
    assert 6 <= handed_over < 6 + 20
    # the checkpoint is in alice's home volume after bob has started
    kept = json.loads(home_file(docker_client, hub, alice, "ckpt.json"))
    assert kept["step"] == 41
    log = hub.log()
    assert f"Preempting {victim.name} (user {alice}, role train, priority 300000" in log
    assert f"for {bob} (role urgent, priority 1000000)" in log
    kinds = [(e["event"], e.get("user")) for e in events(hub)]
    assert ("preemption", alice) in kinds and ("preempted", alice) in kinds
    assert ("queue-granted", bob) in kinds
    start["thread"].join(30)


def test_equal_priority_is_never_preempted_and_never_waits_instead(hub, docker_client):
    """Two urgent servers hold both GPUs: a third urgent start preempts neither
    (equal priority), and an experiment start (preempts: never) times out waiting."""
    u1, u2, u3, e1 = new_users(hub, "urg1", "urg2", "urg3", "exp")
    hub.start_server(u1, opt("urgent"))
    hub.start_server(u2, opt("urgent"))
    t0 = time.monotonic()
    r = hub.spawn(e1, opt("experiment"))  # waits its 8 s queue_timeout, then a 503
    outcome = spawn_outcome(hub, e1, timeout=40) if r.status_code == 202 else r.text
    waited = time.monotonic() - t0
    assert "No GPU became free for the role 'experiment'" in outcome, outcome
    assert 7 <= waited < 30
    third = spawn_in_background(hub, u3, opt("urgent"))
    time.sleep(4)
    assert hub.user(u1)["servers"] and hub.user(u2)["servers"]
    assert not [e for e in events(hub) if e["event"] == "preemption"
                and e.get("user") in (u1, u2)]
    hub.api("DELETE", f"/users/{u3}/server")  # leaves the queue
    third["thread"].join(30)
    wait_for(lambda: any(e["event"] == "queue-left" and e["user"] == u3 for e in events(hub)),
             10, "the queue-left event")


def test_protected_until_reclaim_after_and_young_servers_are_spared(hub, docker_client):
    gina, harry, ivan = new_users(hub, "gina", "harry", "ivan")
    hub.start_server(gina, opt("protected"))  # preemptible: false, reclaim_after 25s
    started = time.monotonic()
    hub.start_server(harry, opt("young"))  # min_runtime 10m
    gina_gpu = gpus_of(docker_client, gina)
    start = spawn_in_background(hub, ivan, opt("urgent"))
    messages = progress_messages(hub, ivan, "reclaim_after")
    assert any("passes its reclaim_after" in m for m in messages), messages
    hub.wait_ready(ivan, timeout=60)
    assert time.monotonic() - started >= 25  # not before gina's reclaim_after
    assert gpus_of(docker_client, ivan) == gina_gpu
    assert hub.user(harry)["servers"]  # the young one was never chosen
    hub.wait_stopped(gina, timeout=10)
    start["thread"].join(30)


def test_queue_by_priority_then_arrival_and_a_freed_gpu_goes_to_the_head(hub, docker_client):
    h1, h2, q_exp1, q_train, q_exp2 = new_users(hub, "hold1", "hold2", "qexpa", "qtrain",
                                                "qexpb")
    hub.start_server(h1, opt("urgent"))
    hub.start_server(h2, opt("urgent"))
    starts = {}
    for name, role in ((q_exp1, "experiment"), (q_train, "train"), (q_exp2, "experiment")):
        starts[name] = spawn_in_background(hub, name, opt(role))
        time.sleep(1.0)  # arrival order
    # experiment (500000) before train (300000), then arrival among experiments
    hub.stop_server(h1)
    hub.wait_ready(q_exp1, timeout=30)
    hub.stop_server(h2)
    hub.wait_ready(q_exp2, timeout=30)
    assert not (hub.user(q_train)["servers"].get("") or {}).get("ready")
    hub.stop_server(q_exp1)
    hub.wait_ready(q_train, timeout=30)
    for s in starts.values():
        s["thread"].join(30)
    order = [e["user"] for e in events(hub) if e["event"] == "queue-granted"
             and e["user"] in starts]
    assert order == [q_exp1, q_exp2, q_train]
