"""The class dashboard's JSON API without a hub: the OAuth user is faked as in
test_usage_service.py, and the hub's REST API by a small tornado app that enforces
the instructor's group as the hub's RBAC would."""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path

import pytest
from test_usage_service import ADMIN, INSTRUCTOR, PLAIN, VIEWER, FakeHubAuth
from tornado import web
from tornado.httpclient import AsyncHTTPClient
from tornado.httpserver import HTTPServer
from tornado.testing import bind_unused_port

from spawner.hubconfig.rbac import USAGE_SCOPE
from spawner.usage.ledger import Ledger
from spawner.usage.schema import sessions
from spawner.webapp import app as service
from spawner.webapp import class_logic as classes
from spawner.webapp import classes as class_api

ROOT = Path(__file__).resolve().parents[2]
SERVICE_TOKEN = "service-token"

# alice runs a gpu-lab server; cs101-gpu also gives alice gpu-lab, student1 has student only
USERS = [
    {"name": "alice", "groups": ["cs101", "cs101-gpu"], "last_activity": "2027-01-05T09:00:00Z",
     "servers": {"": {"ready": True, "pending": None, "started": "2027-01-05T08:00:00Z",
                      "user_options": {"profile": "gpu-lab", "image": "pytorch"}}}},
    {"name": "student1", "groups": ["cs101"], "last_activity": None, "servers": {}},
    {"name": "student2", "groups": ["cs101"], "last_activity": None, "servers": {}},
    {"name": "bob", "groups": ["ml-platform"], "servers": {}},
]
# what each token may do, as the hub's RBAC gives it: the instructor's OAuth token
# carries servers!group=cs101 and list:users!group=cs101
GROUP_OF_TOKEN = {"token user-prof-ada": "cs101", "token user-admin": None,
                  f"token {SERVICE_TOKEN}": None}
DENIED = "Action is not authorized with current scopes; requires any of [servers]"


class Hub:
    def __init__(self):
        self.users = {u["name"]: copy.deepcopy(u) for u in USERS}
        self.calls: list[tuple[str, str, str, object]] = []  # method, path, token, body

    def allowed(self, token: str, name: str | None = None) -> bool:
        if token not in GROUP_OF_TOKEN:
            return False
        group = GROUP_OF_TOKEN[token]
        return group is None or name is None or group in self.users[name]["groups"]


class HubUsers(web.RequestHandler):
    def get(self) -> None:
        hub: Hub = self.settings["hub"]
        token = self.request.headers.get("Authorization", "")
        hub.calls.append(("GET", "users", token, None))
        if not hub.allowed(token):
            self.set_status(403)
            self.finish({"message": DENIED})
            return
        group = GROUP_OF_TOKEN[token]
        seen = [u for u in hub.users.values() if group is None or group in u["groups"]]
        offset = int(self.get_argument("offset", "0"))
        following = {"offset": offset + 2} if offset + 2 < len(seen) else None
        self.finish({"items": seen[offset:offset + 2],
                     "_pagination": {"offset": offset, "next": following}})


class HubServer(web.RequestHandler):
    def check_xsrf_cookie(self) -> None:
        pass

    def _allowed(self, name: str) -> bool:
        hub: Hub = self.settings["hub"]
        token = self.request.headers.get("Authorization", "")
        body = json.loads(self.request.body) if self.request.body else None
        hub.calls.append((self.request.method, name, token, body))
        if name not in hub.users or not hub.allowed(token, name):
            self.set_status(403)
            self.finish({"message": DENIED})
            return False
        return True

    def post(self, name: str) -> None:
        if not self._allowed(name):
            return
        user = self.settings["hub"].users[name]
        if user["servers"].get(""):
            self.set_status(400)
            self.finish({"message": f"{name} is already running"})
            return
        user["servers"][""] = {"ready": False, "pending": "spawn",
                               "user_options": json.loads(self.request.body)}
        self.set_status(202)
        self.finish()

    def delete(self, name: str) -> None:
        if not self._allowed(name):
            return
        user = self.settings["hub"].users[name]
        if not user["servers"].get(""):
            self.set_status(400)
            self.finish({"message": f"{name}'s server is not running"})
            return
        user["servers"].pop("")
        self.set_status(204)
        self.finish()


class UserTokens(FakeHubAuth):
    """The fake OAuth also hands over the visitor's hub token."""

    def get_token(self, handler, in_cookie=True):
        return f"user-{handler.request.headers.get('X-Test-User', '')}"


