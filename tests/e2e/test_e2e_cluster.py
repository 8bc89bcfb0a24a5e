"""End to end: the product laid out as on a cluster, on one machine.

The hub, the usage service (an external service: the hub does not start it) and two
watchdogs each run in their own empty state folder and share only the hub's URL, their
tokens and one PostgreSQL database (the private test server, tests/postgres.py). Each
watchdog stands for a node: its own FAKE NVML sees one of the hub's two GPUs. Nothing
but the hub's API and the database carries anything between them, so each feature below
works only if its state went through one of the two.

The quota table's source is the database: the hub seeds it from its file once, and the
editor of the usage service (which has no file at all) saves the versions every process
reads.

Real hub, proxy, engine, containers and PostgreSQL; only NVML is FAKE.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests
from gpu_hours import midday_zone, seed
from postgres import fresh_database
from receivers import HttpReceiver
from sqlalchemy import select

from harness import (
    ARTIFACTS,
    Hub,
    WatchdogProcess,
    container_for,
    exec_text,
    fake_nvml_config,
    free_port,
    install_fake_nvml,
    spawn_in_background,
    teardown,
    wait_for,
    write_fake_nvml_state,
)
from spawner.contract import PREEMPT_NOTICE
from spawner.usage.documents import BUDGET_MEMORY, GPU_USAGE, GPUS, PREEMPTIONS, DatabaseDocuments
from spawner.usage.ledger import Ledger
from spawner.usage.schema import role_requests
from spawner.webapp.app import external_environment

pytestmark = pytest.mark.e2e

PREFIX = "qscluster"
HUB_ID = "cluster-hub"
NODES = {"node-a": "GPU-cluster-a", "node-b": "GPU-cluster-b"}  # each watchdog's GPU
G = 2**30
GRACE = 6  # the preempted role's grace period, seconds
QUOTAS = """\
images:
  pytorch: {image: "quota-spawner/pytorch:latest"}
roles:
  small: {cpus: 0.25, memory: 384M, images: [pytorch]}
  gpu: {cpus: 0.25, memory: 512M, images: [pytorch], gpus: 1, queue_timeout: 0,
        grace_period: 6s, min_runtime: 0s}
  urgent: {cpus: 0.25, memory: 512M, images: [pytorch], gpus: 1, priority: 100,
           preempts: lower, queue_timeout: 60}
assignments:
  default: [small, gpu]
  groups:
    cs101: [small, gpu]
    staff: [small, gpu, urgent]
"""
CLASSES = {"cs101": ["prof-ada"]}
REQUESTS = """requests:
  roles: [urgent]
  max_days: 2
"""
# A flood of requests: forty small roles anyone may ask for, and how long the watchdogs
# count one user's messages to a channel before the digest (the default is an hour): the
# flood takes a few seconds, and the test waits out one window
FLOOD_ROLES = [f"lab-{n:02d}" for n in range(40)]
FLOOD_PERIOD = 20


def hub_config(db: str, usage_url: str, usage_token: str, watchdog_token: str,
               fake: Path) -> str:
    """The hub's settings beyond the shipped config's: the GPUs, the database, and the
    usage service and the watchdogs as external services with their tokens."""
    return fake_nvml_config(fake, PREFIX, 2, gpus=tuple(NODES.values())) + f"""
c.QuotaSpawner.hub_id = {HUB_ID!r}
c.QuotaSpawner.usage_db = {db!r}
c.QuotaSpawner.usage_check_interval = 1
# servers outlive a hub restart, as in production upgrades
c.JupyterHub.cleanup_servers = False
import jupyterhub
from spawner.hubconfig.rbac import CLASS_OAUTH_SCOPES, class_service_scopes, instructor_roles
from spawner.watchdog.service import watchdog_service
from spawner.webapp.app import CUSTOM_SCOPES, external_service, webapp_service
from spawner.webapp.requests import USER_SCOPES
c.JupyterHub.custom_scopes = CUSTOM_SCOPES
usage, usage_role, usage_own_role = webapp_service(
    c.JupyterHub.bind_url, {db!r}, c.QuotaSpawner.quota_file, url={usage_url!r})
