"""End to end: priorities, preemption with a grace period, and the GPU wait queue.

A real hub, proxy and dockerd with the fake NVIDIA hook and a declared
inventory of fake GPUs (the only fakes, at the GPU boundary). The victim's
kernel is a real ipykernel started through the notebook server's API; it
installs spawner.notebook.checkpoint.on_preempt and writes its checkpoint into the
home volume when the hub's SIGTERM arrives.
"""

from __future__ import annotations

import json
import threading
import time
import uuid

import pytest
from browser import CHROMIUM, CHROMIUM_ARGS, log_in
from hubs import on_hub, stop_every_server
from playwright.sync_api import expect, sync_playwright

from harness import (
    ARTIFACTS,
    Hub,
    container_for,
    containers,
    exec_text,
    progress_messages,
    run_in_kernel,
    running_gpus,
    spawn_in_background,
    spawn_outcome,
    wait_for,
)

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
  slowsave:
    description: training that needs a long grace to save
    cpus: 0.5
    memory: 512M
    gpus: 1
    priority: 300000
    preempts: never
    grace_period: 12s
    min_runtime: 0
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
    reclaim_after: 10s
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
  brief:
    description: preemptible, with a short grace
    cpus: 0.5
    memory: 512M
    gpus: 1
    priority: 300000
    preempts: never
    grace_period: 2s
    min_runtime: 0
    images: [pytorch]
assignments:
  default: [cpu, train, slowsave, experiment, urgent, protected, young, brief]
"""
RECLAIM_AFTER = 10  # protected's, in seconds
QUEUE_TIMEOUT = 3  # experiment's, in the tests that wait it out (the table says 8s)

CHECKPOINT_CODE = """
import json, os, time
from spawner.notebook.checkpoint import on_preempt
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
def hub(gpu_hub):
    """The session's 2-GPU hub (tests/hubs.py: servers outlive a hub restart, as in
    production upgrades) with this module's table."""
    with on_hub(gpu_hub, QUOTAS):
        yield gpu_hub


@pytest.fixture(autouse=True)
def stop_all(hub):
    yield
    stop_every_server(hub)
    hub.quota_file.write_text(QUOTAS)  # a test may have shortened a queue_timeout


def gpus_of(docker_client, user: str) -> str:
    return container_for(docker_client, user).attrs["Config"]["Labels"]["quota-spawner.gpus"]


def new_users(hub: Hub, *names: str) -> list[str]:
    suffix = uuid.uuid4().hex[:5]
    made = [f"{n}{suffix}" for n in names]
    for name in made:
        hub.create_user(name)
    return made


def short_queue(hub: Hub) -> None:
    """experiment waits QUEUE_TIMEOUT seconds in the queue from the next start on (the
    table is read at each start; the module's fixture puts it back after the test)."""
    hub.quota_file.write_text(QUOTAS.replace("queue_timeout: 8s", f"queue_timeout: {QUEUE_TIMEOUT}s"))


def home_file(docker_client, hub: Hub, name: str, path: str) -> str:
    """A file in NAME's home volume, read by a throwaway container (waited for, then
    its output read, then removed: run(remove=True) can lose a short output)."""
    volume = f"{hub.prefix}-home-{name}"
    reader = docker_client.containers.run(
        "quota-spawner/base:local", ["cat", f"/home/jovyan/{path}"], detach=True,
        volumes={volume: {"bind": "/home/jovyan", "mode": "ro"}}, network_mode="none")
    try:
        status = reader.wait(timeout=60)
        out = reader.logs(stdout=True, stderr=True).decode()
    finally:
        reader.remove(force=True)
    assert status["StatusCode"] == 0, f"cat {path} in {volume}: {out}"
    return out


def test_urgent_preempts_the_cheapest_victim_and_its_checkpoint_is_kept(hub, docker_client):
    alice, carol, bob = new_users(hub, "alice", "carol", "bob")
    # train (priority 300000): the cheapest victim; experiment: 500000
    hub.start_servers({alice: opt("train"), carol: opt("experiment")})
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
    kinds = [(e["event"], e.get("user")) for e in hub.events()]
    assert ("preemption", alice) in kinds and ("preempted", alice) in kinds
    assert ("queue-granted", bob) in kinds
    start["thread"].join(30)


