"""End to end: the host's memory as a resource, on a real admit, proxy and engine.

This module's hub counts 2 GiB of memory for its notebooks (``host_memory``, nothing kept
back), so two servers of 768 MiB fit and a third does not: it waits in the queue with its
place, starts when one stops, or is refused after its role's queue_timeout; a role that
does not queue is refused at once; nothing is created for a refused start; under the
default BestEffortFIFO a small start that fits starts at once while a big one waits, and
a start that waits is told its own shortfall; a role that preempts frees the room it
needs, with the notice and grace period; a restarted hub counts the servers that kept
running (docs/deployment.md#host-capacity, docs/preemption.md#the-queues-strategies).
"""

from __future__ import annotations

import json
import time

import pytest
from hubs import own_hub

from harness import (
    container_for,
    containers,
    exec_text,
    progress_messages,
    spawn_in_background,
    wait_for,
)

pytestmark = pytest.mark.e2e
PREFIX = "qsadmit"

QUOTAS = """\
images:
  pytorch: {image: "quota-spawner/pytorch:latest"}
roles:
  small: {cpus: 0.25, memory: 768M, queue_timeout: 60, images: [pytorch],
          grace_period: 6s, min_runtime: 0}
  urgent: {cpus: 0.25, memory: 768M, priority: 100, queue_timeout: 60, images: [pytorch]}
  brief: {cpus: 0.25, memory: 768M, queue_timeout: 3, images: [pytorch]}
  now: {cpus: 0.25, memory: 768M, queue_timeout: 0, images: [pytorch]}
  huge: {cpus: 0.25, memory: 3G, images: [pytorch]}
  big: {cpus: 0.25, memory: 1536M, queue_timeout: 60, images: [pytorch]}
assignments:
  default: [small, brief, now, huge, urgent, big]
"""
SMALL, BRIEF, NOW, HUGE, URGENT, BIG = ({"profile": p} for p in
                                        ("small", "brief", "now", "huge", "urgent", "big"))
HOST = """
c.QuotaSpawner.host_memory = "2G"
c.QuotaSpawner.host_reserve_memory = "0"
c.QuotaSpawner.host_reserve_cpus = 0
c.QuotaSpawner.gpu_sync_interval = 1
c.JupyterHub.cleanup_servers = False  # servers outlive a hub restart
"""
FULL = "the host's memory is fully reserved: 2.25 GiB of 2 GiB"
USERS = ("ann", "ben", "cal", "dee", "eve", "fay", "gil", "hal", "ivy", "jon")
ORDER = ("(BestEffortFIFO, fair between users: by priority, then a user's first server "
         "before anyone's second, then arrival)")


@pytest.fixture(scope="module")
def admit(docker_client, tmp_path_factory):
    yield from own_hub(tmp_path_factory.mktemp(PREFIX), docker_client, "host-admission",
                       quota_text=QUOTAS, prefix=PREFIX, extra_config=HOST, users=USERS)


@pytest.fixture
def full(admit):
    """ann and ben's servers fill the host's 2 GiB (768 MiB each, 1.5 GiB), ann's first:
    a server's age counts from its admission, and with the engine's calls side by side
    (engine_threads) two starts at once may be created in either order, so only starts
    one after the other make ben's the younger by every clock."""
    admit.start_servers({"ann": SMALL})
    admit.start_servers({"ben": SMALL})
    yield
    admit.stop_servers(["ann", "ben", "cal", "dee", "eve", "gil"])


def test_the_hub_says_what_it_counts(admit, docker_client):
    cpus = docker_client.info()["NCPU"]
    assert (f"Host capacity: {cpus:g} CPU{'s' if cpus != 1 else ''} and 2 GiB; 0 CPUs and "
            "0 B kept back for the hub, the proxy and the system; notebooks may reserve "
            f"{cpus * 4:g} CPUs (4x) and 2 GiB (1x)") in admit.log()


def test_a_start_that_does_not_fit_waits_its_turn_and_starts_when_one_stops(
        admit, full, docker_client):
    cal = spawn_in_background(admit, "cal", SMALL)
    said = progress_messages(admit, "cal", until="Waiting for room on the host", timeout=20)
    assert any(f"Waiting for room on the host for the role 'small': {FULL}. Number 1 of 1 "
               "in the queue" in m for m in said), said
    assert containers(docker_client, "cal") == []  # nothing made while it waits
    time.sleep(2)
    assert not admit.user("cal")["servers"][""]["ready"]
    admit.stop_server("ann")
    admit.wait_ready("cal", timeout=60)
    cal["thread"].join(30)
    granted = [e for e in admit.events() if e.get("event") == "queue-granted"
               and e.get("user") == "cal"]
    assert granted and granted[-1]["waited"] >= 2, admit.events()[-5:]
    assert "cal: Waiting for room on the host for the role 'small'" in admit.log()


def test_a_start_is_refused_after_its_queue_timeout_and_nothing_is_created(
        admit, full, docker_client):
    started = time.monotonic()
    r = admit.spawn("dee", BRIEF)
    if r.status_code == 202:  # answered before the wait ended: follow the start
        admit.wait_stopped("dee", timeout=30)
        message = admit.session.get(f"{admit.url}/hub/api/users/dee/server/progress",
                                  timeout=10).text
    else:
        assert r.status_code == 503, r.text
        message = r.json()["message"]
    assert time.monotonic() - started >= 3
    assert ("No room came free on the host for the role 'brief' (0.25 CPUs, 768 MiB) in "
            "the 3s you waited in the queue (you were number 1): " + FULL) in message, message
    assert containers(docker_client, "dee") == []
    assert not admit.user("dee")["servers"]