usage = external_service(usage, {usage_token!r})
usage["oauth_client_allowed_scopes"] += CLASS_OAUTH_SCOPES
usage_own_role["scopes"] += class_service_scopes({CLASSES!r})
c.JupyterHub.services.append(usage)
c.JupyterHub.load_roles += [usage_role, usage_own_role, *instructor_roles({CLASSES!r})]
if jupyterhub.version_info >= (6,):
    c.JupyterHub.extra_user_scopes = list(USER_SCOPES)
else:
    c.JupyterHub.load_roles.append({{"name": "user", "scopes": ["self", *USER_SCOPES]}})
_watchdog, _watchdog_role = watchdog_service(c.JupyterHub.bind_url)
c.JupyterHub.services.append({{"name": _watchdog["name"], "api_token": {watchdog_token!r}}})
c.JupyterHub.load_roles.append(_watchdog_role)
"""


class UsageProcess:
    """``python -m spawner.webapp`` as an admin runs it on another machine: the variables
    of ``external_environment`` and nothing of the hub's folder."""

    def __init__(self, work: Path, hub: Hub, url: str, token: str, db: str):
        self.work, self.url = work, url
        self.env = {**external_environment(hub.url, f"{hub.url}/hub/api", token, url=url,
                                           usage_db=db, hub_id=HUB_ID),
                    "QUOTA_SPAWNER_STATE_DIR": str(work), "QUOTA_SPAWNER_QUOTA_FILE": "",
                    "QUOTA_SPAWNER_QUOTA_SOURCE": "database"}
        self.log_path = work / "usage.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60) -> UsageProcess:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("JUPYTERHUB_", "QUOTA_SPAWNER_"))}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "spawner.webapp"], cwd=self.work,
                                         env={**env, **self.env}, stdout=log,
                                         stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while True:
            try:
                requests.get(self.url, timeout=2)
                return self
            except requests.RequestException:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"the usage service did not start:\n{self.log()[-3000:]}") from None
                time.sleep(0.2)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


class Cluster:
    def __init__(self, hub: Hub, db: str, usage: UsageProcess,
                 watchdogs: dict[str, WatchdogProcess], folders: list[Path],
                 http: HttpReceiver):
        self.hub, self.db, self.usage, self.watchdogs, self.folders, self.http = (
            hub, db, usage, watchdogs, folders, http)
        self.tokens: dict[str, str] = {}
        self.ledger: Ledger | None = None  # this test's own connection, once the hub made it

    def token(self, user: str) -> str:
        if user not in self.tokens:
            self.tokens[user] = self.hub.user_token(user)
        return self.tokens[user]

    def service(self, path: str, user: str = "admin", method: str = "GET",
                body: Any = None) -> requests.Response:
        """The usage service through the hub's proxy, as ``user`` with their token."""
        return requests.request(
            method, f"{self.hub.url}/services/usage/{path}", json=body, timeout=60,
            headers={"Authorization": f"token {self.token(user)}"}, allow_redirects=False)

    def save_table(self, text: str) -> tuple[int, Any]:
        """Save ``text`` in the usage service's editor, as the admin (over the newest
        version); the editor's answer."""
        r = self.service("api/table")
        assert r.status_code == 200, r.text
        r = self.service("api/table", method="POST", body={
            "text": text, "version": r.json()["version"], "comment": "from the cluster test"})
        return r.status_code, r.json()

    def told(self, *words: str) -> list[str]:
        """The messages the watchdogs sent to the admins' webhook holding all ``words``."""
        return [r.body["message"] for r in list(self.http.requests)
                if r.kind == "json" and isinstance(r.body, dict)
                and all(w in r.body.get("message", "") for w in words)]

    def engine(self) -> Any:
        """The shared database, as this test reads it."""
        if self.ledger is None:
            self.ledger = Ledger(self.db, create=False)
        return self.ledger.engine

    def documents(self) -> DatabaseDocuments:
        """The hub's rows in the shared database, as this test reads them."""
        return DatabaseDocuments(self.engine(), HUB_ID)


