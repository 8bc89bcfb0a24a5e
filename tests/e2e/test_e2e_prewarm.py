"""End to end: pre-warming a class through the usage service's API on a real hub.

- pre-warm now: the instructor's call starts every member's server with the role and
  image asked for (the containers' labels say so), and the idle culler stops a
  pre-warmed server nobody used, while one a student used stays until it goes idle;
- scheduled: a pre-warm stored for a few seconds ahead is run by the service's Prewarmer
  (with the service's own token) at its time, not before; a cancelled one never runs.

Short times instead of a lab's, all of them the product's own settings: the role's idle
timeout is 6 s, the culler looks every second, servers and proxy report activity every
2 s, the Prewarmer looks every second (QUOTA_SPAWNER_PREWARM_INTERVAL in the service's
environment), and a scheduled pre-warm is 5 s ahead. The instructor calls the
API with a hub API token of their own (the service takes it as HubOAuth does); the
browser test checks the same API through the hub's OAuth login.
"""

from __future__ import annotations

import threading
import time

import pytest
import requests
from hubs import ACTIVITY, CULL_EVERY, on_hub

from harness import Hub, container_for, containers
from spawner.contract import IMAGE_LABEL, ROLE_LABEL

pytestmark = pytest.mark.e2e

IDLE = 6  # the lab role's idle_timeout, seconds: 3 activity intervals
USED_AFTER = 2  # ben goes on using his server this long after ann's is culled
AHEAD = 5  # a scheduled pre-warm's time, from now: room for the calls before it
QUOTAS = f"""\
images:
  pytorch: {{image: "quota-spawner/pytorch:latest"}}
  paddle: {{image: "quota-spawner/paddle:latest"}}
roles:
  lab: {{cpus: 0.5, memory: 512M, images: [pytorch], idle_timeout: {IDLE}s}}
  student: {{cpus: 0.5, memory: 512M, images: [pytorch, paddle], idle_timeout: 10m}}
assignments:
  default: []
  groups:
    cs101: [lab, student]
    cs101-staff: [student]
"""
STUDENTS = ("ann", "ben")


@pytest.fixture(scope="module")
def hub(hub):
    """The session's hub (tests/hubs.py: its culler checks every second, activity every
    2 s, the Prewarmer looks every second) with this module's table and class, and a fresh
    ledger."""
    people = {"prof-ada": ["cs101-staff"], **{name: ["cs101"] for name in STUDENTS}}
    with on_hub(hub, QUOTAS, people, ledger=True):
        hub.instructor = hub.user_token("prof-ada")
        yield hub


def call(hub: Hub, method: str, path: str, body: dict | None = None, token: str = ""):
    """The class API as the instructor (or ``token``'s owner) calls it."""
    r = requests.request(method, f"{hub.url}/services/usage/api/classes/{path}", json=body,
                         headers={"Authorization": f"token {token or hub.instructor}"},
                         timeout=120, allow_redirects=False)
    return r.status_code, r.json()


def wait_all_ready(hub: Hub, timeout: float = 180) -> None:
    for name in STUDENTS:
        hub.wait_ready(name, timeout)