def test_a_role_that_does_not_queue_is_refused_at_once(admit, full, docker_client):
    r = admit.spawn("eve", NOW)
    assert r.status_code == 503, r.text
    assert r.json()["message"] == (
        f"Your server cannot start now: {FULL}, and the role 'now' (0.25 CPUs, 768 MiB) does "
        "not wait in the queue. Try again when a server stops.")
    assert containers(docker_client, "eve") == []


def test_a_role_larger_than_the_notebooks_share_is_refused(admit, docker_client):
    r = admit.spawn("fay", HUGE)
    assert r.status_code == 503, r.text
    assert "is larger than what this host gives all notebook servers together" in \
        r.json()["message"]
    assert "so it can never start here" in r.json()["message"]
    assert containers(docker_client, "fay") == []


def test_a_start_that_fits_is_not_held_up_by_a_big_one_and_each_is_told_its_own_shortfall(
        admit, docker_client):
    """BestEffortFIFO, the default: with ann's 768 MiB held, hal's 1.5 GiB start does not
    fit and waits; ivy's 768 MiB start fits, and starts at once; jon's then does not fit,
    and is told its own figures (2.25 GiB of 2 GiB), not hal's (3 GiB of 2 GiB)."""
    assert "Queue: BestEffortFIFO, fair between users" in admit.log()
    admit.start_servers({"ann": SMALL})
    try:
        hal = spawn_in_background(admit, "hal", BIG)
        said = progress_messages(admit, "hal", until="Waiting for room", timeout=20)
        assert any(f"Waiting for room on the host for the role 'big': {FULL}. Number 1 of 1 "
                   f"in the queue {ORDER}" in m for m in said), said
        ivy = spawn_in_background(admit, "ivy", SMALL)
        admit.wait_ready("ivy", timeout=30)  # StrictFIFO would hold it behind hal
        ivy["thread"].join(30)
        assert not [e for e in admit.events() if e.get("event") == "queued"
                    and e.get("user") == "ivy"]
        jon = spawn_in_background(admit, "jon", SMALL)
        said = progress_messages(admit, "jon", until="Waiting for room", timeout=20)
        assert any(f"Waiting for room on the host for the role 'small': {FULL}. Number 2 of "
                   f"2 in the queue {ORDER}; you start when a server stops." in m
                   for m in said), said
        hal_now = progress_messages(admit, "hal", until="3 GiB of 2 GiB", timeout=20)
        assert any("the host's memory is fully reserved: 3 GiB of 2 GiB" in m
                   for m in hal_now), hal_now
        assert not admit.user("hal")["servers"][""]["ready"]
        assert containers(docker_client, "hal") == [] and containers(docker_client, "jon") == []
    finally:  # the waiting starts first, so that none is served as the others stop
        admit.stop_servers(["hal", "jon", "ann", "ivy"])
    for started in (hal, jon):
        started["thread"].join(30)


def test_a_preempting_role_frees_memory_with_the_notice_and_grace_period(
        admit, full, docker_client):
    """gil's role outranks 'small': the younger of ann's and ben's servers is told, keeps
    running through its 6 s grace, then stops, and gil starts in the room it held."""
    started = {u: container_for(docker_client, u).attrs["Created"] for u in ("ann", "ben")}
    victim = max(started, key=started.get)  # the younger: the least work lost
    kept = "ben" if victim == "ann" else "ann"
    gil = spawn_in_background(admit, "gil", URGENT)
    container = container_for(docker_client, victim)
    notice = json.loads(wait_for(
        lambda: exec_text(container, "cat /tmp/quota-spawner/preemption.json")[1]
        if exec_text(container, "test -s /tmp/quota-spawner/preemption.json")[0] == 0
        else None, 15, "the preemption notice"))
    assert notice["by"] == "gil" and notice["by_role"] == "urgent" and notice["gpus"] == []
    assert notice["reason"] == (
        "gil needs 768 MiB of memory and 0.25 CPUs on the host for the role 'urgent' "
        "(priority 100), which outranks this server's role 'small' (priority 0).")
    assert 5 <= notice["deadline"] - notice["signalled_at"] <= 7
    said = progress_messages(admit, "gil", until="to save its work and stop", timeout=10)
    assert any(f"Waiting for {victim}'s server (role 'small') to save its work and stop" in m
               and "Its room on the host is kept for you." in m for m in said), said
    time.sleep(2)  # within the grace: the victim still runs, gil has nothing yet
    assert admit.user(victim)["servers"][""]["ready"]
    assert containers(docker_client, "gil") == []
    admit.wait_ready("gil", timeout=60)
    gil["thread"].join(30)
    assert time.time() >= notice["deadline"]
    assert not admit.user(victim)["servers"]  # stopped the hub's way
    assert admit.user(kept)["servers"][""]["ready"]  # only the room needed was taken
    (event,) = [e for e in admit.events() if e.get("event") == "preemption"
                and e.get("by") == "gil"]
    assert event["user"] == victim and event["for_gpus"] == []


def test_a_restarted_hub_counts_the_servers_that_kept_running(admit, full, docker_client):
    admit.stop()
    admit.start()
    assert admit.user("ann")["servers"][""]["ready"]  # kept over the restart
    r = admit.spawn("eve", NOW)
    assert r.status_code == 503 and FULL in r.json()["message"], r.text
    log = admit.log()
    assert "Host room 0.25 CPUs, 768 MiB held by running container qsadmit-ann" in log
    assert "Host room 0.25 CPUs, 768 MiB held by running container qsadmit-ben" in log