class Api:
    def __init__(self, port: int, hub: Hub, prewarmer: class_api.Prewarmer, url: str):
        self.base = f"http://127.0.0.1:{port}/services/usage/api/classes"
        self.client = AsyncHTTPClient()
        self.hub = hub
        self.prewarmer = prewarmer
        self.url = url

    async def call(self, method: str, path: str = "", who: str = "prof-ada", body=None):
        headers = {"X-Test-User": who, "Content-Type": "application/json"}
        data = None if method in ("GET", "DELETE") else json.dumps(body or {})
        r = await self.client.fetch(self.base + path, method=method, headers=headers,
                                    body=data, raise_error=False, follow_redirects=False)
        return r.code, json.loads(r.body) if r.body else None

    def hub_calls(self, method: str | None = None):
        return [c for c in self.hub.calls if method is None or c[0] == method]


@pytest.fixture
async def api(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'usage.sqlite'}"
    ledger = Ledger(url)
    now = time.time()
    with ledger.engine.begin() as connection:  # alice's open session, two samples
        connection.execute(sessions.insert().values(
            user_name="alice", container="jupyter-alice", role="gpu-lab", image="pytorch",
            cpu_limit=2.0, mem_limit=4 << 30, requested=now - 600, started=now - 590,
            last_seen=now - 5, cpu_samples=2, cpu_sum=1.5, cpu_peak=1.0, mem_samples=2,
            mem_sum=float(3 << 30), mem_peak=2 << 30, gpu_count=1))
    ledger.dispose()
    quota = tmp_path / "quotas.yaml"
    text = (ROOT / "hub_config" / "quotas.yaml").read_text()
    edited = text.replace("cs101: [student, gpu-lab]",
                          "cs101: [student]\n    cs101-gpu: [gpu-lab]")
    assert edited != text
    quota.write_text(edited)
    gpu_file = tmp_path / "quota-spawner-gpu-usage.json"
    gpu_file.write_text(json.dumps({
        "version": 1, "time": now, "interval": 5, "gpus": {},
        "servers": {"jupyter-alice": {"user": "alice", "role": "gpu-lab", "gpus": ["GPU-1"],
                                      "gpu_memory": {"GPU-1": 1 << 30}}}}))
    two = {**INSTRUCTOR, "name": "prof-bo",
           "scopes": ["access:services!service=usage", f"{USAGE_SCOPE}!group=ml-platform"]}
    auth = UserTokens({"admin": ADMIN, "prof-ada": INSTRUCTOR, "carol": PLAIN,
                       "finance": VIEWER, "prof-bo": two})
    monkeypatch.setattr(service.UsageHandler, "hub_auth", property(lambda self: auth))
    hub = Hub()
    hub_app = web.Application([(r"/hub/api/users", HubUsers),
                               (r"/hub/api/users/([^/]+)/server", HubServer)], hub=hub)
    hub_sock, hub_port = bind_unused_port()
    hub_server = HTTPServer(hub_app)
    hub_server.add_sockets([hub_sock])
    config = class_api.ClassConfig(hub_api_url=f"http://127.0.0.1:{hub_port}/hub/api",
                                   service_token=SERVICE_TOKEN, hub_base="/",
                                   gpu_usage_file=str(gpu_file))
    reader = service.LedgerReader(url)
    prefix = "/services/usage/"
    app = web.Application(class_api.routes(prefix, config), cookie_secret="x",
                          usage_reader=reader, usage_quota_file=str(quota),
                          usage_prefix=prefix)
    sock, port = bind_unused_port()
    server = HTTPServer(app)
    server.add_sockets([sock])
    yield Api(port, hub, class_api.Prewarmer(config, reader), url)
    server.stop()
    hub_server.stop()
    reader._pool.shutdown(wait=False)


async def test_an_instructor_sees_their_class_only(api):
    code, found = await api.call("GET")
    assert (code, found) == (200, {"classes": [{"name": "cs101"}], "admin": False})
    code, found = await api.call("GET", "/cs101")
    assert code == 200, found
    rows = {m["name"]: m for m in found["members"]}
    assert list(rows) == ["alice", "student1", "student2"]
    alice = rows["alice"]
    assert (alice["state"], alice["role"], alice["image"]) == ("running", "gpu-lab", "pytorch")
    assert alice["last_activity"] == "2027-01-05T09:00:00Z"
    assert alice["cpu"] == 0.75 and alice["memory_peak"] == 2 << 30
    assert alice["memory_limit"] == 4 << 30 and alice["gpu_memory"] == 1 << 30
    assert alice["url"] == "/user/alice/"
    assert rows["student1"]["state"] == "stopped" and rows["student1"]["cpu"] is None
    assert found["gpu_usage"] == "fresh"
    # only student is held by every member: the picker offers nothing wider
    assert found["choices"] == [{"role": "student", "image": "pytorch"}]
    # and what only some hold, with who lacks it, so the page can say why it is not offered
    assert found["partial_choices"] == [
        {"role": "gpu-lab", "image": "pytorch", "lacking": ["student1", "student2"]}]
    # the hub was asked with the instructor's own token, never the service's
    assert {c[2] for c in api.hub.calls} == {"token user-prof-ada"}