def test_prewarm_now_with_the_role_and_image_then_culling_of_the_unused(hub, docker_client):
    # a student is refused at the API; the instructor is not
    code, found = call(hub, "POST", "cs101/prewarm", {"role": "lab", "image": "pytorch"},
                       token=hub.user_token("ann"))
    assert code == 403 and "instructors of a class" in found["message"]
    code, found = call(hub, "POST", "cs101/prewarm", {"role": "lab", "image": "paddle"})
    assert code == 400 and "\u2068ann\u2069 and \u2068ben\u2069 may not" in found["message"]

    asked = time.monotonic()
    code, found = call(hub, "POST", "cs101/prewarm", {"role": "lab", "image": "pytorch"})
    assert code == 200, found
    # ben comes to the lab and uses his server from the moment it is up (the role's IDLE of
    # a few seconds leaves no room to wait for the checks below); nobody comes for ann's
    leave = threading.Event()
    answers: list[int] = []
    ben = hub.user_token("ben")

    def use_bens_server() -> None:
        while not leave.is_set() and not (hub.user("ben")["servers"].get("") or {}).get("ready"):
            leave.wait(0.2)
        while not leave.is_set():
            answers.append(requests.get(f"{hub.url}/user/ben/api/status", timeout=10,
                                        headers={"Authorization": f"token {ben}"}).status_code)
            leave.wait(1)

    traffic = threading.Thread(target=use_bens_server, daemon=True)
    traffic.start()
    try:
        assert {r["user"]: r["outcome"] for r in found["results"]}.keys() == set(STUDENTS)
        assert {r["outcome"] for r in found["results"]} <= {"started", "starting"}, found
        wait_all_ready(hub)
        ready = time.monotonic()
        for name in STUDENTS:
            labels = container_for(docker_client, name).labels
            assert (labels[ROLE_LABEL], labels[IMAGE_LABEL]) == ("lab", "pytorch")
        _, found = call(hub, "GET", "cs101")
        assert {(m["name"], m["state"], m["role"], m["image"]) for m in found["members"]} == {
            (name, "running", "lab", "pytorch") for name in STUDENTS}
        # pre-warming again skips the running servers
        code, found = call(hub, "POST", "cs101/prewarm", {"role": "lab", "image": "pytorch"})
        assert code == 200 and {r["outcome"] for r in found["results"]} == {"skipped"}

        culled: dict[str, float] = {}
        stopped_using = None
        while time.monotonic() - asked < 150 and len(culled) < 2:
            now = time.monotonic()
            if "ann" in culled and stopped_using is None and now - culled["ann"] >= USED_AFTER:
                leave.set()  # ben leaves: his server goes idle from his last request
                traffic.join(15)
                stopped_using = time.monotonic()
            for name in STUDENTS:
                if name not in culled and not hub.user(name)["servers"]:
                    culled[name] = now
            time.sleep(0.5)
    finally:
        leave.set()
    assert answers and set(answers) == {200}, answers
    log = hub.log()
    assert "ann" in culled, f"the unused pre-warmed server was not culled\n{log[-3000:]}"
    # idle for the role's IDLE from its start, then culled within a check and an activity
    # report (with slack for a 2-core machine)
    assert culled["ann"] - asked >= IDLE, culled
    assert culled["ann"] - ready <= IDLE + CULL_EVERY + ACTIVITY + 10, culled
    assert "Culling ann (role lab): idle for" in log
    assert containers(docker_client, "ann") == []
    # ben's server lived while he used it, and went once idle for the role's IDLE
    assert stopped_using is not None and "ben" in culled, (culled, log[-3000:])
    assert culled["ben"] - stopped_using >= IDLE - ACTIVITY - 1, (culled, stopped_using)
    assert culled["ben"] - stopped_using <= IDLE + CULL_EVERY + 2 * ACTIVITY + 10
    assert "Culling ben (role lab): idle for" in log


def test_a_scheduled_prewarm_runs_at_its_time(hub, docker_client):
    for name in STUDENTS:
        assert hub.user(name)["servers"] == {}, "the first test left a server running"
    at = time.time() + AHEAD
    code, planned = call(hub, "POST", "cs101/prewarm",
                         {"role": "student", "image": "paddle", "at": at})
    assert code == 201, planned
    assert (planned["state"], planned["created_by"], planned["at"]) == ("pending", "prof-ada", at)
    code, other = call(hub, "POST", "cs101/prewarm",
                       {"role": "lab", "image": "pytorch", "at": at + 1})
    assert code == 201
    code, gone = call(hub, "DELETE", f"cs101/schedules/{other['id']}")
    assert code == 200 and gone["state"] == "cancelled"

    started = None
    while time.time() < at + 60:
        servers = [hub.user(name)["servers"] for name in STUDENTS]
        if all(servers):
            started = time.time()
            break
        assert time.time() >= at or not any(servers), "a server was started before its time"
        time.sleep(0.5)
    assert started is not None, f"the schedule did not run\n{hub.log()[-3000:]}"
    assert started >= at
    wait_all_ready(hub)
    for name in STUDENTS:
        labels = container_for(docker_client, name).labels
        assert (labels[ROLE_LABEL], labels[IMAGE_LABEL]) == ("student", "paddle")
    _, found = call(hub, "GET", f"cs101/schedules/{planned['id']}")
    assert found["state"] == "done", found
    outcomes = dict(line.split(": ", 1) for line in found["result"].splitlines())
    # each line names its member isolated (FSI … PDI), as the page shows it
    assert outcomes.keys() == {f"\u2068{name}\u2069" for name in STUDENTS}, found
    assert set(outcomes.values()) <= {"started", "starting"}, found
    _, found = call(hub, "GET", f"cs101/schedules/{other['id']}")
    assert found["state"] == "cancelled"
    code, found = call(hub, "POST", "cs101/stop", {"all": True})
    assert code == 200 and {r["outcome"] for r in found["results"]} <= {"stopped", "stopping"}
    for name in STUDENTS:
        hub.wait_stopped(name)