def test_equal_priority_is_never_preempted_and_never_waits_instead(hub, docker_client):
    """Two urgent servers hold both GPUs: a third urgent start preempts neither
    (equal priority), and an experiment start (preempts: never) times out waiting."""
    u1, u2, u3, e1 = new_users(hub, "urg1", "urg2", "urg3", "exp")
    hub.start_servers({u1: opt("urgent"), u2: opt("urgent")})
    short_queue(hub)
    t0 = time.monotonic()
    r = hub.spawn(e1, opt("experiment"))  # waits its queue_timeout, then a 503
    outcome = spawn_outcome(hub, e1, timeout=40) if r.status_code == 202 else r.text
    waited = time.monotonic() - t0
    assert "No GPU became free for the role 'experiment'" in outcome, outcome
    assert QUEUE_TIMEOUT - 1 <= waited < 30
    third = spawn_in_background(hub, u3, opt("urgent"))
    # the queue looks for a victim at once and at each sync (every second): two looks
    time.sleep(2)
    assert hub.user(u1)["servers"] and hub.user(u2)["servers"]
    assert not [e for e in hub.events() if e["event"] == "preemption"
                and e.get("user") in (u1, u2)]
    hub.api("DELETE", f"/users/{u3}/server")  # leaves the queue
    third["thread"].join(30)
    wait_for(lambda: any(e["event"] == "queue-left" and e["user"] == u3 for e in hub.events()),
             10, "the queue-left event")


def test_preempts_never_waits_instead_even_over_lower_priorities(hub, docker_client):
    """experiment (500000, preempts: never) outranks two train servers (300000) but
    waits its queue_timeout and is refused; neither train server is touched."""
    t1, t2, e1 = new_users(hub, "ntrain", "ntrainb", "nexp")
    hub.start_servers({t1: opt("train"), t2: opt("train")})
    before = running_gpus(docker_client, hub.prefix)
    short_queue(hub)
    t0 = time.monotonic()
    r = hub.spawn(e1, opt("experiment"))
    outcome = spawn_outcome(hub, e1, timeout=40) if r.status_code == 202 else r.text
    assert "No GPU became free for the role 'experiment'" in outcome, outcome
    assert QUEUE_TIMEOUT - 1 <= time.monotonic() - t0 < 30
    assert running_gpus(docker_client, hub.prefix) == before
    assert not [e for e in hub.events() if e["event"] == "preemption" and e["by"] == e1]
    assert not any(has_notice(container_for(docker_client, u)) for u in (t1, t2))


def test_protected_until_reclaim_after_and_young_servers_are_spared(hub, docker_client):
    gina, harry, ivan = new_users(hub, "gina", "harry", "ivan")
    hub.start_server(gina, opt("protected"))  # preemptible: false, reclaim_after 10s
    started = time.monotonic()
    hub.start_server(harry, opt("young"))  # min_runtime 10m
    gina_gpu = gpus_of(docker_client, gina)
    start = spawn_in_background(hub, ivan, opt("urgent"))
    messages = progress_messages(hub, ivan, "reclaim_after")
    assert any("passes its reclaim_after" in m for m in messages), messages
    hub.wait_ready(ivan, timeout=60)
    assert time.monotonic() - started >= RECLAIM_AFTER  # not before gina's reclaim_after
    assert gpus_of(docker_client, ivan) == gina_gpu
    assert hub.user(harry)["servers"]  # the young one was never chosen
    hub.wait_stopped(gina, timeout=10)
    start["thread"].join(30)


def test_queue_by_priority_then_arrival_and_a_freed_gpu_goes_to_the_head(hub, docker_client):
    h1, h2, q_exp1, q_train, q_exp2 = new_users(hub, "hold1", "hold2", "qexpa", "qtrain",
                                                "qexpb")
    hub.start_servers({h1: opt("urgent"), h2: opt("urgent")})
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
    order = [e["user"] for e in hub.events() if e["event"] == "queue-granted"
             and e["user"] in starts]
    assert order == [q_exp1, q_exp2, q_train]


NOTICE = "/tmp/quota-spawner/preemption.json"


def has_notice(container) -> bool:
    return exec_text(container, f"test -s {NOTICE}")[0] == 0


def test_a_hub_restart_in_the_grace_calls_it_off_and_books_no_gpu_twice(hub, docker_client):
    alice, carol, bob = new_users(hub, "ralice", "rcarol", "rbob")
    hub.start_servers({alice: opt("train"), carol: opt("train")})
    spawn_in_background(hub, bob, opt("urgent"))
    both = [container_for(docker_client, alice), container_for(docker_client, carol)]
    victim = wait_for(lambda: next((c for c in both if has_notice(c)), None), 10,
                      "a preemption notice")
    before = running_gpus(docker_client, hub.prefix)

    hub.stop()
    hub.start()
    # the start it was for ended with the old hub: called off, the notice removed
    wait_for(lambda: not has_notice(victim), 30, "the notice to be withdrawn")
    withdrawn = [e for e in hub.events() if e["event"] == "preemption-withdrawn"
                 and e["container"] == victim.name]
    # withdrawn by the stopping hub, or (after a crash) by the restarted one
    assert withdrawn and ("the hub is shutting down" in withdrawn[-1]["why"]
                          or "the hub restarted during the grace" in withdrawn[-1]["why"])
    assert hub.user(alice)["servers"] and hub.user(carol)["servers"]
    assert not hub.user(bob)["servers"]
    assert running_gpus(docker_client, hub.prefix) == before  # nothing moved, nothing lost
    # the rebuilt pool knows both GPUs are held: bob's next start preempts again
    hub.start_server(bob, opt("urgent"))
    after = running_gpus(docker_client, hub.prefix)
    assert len(after) == 2 and sorted(after.values()) == sorted(hub.gpus)