@pytest.fixture(scope="module")
def cluster(docker_client, tmp_path_factory) -> Iterator[Cluster]:
    work = tmp_path_factory.mktemp("cluster")
    folders = [work / name for name in ("hub", "usage", *NODES)]
    for folder in folders:
        folder.mkdir()
    (work / "container-nvml").mkdir()
    fake = install_fake_nvml(work / "container-nvml")
    usage_url, usage_token = f"http://127.0.0.1:{free_port()}", secrets.token_hex(32)
    watchdog_token = secrets.token_hex(32)
    with fresh_database() as db, HttpReceiver() as http:
        channels = f"""
c.Notifier.retry_delay = 0.2
c.Notifier.user_message_period = {FLOOD_PERIOD}
c.Notifier.channels = [{{"name": "admins", "url": "json://{http.base[len('http://'):]}/hook"}}]
"""
        hub = Hub(folders[0], quota_text=QUOTAS, prefix=PREFIX,
                  extra_config=hub_config(db, usage_url, usage_token, watchdog_token, fake))
        hub.env.update(QUOTA_SPAWNER_USAGE_DB=db, QUOTA_SPAWNER_QUOTA_SOURCE="database")
        usage = UsageProcess(folders[1], hub, usage_url, usage_token, db)
        watchdogs = {}
        for folder, (node, uuid) in zip(folders[2:], NODES.items(), strict=True):
            (folder / "nvml").mkdir()
            host_fake = install_fake_nvml(folder / "nvml")
            write_fake_nvml_state(host_fake, {"gpus": [
                {"uuid": uuid, "name": "Fake GPU", "memory": 16 * G, "utilization": 40}]})
            watchdogs[node] = WatchdogProcess(
                folder, host_fake, f"c.QuotaWatchdog.host_name = {node!r}\n" + channels,
                interval=1,
                env={"JUPYTERHUB_API_URL": f"{hub.url}/hub/api",
                     "JUPYTERHUB_API_TOKEN": watchdog_token, "QUOTA_SPAWNER_HUB_ID": HUB_ID,
                     "QUOTA_SPAWNER_USAGE_DB": db})
        found = Cluster(hub, db, usage, watchdogs, folders, http)
        try:
            hub.start()
            for name, groups in {"admin": [], "ann": ["cs101"], "bob": ["cs101"],
                                 "carl": ["staff"], "eve": [], "prof-ada": []}.items():
                hub.create_user(name, groups)
            usage.start()
            for watchdog in watchdogs.values():
                watchdog.start()
            yield found
        finally:
            if found.ledger is not None:
                found.ledger.dispose()
            for watchdog in watchdogs.values():
                watchdog.stop()
            usage.stop()
            ARTIFACTS.mkdir(exist_ok=True)
            (ARTIFACTS / "cluster-usage.log").write_text(usage.log())
            for node, watchdog in watchdogs.items():
                (ARTIFACTS / f"cluster-watchdog-{node}.log").write_text(watchdog.log())
            teardown(hub, docker_client, "cluster")


def test_each_process_has_only_its_own_folder(cluster):
    """The hub's state stays in the database: no state file in any folder, and the
    service and the watchdogs were given none of the hub's."""
    hub_files = {p.name for p in cluster.folders[0].iterdir()}
    for kind in (GPUS, GPU_USAGE, PREEMPTIONS):
        assert kind.file not in hub_files
    assert "quota-spawner-events.jsonl" not in hub_files
    assert "quota-spawner-usage.sqlite" not in hub_files
    assert str(cluster.folders[0]) not in json.dumps(cluster.usage.env)
    for watchdog in cluster.watchdogs.values():
        assert str(cluster.folders[0]) not in json.dumps(watchdog.env)