async def test_another_group_is_refused_without_asking_the_hub(api):
    for method, path, body in [("GET", "/ml-platform", None),
                               ("POST", "/ml-platform/stop", {"all": True}),
                               ("POST", "/ml-platform/prewarm",
                                {"role": "student", "image": "pytorch"}),
                               ("GET", "/ml-platform/schedules", None),
                               ("DELETE", "/ml-platform/schedules/1", None)]:
        code, found = await api.call(method, path, body=body)
        assert code == 403, (method, path)
        assert found["message"] == "You manage the servers of cs101 only, not of ml-platform."
    for who in ("carol", "finance"):  # no instructor, a viewer of every session neither
        code, found = await api.call("GET", "/cs101", who=who)
        assert code == 403 and "instructors of a class" in found["message"]
    assert api.hub.calls == []


async def test_the_hubs_refusal_is_passed_on(api):
    # prof-bo's usage scope names ml-platform, but the hub gives his token nothing there
    code, found = await api.call("POST", "/ml-platform/stop", who="prof-bo",
                                 body={"users": ["bob"]})
    assert code == 403
    assert found["message"].startswith("The hub refused to list the members of ml-platform")
    assert DENIED in found["message"]


async def test_an_admin_sees_every_group(api):
    code, found = await api.call("GET", who="admin")
    assert code == 200
    assert [c["name"] for c in found["classes"]] == ["cs101", "cs101-gpu", "ml-platform"]
    code, found = await api.call("GET", "/ml-platform", who="admin")
    assert code == 200 and [m["name"] for m in found["members"]] == ["bob"]


async def test_stop_one_and_all(api):
    code, found = await api.call("POST", "/cs101/stop", body={"users": ["alice"]})
    assert code == 200, found
    assert found["results"] == [{"user": "alice", "outcome": "stopped", "message": ""}]
    assert api.hub_calls("DELETE") == [("DELETE", "alice", "token user-prof-ada", None)]
    code, found = await api.call("POST", "/cs101/stop", body={"users": ["bob"]})
    assert code == 400 and found["message"] == "bob is not a member of cs101."
    code, found = await api.call("POST", "/cs101/stop", body={})
    assert code == 400
    # all: only the servers that run
    await api.call("POST", "/cs101/prewarm", body={"role": "student", "image": "pytorch"})
    api.hub.calls.clear()
    code, found = await api.call("POST", "/cs101/stop", body={"all": True})
    assert code == 200
    assert sorted(r["user"] for r in found["results"]) == ["alice", "student1", "student2"]
    assert {r["outcome"] for r in found["results"]} == {"stopped"}
    assert all(not u["servers"] for u in api.hub.users.values())


async def test_prewarm_now_starts_the_stopped_servers_with_the_options(api):
    code, found = await api.call("POST", "/cs101/prewarm",
                                 body={"role": "student", "image": "pytorch"})
    assert code == 200, found
    assert found["results"] == [
        {"user": "alice", "outcome": "skipped", "message": "The server is running already."},
        {"user": "student1", "outcome": "starting", "message": ""},
        {"user": "student2", "outcome": "starting", "message": ""}]
    assert sorted(api.hub_calls("POST")) == [
        ("POST", name, "token user-prof-ada", {"profile": "student", "image": "pytorch"})
        for name in ("student1", "student2")]
    _, found = await api.call("GET", "/cs101")
    assert {m["name"]: m["state"] for m in found["members"]} == {
        "alice": "running", "student1": "starting", "student2": "starting"}


async def test_a_role_not_every_member_holds_is_refused(api):
    code, found = await api.call("POST", "/cs101/prewarm",
                                 body={"role": "gpu-lab", "image": "pytorch"})
    assert code == 400
    assert found["message"].startswith(
        "Not every member of cs101 may start gpu-lab with pytorch: student1 and student2")
    code, found = await api.call("POST", "/cs101/prewarm",
                                 body={"role": "student", "image": "paddle"})
    assert code == 400
    code, found = await api.call("POST", "/cs101/prewarm",
                                 body={"role": "student", "image": "pytorch", "at": "soon"})
    assert code == 400 and "'at'" in found["message"]
    assert api.hub_calls("POST") == []