def test_two_preempting_starts_at_once_take_one_victim_each_and_share_no_gpu(
        hub, docker_client):
    """The guarantees of bench/storm_bench.py's storm, once and deterministic: two brief
    servers hold both GPUs, two urgent starts come at once; each preempts exactly one
    victim and gets exactly that victim's GPU, and no GPU is ever on two running
    containers (sampled throughout)."""
    b1, b2, u1, u2 = new_users(hub, "sbrief", "sbriefb", "surg", "surgb")
    hub.start_servers({b1: opt("brief"), b2: opt("brief")})  # priority 300000, grace 2 s
    victims = {container_for(docker_client, b).name: gpus_of(docker_client, b)
               for b in (b1, b2)}
    seen_twice: list[dict] = []
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.is_set():
            holders = running_gpus(docker_client, hub.prefix)
            held = [g for label in holders.values() for g in label.split(",")]
            if len(held) != len(set(held)):
                seen_twice.append(holders)
            time.sleep(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        starts = [spawn_in_background(hub, u, opt("urgent")) for u in (u1, u2)]
        for u in (u1, u2):
            hub.wait_ready(u, timeout=60)
        for start in starts:
            start["thread"].join(30)
    finally:
        sampling.set()
        sampler.join(5)
    assert not seen_twice, seen_twice
    assert sorted(gpus_of(docker_client, u) for u in (u1, u2)) == sorted(hub.gpus)
    for b in (b1, b2):
        hub.wait_stopped(b, timeout=30)
    evs = hub.events()
    preemptions = [e for e in evs if e["event"] == "preemption" and e["container"] in victims]
    assert len(preemptions) == 2, preemptions
    assert len({e["for_container"] for e in preemptions}) == 2  # one victim per start
    for e in preemptions:
        assert e["by_priority"] > e["priority"], e
        assert e["for_gpus"] == [victims[e["container"]]], e  # exactly the victim's GPU
        assert any(x["event"] == "preempted" and x["container"] == e["container"]
                   and x["time"] >= e["time"] for x in evs), e
    assert "double-booked" not in hub.log()


@pytest.mark.browser
def test_in_chromium_the_preempting_user_sees_whom_they_wait_for_and_the_victim_a_banner(
        hub, docker_client):
    """Both pages as people reach them: log in through the hub, submit the spawn
    form; the victim has its GPU page open from the hub when the notice comes."""
    alice, carol, bob = new_users(hub, "balice", "bcarol", "bbob")
    # slowsave: grace 12 s (what it covers takes about 5)
    hub.start_servers({alice: opt("slowsave"), carol: opt("experiment")})
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        victim = browser.new_context(viewport={"width": 1200, "height": 800}).new_page()
        log_in(victim, hub, alice)
        victim.goto(f"{hub.url}/user/{alice}/gpu")
        expect(victim.locator("#preemption")).to_be_hidden()

        urgent = browser.new_context(viewport={"width": 1200, "height": 800}).new_page()
        log_in(urgent, hub, bob)
        urgent.click("#start")
        urgent.wait_for_url("**/hub/spawn**")
        urgent.locator(".quota-choice[data-role=urgent][data-image=pytorch]").click()
        urgent.click("form#spawn_form input[type=submit], form#spawn_form button[type=submit]")
        expect(urgent.locator("#progress-message")).to_contain_text(
            f"Waiting for {alice}'s server (role 'slowsave') to save its work and stop",
            timeout=20_000)
        urgent.screenshot(path=str(ARTIFACTS / "spawn-waiting-for-preemption.png"))

        banner = victim.locator("#preemption")
        expect(banner).to_be_visible(timeout=10_000)
        expect(banner).to_contain_text("will be stopped in")
        expect(banner).to_contain_text(bob)
        expect(banner).to_contain_text("Save your work now")
        victim.screenshot(path=str(ARTIFACTS / "gpu-page-preempted-from-hub.png"))
        # and JupyterLab's status bar, with the notification
        victim.goto(f"{hub.url}/user/{alice}/lab")
        expect(victim.locator(".qs-gpu-status-text")).to_contain_text(
            "preempted: stops in", timeout=20_000)
        expect(victim.locator(".jp-Notification-Toast, .Toastify__toast").first
               ).to_contain_text(bob, timeout=10_000)
        victim.screenshot(path=str(ARTIFACTS / "jupyterlab-preempted-from-hub.png"))

        urgent.wait_for_selector(".jp-Launcher", timeout=90_000)
        browser.close()
    assert gpus_of(docker_client, bob) != gpus_of(docker_client, carol)
    hub.wait_stopped(alice, timeout=30)