def test_the_host_map_shows_the_holders_and_both_watchdogs_readings(cluster):
    hub = cluster.hub
    hub.start_server("ann", {"profile": "gpu"})
    try:
        def readings() -> dict[str, Any] | None:
            r = cluster.service("api/gpus")
            assert r.status_code == 200, r.text
            doc = r.json()
            by_uuid = {g["uuid"]: g for g in doc["gpus"]}
            nodes = {n["node"]: n["state"] for n in doc["watchdog"]["nodes"]}
            done = (nodes == {"node-a": "fresh", "node-b": "fresh"}
                    and all(by_uuid.get(u, {}).get("utilization") == 0.4
                            for u in NODES.values())
                    and any(h["user"] == "ann" for g in doc["gpus"] for h in g["holders"]))
            return doc if done else None

        doc = wait_for(readings, 60, f"no map with both watchdogs:\n{cluster.usage.log()[-2000:]}")
        assert doc["pool"]["hub"] == HUB_ID and doc["summary"]["exclusive"] == 1
        page = cluster.service("gpus").text
        assert "Readings from 2 watchdogs: node-a (fresh), node-b (fresh)." in page
        # ann's GPU is one node's; the other node's watchdog sees her container, not the
        # GPU. Over refreshes spanning both watchdogs' writes (each every second) the map
        # shows the live reading and the nodes in one order, and neither watchdog told
        # anyone the GPU was lost: the other leaves it to its node's watchdog.
        held = next(g["uuid"] for g in doc["gpus"] if g["holders"])
        for _ in range(4):
            time.sleep(0.6)
            again = cluster.service("api/gpus").json()
            assert [n["node"] for n in again["watchdog"]["nodes"]] == ["node-a", "node-b"]
            row = next(g for g in again["gpus"] if g["uuid"] == held)
            assert (row["lost"], row["utilization"]) == (None, 0.4), row
        assert cluster.told("NVML cannot read the GPU") == []
        (other,) = (w for n, w in cluster.watchdogs.items() if NODES[n] != held)
        assert f"{held} is left to " in other.log()
        rows = {d.node for d in cluster.documents().read_all(GPU_USAGE)}
        assert rows == {"node-a", "node-b"}
        # the class dashboard: the hub's API for the members, the database for the rest
        member = wait_for(
            lambda: next((m for m in cluster.service("api/classes/cs101", "prof-ada")
                          .json()["members"] if m["name"] == "ann" and m["memory"]), None),
            60, "no usage for ann on the class dashboard")
        assert member["state"] == "running" and member["role"] == "gpu"
        assert member["memory_limit"] == 512 * 2**20
    finally:
        hub.stop_server("ann")


def test_a_preemption_reaches_the_server_with_its_grace(cluster, docker_client):
    """bob and ann hold both GPUs; carl's urgent role preempts the younger (bob): the
    notice is in bob's container and the preemption in its grace is the hub's row in the
    database until bob is gone; carl then gets the GPU."""
    hub = cluster.hub
    hub.start_server("ann", {"profile": "gpu"})
    time.sleep(1)
    hub.start_server("bob", {"profile": "gpu"})
    try:
        victim = container_for(docker_client, "bob")
        started = spawn_in_background(hub, "carl", {"profile": "urgent"})  # waits for bob
        code, notice = wait_for(
            lambda: (lambda rc, out: (rc, out) if rc == 0 else None)(
                *exec_text(victim, f"cat {PREEMPT_NOTICE}")), 30, "no notice in bob's server")
        notice = json.loads(notice)
        assert notice["reason"].startswith("carl needs 1 GPU") and notice["grace_period"] == GRACE
        rows = cluster.documents()
        pending = json.loads(rows.read(PREEMPTIONS).text)
        assert [p["container"] for p in pending] == [victim.name]
        assert hub.user("bob")["servers"], "bob's server stops only after its grace"
        started["thread"].join(GRACE + 90)
        assert started["status"] in (201, 202), started
        hub.wait_ready("carl", timeout=60)
        assert not hub.user("bob")["servers"] and hub.user("ann")["servers"]
        assert json.loads(rows.read(PREEMPTIONS).text) == []
        events = [e["event"] for e in hub.events() if e.get("user") == "bob"]
        assert "preemption" in events
        # each event told once, by one of the two watchdogs that read the table
        wait_for(lambda: cluster.told("Preempted by", "Who: bob ("), 30, "no message of it")
        wait_for(lambda: cluster.told("The server was stopped", "Who: bob ("), 30,
                 "no message of the stop")
        time.sleep(3)  # both watchdogs have read the events since (every second)
        assert len(cluster.told("Preempted by", "Who: bob (")) == 1
        assert len(cluster.told("The server was stopped", "Who: bob (")) == 1
    finally:
        hub.stop_servers(["ann", "bob", "carl"])