async def test_schedules_are_stored_listed_cancelled_and_run_when_due(api):
    at = time.time() + 3600
    code, first = await api.call("POST", "/cs101/prewarm",
                                 body={"role": "student", "image": "pytorch", "at": at})
    assert code == 201, first
    assert (first["group"], first["role"], first["image"], first["at"], first["state"],
            first["created_by"]) == ("cs101", "student", "pytorch", at, "pending", "prof-ada")
    assert api.hub_calls("POST") == []  # nothing started yet
    code, second = await api.call("POST", "/cs101/prewarm",
                                  body={"role": "student", "image": "pytorch", "at": at + 60})
    code, found = await api.call("GET", "/cs101/schedules")
    assert [s["id"] for s in found["schedules"]] == [first["id"], second["id"]]
    code, gone = await api.call("DELETE", f"/cs101/schedules/{second['id']}")
    assert code == 200 and gone["state"] == "cancelled"
    code, found = await api.call("DELETE", f"/cs101/schedules/{second['id']}")
    assert code == 409
    assert (await api.call("DELETE", "/cs101/schedules/999"))[0] == 404

    # not due yet: nothing runs
    assert await api.prewarmer.run_due(now=at - 1) == []
    api.hub.calls.clear()
    (ran,) = await api.prewarmer.run_due(now=at + 1)
    assert ran["id"] == first["id"] and ran["state"] == "done"
    assert ran["result"].splitlines() == [
        "alice: skipped (The server is running already.)", "student1: starting",
        "student2: starting"]
    # with the service's own token, and only once
    assert {c[2] for c in api.hub.calls} == {f"token {SERVICE_TOKEN}"}
    assert sorted(c[1] for c in api.hub_calls("POST")) == ["student1", "student2"]
    assert await api.prewarmer.run_due(now=at + 2) == []
    _, found = await api.call("GET", "/cs101/schedules")
    assert [s["state"] for s in found["schedules"]] == ["cancelled", "done"]  # newest first


async def test_a_schedule_the_hub_refuses_is_marked_failed(api, monkeypatch):
    monkeypatch.setitem(GROUP_OF_TOKEN, f"token {SERVICE_TOKEN}", "ml-platform")
    code, planned = await api.call("POST", "/cs101/prewarm",
                                   body={"role": "student", "image": "pytorch",
                                         "at": time.time() + 10})
    assert code == 201
    (ran,) = await api.prewarmer.run_due(now=time.time() + 20)
    assert ran["state"] == "failed" and "cs101 has no members" in ran["result"]
    # the service lists everyone but may start nobody of cs101
    monkeypatch.setitem(GROUP_OF_TOKEN, f"token {SERVICE_TOKEN}", None)
    api.hub.users["student1"]["groups"] = ["cs101", "ml-platform"]
    code, planned = await api.call("POST", "/cs101/prewarm",
                                   body={"role": "student", "image": "pytorch",
                                         "at": time.time() + 10})
    monkeypatch.setattr(api.hub, "allowed", lambda token, name=None: name in (None, "student1"))
    (ran,) = await api.prewarmer.run_due(now=time.time() + 20)
    assert ran["state"] == "failed"
    assert "student1: starting" in ran["result"]
    assert f"student2: refused ({DENIED})" in ran["result"]


async def test_a_server_outside_the_tokens_filter_is_refused(monkeypatch):
    # the hub's answer when the token holds servers!user=… or !group=… but not this one
    async def hub_call(config, token, method, path, body=None):
        return 404, {"status": 404, "message": "No access to resources or resources not found"}

    monkeypatch.setattr(class_api, "hub_call", hub_call)
    config = class_api.ClassConfig(hub_api_url="http://hub/hub/api")
    for act in (class_api.stop_one(config, "t", "ann"),
                class_api.start_one(config, "t", "ann", {"profile": "student"})):
        assert await act == {"user": "ann", "outcome": "refused",
                             "message": "No access to resources or resources not found"}


def test_the_service_scopes_of_the_classes():
    assert classes.class_service_scopes({"cs102": ["prof-bo"], "cs101": ["prof-ada"]}) == [
        "servers!group=cs101", "servers!group=cs102"]


def test_the_shipped_hub_config_gives_the_service_its_class_scopes(tmp_path, monkeypatch):
    from test_hub_config import load_hub_config

    c = load_hub_config(tmp_path, monkeypatch, QUOTA_SPAWNER_DEMO="1")
    (usage,) = [s for s in c.JupyterHub.services if s["name"] == "usage"]
    for scope in classes.CLASS_OAUTH_SCOPES:
        assert scope in usage["oauth_client_allowed_scopes"]
    (own,) = [r for r in c.JupyterHub.load_roles if r["name"] == "usage-service"]
    assert "servers!group=cs101" in own["scopes"]
    assert usage["environment"]["QUOTA_SPAWNER_STATE_DIR"] == c.QuotaSpawner.state_dir


def test_the_link_to_a_server_is_escaped_as_the_hub_escapes_it():
    user = {"name": "a b/<c>@~", "servers": {"": {"ready": True, "pending": None}}}
    row = classes.member_row(user, {}, {}, False, "/jh/")
    assert row["url"] == "/jh/user/a%20b%2F%3Cc%3E@~/"


def test_the_prewarm_interval_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv(class_api.PREWARM_INTERVAL_ENV, raising=False)
    assert class_api.prewarm_interval() == 30.0
    monkeypatch.setenv(class_api.PREWARM_INTERVAL_ENV, "2")
    assert class_api.prewarm_interval() == 2.0
    monkeypatch.setenv(class_api.PREWARM_INTERVAL_ENV, "soon")
    assert class_api.prewarm_interval() == 30.0


def test_the_gpu_memory_needs_a_fresh_file():
    usage = {"version": 1, "time": 100.0, "interval": 5,
             "servers": {"a": {"user": "u", "gpu_memory": {"G1": 10, "G2": 5}},
                         "b": {"user": "u", "gpu_memory": {"G3": 1}}}}
    assert classes.gpu_memory_by_user(usage, 101.0) == {"u": 16}
    assert classes.gpu_memory_by_user(usage, 200.0) == {}
    assert classes.gpu_memory_by_user(None, 101.0) == {}


def test_schedules_in_the_ledger(tmp_path):
    ledger = Ledger(f"sqlite:///{tmp_path / 'l.sqlite'}")
    engine = ledger.engine
    one = classes.add_schedule(engine, "cs101", "student", "pytorch", 50.0, "prof-ada", 1.0)
    two = classes.add_schedule(engine, "cs101", "student", "pytorch", 20.0, "prof-ada", 1.0)
    assert [s["id"] for s in classes.due(engine, 60.0)] == [two["id"], one["id"]]
    assert classes.due(engine, 10.0) == []
    assert classes.cancel(engine, "cs102", one["id"]) == (False, None)
    assert classes.cancel(engine, "cs101", one["id"]) == (True, "pending")
    assert classes.cancel(engine, "cs101", one["id"]) == (False, "cancelled")
    assert classes.finish(engine, one["id"], "done", "x") is False  # cancelled meanwhile
    assert classes.finish(engine, two["id"], "done", "all started") is True
    assert classes.cancel(engine, "cs101", two["id"]) == (False, "done")
    assert classes.due(engine, 60.0) == []
    ledger.dispose()


# --- hostile input: checked before anything is stored ----------------------------------------


@pytest.mark.parametrize("at, words", [
    (1e18, "The pre-warm's time is more than 366 days ahead"),
    (time.time() + 367 * 86400, "The pre-warm's time is more than 366 days ahead"),
    (-5, "The pre-warm's time is before 1970"),
    ("tomorrow", "The request needs 'at', as a time in Unix seconds."),
    (True, "The request needs 'at', as a time in Unix seconds."),
])
async def test_a_prewarm_time_out_of_range_is_refused_and_nothing_stored(api, at, words):
    code, found = await api.call("POST", "/cs101/prewarm",
                                 body={"role": "student", "image": "pytorch", "at": at})
    assert code == 400 and words in found["message"], found
    assert (await api.call("GET", "/cs101/schedules"))[1] == {"schedules": []}
    assert api.hub_calls("POST") == []


async def test_nan_at_is_refused(api):
    r = await api.client.fetch(
        api.base + "/cs101/prewarm", method="POST", raise_error=False,
        headers={"X-Test-User": "prof-ada", "Content-Type": "application/json"},
        body='{"role": "student", "image": "pytorch", "at": NaN}')
    assert r.code == 400 and "NaN" in json.loads(r.body)["message"]
    assert (await api.call("GET", "/cs101/schedules"))[1] == {"schedules": []}


async def test_a_schedule_id_out_of_range_is_a_sentence(api):
    for method in ("GET", "DELETE"):
        code, found = await api.call(method, "/cs101/schedules/99999999999999999999")
        assert (code, found["message"]) == (400, (
            "'99999999999999999999' is not a schedule id: ids are whole numbers from 1 to "
            "9223372036854775807."))