def test_a_table_saved_in_the_editor_applies_at_the_next_spawn(cluster, docker_client):
    """The service has no quota file: its editor saves a version in the database, which
    the hub reads at the next spawn; a bad table is refused with its line and saves
    nothing."""
    code, found = cluster.save_table(QUOTAS.replace("cpus: 0.25, memory: 384M",
                                                    "cpus: lots, memory: 384M"))
    assert code == 400, found
    assert [(p["file"], p["line"]) for p in found["problems"]] == [("database:default", 4)]
    code, found = cluster.save_table(QUOTAS.replace("memory: 384M", "memory: 320M"))
    assert code == 200, found
    cluster.hub.start_server("ann", {"profile": "small"})
    try:
        assert container_for(docker_client, "ann").attrs["HostConfig"]["Memory"] == 320 * 2**20
    finally:
        cluster.hub.stop_server("ann")
        assert cluster.save_table(QUOTAS)[0] == 200


def test_a_spent_budget_stops_a_running_server(cluster):
    """A budget saved in the editor; the hub's duties read the sessions from the database
    the watchdogs fold samples into; stop: true stops ann's running server, and she is
    told once."""
    hub = cluster.hub
    code, found = cluster.save_table(QUOTAS + f"""budgets:
  timezone: {midday_zone()}
  users:
    ann: {{gpu_hours: 1, per: day, stop: true}}
""")
    assert code == 200, found
    try:
        hub.start_server("ann", {"profile": "gpu"})
        seed(cluster.db, "ann", 1.2, hub=HUB_ID)
        hub.wait_stopped("ann", timeout=60)
        spent = wait_for(lambda: [e for e in hub.events() if e["event"] == "budget-spent"
                                  and e.get("user") == "ann"], 20, "no budget-spent event")
        assert len(spent) == 1 and spent[0]["stopping"] is True
        memory = cluster.documents().read(BUDGET_MEMORY)
        assert memory is not None and '"user": "ann"' in memory.text
    finally:
        assert cluster.save_table(QUOTAS)[0] == 200
        hub.stop_servers(["ann"])


def test_restarts_lose_nothing_and_tell_nothing_twice(cluster):
    """Each process restarts in turn, and all they share is in the database:
    - the usage service between eve's request for a role and its approval: the grant
      holds, and she starts the role;
    - both watchdogs while the hub warns eve of her budget: once back, it is told once;
    - the hub, with eve's server running past 90% of her budget: nobody is warned again.
    """
    hub = cluster.hub
    code, found = cluster.save_table(QUOTAS + REQUESTS + f"""budgets:
  timezone: {midday_zone()}
  users:
    eve: {{gpu_hours: 1, per: day}}
""")
    assert code == 200, found
    try:
        now = time.time()
        r = cluster.service("api/requests", "eve", "POST", {
            "role": "urgent", "starts": now, "ends": now + 3600, "reason": "a deadline"})
        assert r.status_code == 200, r.text
        asked = r.json()["request"]["id"]
        cluster.usage.stop()
        cluster.usage.start()
        r = cluster.service(f"api/requests/{asked}/decide", "admin", "POST",
                            {"approve": True, "comment": "granted for the deadline"})
        assert r.status_code == 200, r.text

        for watchdog in cluster.watchdogs.values():
            watchdog.stop()
        hub.start_server("eve", {"profile": "urgent"})  # the grant
        seed(cluster.db, "eve", 0.95, hub=HUB_ID)
        wait_for(lambda: [e for e in hub.events() if e["event"] == "budget-warning"
                          and e.get("user") == "eve"], 30, "no budget warning")
        for watchdog in cluster.watchdogs.values():
            watchdog.start()
        wait_for(lambda: cluster.told("is 95% used", "eve"), 30,
                 "the warning was not told after the watchdogs' restart")

        hub.stop()
        hub.start()
        assert hub.user("eve")["servers"], "the server outlives the hub's restart"
        time.sleep(5)  # five budget checks of the restarted hub, and the watchdogs' cycles
        warned = [e for e in hub.events() if e["event"] == "budget-warning"
                  and e.get("user") == "eve"]
        assert len(warned) == 1, warned
        assert len(cluster.told("is 95% used", "eve")) == 1
    finally:
        for watchdog in cluster.watchdogs.values():
            if watchdog.proc is None or watchdog.proc.poll() is not None:
                watchdog.start()
        hub.stop_servers(["eve"])
        assert cluster.save_table(QUOTAS)[0] == 200


def test_one_users_flood_of_requests_is_stored_within_the_limits_and_told_in_a_digest(
        cluster):
    """dan sends forty requests at once for one role, then forty at once for forty roles:
    the database keeps one for the role and three in all (requests: max_open), and each
    other ask is a 400 that says why. Then he asks and withdraws twenty times: the admins'
    channel gets 5 messages about him and, when the watchdog's window ends, one digest
    that counts every other one. One watchdog tells them all (the other is stopped): each
    counts its own."""
    hub = cluster.hub
    hub.create_user("dan")
    roles = "".join(f"  {r}: {{cpus: 0.25, memory: 256M, images: [pytorch]}}\n"
                    for r in FLOOD_ROLES)
    code, found = cluster.save_table(
        QUOTAS.replace("assignments:", roles + "assignments:")
        + f"requests:\n  roles: [urgent, {', '.join(FLOOD_ROLES)}]\n  max_days: 2\n")
    assert code == 200, found
    quiet = cluster.watchdogs["node-b"]
    quiet.stop()
    try:
        def ask(role: str) -> tuple[int, str]:
            now = time.time()
            r = cluster.service("api/requests", "dan", "POST", {
                "role": role, "starts": now, "ends": now + 3600, "reason": "a flood"})
            return r.status_code, r.json()["message"]

        def stored() -> list[tuple[int, str]]:
            with cluster.engine().connect() as db:
                return [tuple(r) for r in db.execute(
                    select(role_requests.c.id, role_requests.c.role)
                    .where(role_requests.c.user_name == "dan",
                           role_requests.c.state == "pending").order_by(role_requests.c.id))]

        cluster.token("dan")  # one token, before the threads
        with ThreadPoolExecutor(40) as pool:
            same = list(pool.map(ask, ["urgent"] * 40))
        assert sorted(code for code, _ in same) == [200] + [400] * 39, same
        for code, message in same:
            assert code == 200 or re.fullmatch(
                r"You already asked for the role 'urgent' on \d{4}-\d\d-\d\d \d\d:\d\d "
                r"UTC; that request is still waiting for a decision\.", message), message
        assert [role for _, role in stored()] == ["urgent"]

        with ThreadPoolExecutor(40) as pool:
            many = list(pool.map(ask, FLOOD_ROLES))
        assert sorted(code for code, _ in many) == [200] * 2 + [400] * 38, many
        assert {message for code, message in many if code == 400} == {
            "You have 3 requests waiting for a decision, and this hub allows 3 at once: "
            "withdraw one on the requests page (its Withdraw button), or wait for a "
            "decision, before you ask for another."}
        waiting = stored()
        assert len(waiting) == 3 and waiting[0][1] == "urgent"

        # the flood the admins would read: ask and withdraw, again and again
        def withdraw(request_id: int) -> None:
            r = cluster.service(f"api/requests/{request_id}/withdraw", "dan", "POST", {})
            assert r.status_code == 200, r.text

        for request_id, _ in waiting:
            withdraw(request_id)
        for _ in range(20):
            code, _ = ask("lab-00")
            assert code == 200
            withdraw(stored()[0][0])
        events = 3 + 3 + 40

        def digests() -> list[str]:
            return cluster.told("Who: dan", "Incident: digest:dan")

        def held() -> int:
            return sum(int(n) for digest in digests()
                       for n, kind in (part.split(" ", 1) for part in digest.split(
                           " held: ", 1)[1].split("\n", 1)[0].rstrip(".").split(", "))
                       if kind.startswith("role-request"))

        # every event told or counted in a digest: a loaded machine may spread the flood
        # over two windows, each with its digest
        wait_for(lambda: len(cluster.told("Who: dan", "Incident: role_request:")) + held()
                 >= events, 2 * FLOOD_PERIOD + 60, "every message about dan told or held")
        told = cluster.told("Who: dan", "Incident: role_request:")
        assert digests(), "no digest of dan's messages"
        assert len(told) + held() == events, (len(told), held(), digests())
        assert 5 <= len(told) <= 5 * len(digests()), (len(told), digests())
        assert "came for this channel; the first 5 were sent" in digests()[0]
    finally:
        quiet.start()
        assert cluster.save_table(QUOTAS)[0] == 200
