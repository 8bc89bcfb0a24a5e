"""The class dashboard without a hub or a browser: its JSON API and its pages. The OAuth
user is faked by webapp_client.py, and the hub's REST API by a small tornado app
that enforces the instructor's group as the hub's RBAC would. What the page does in a
browser is for test_browser_classes.py."""

from __future__ import annotations

import asyncio
import copy
import html
import json
import re
import time
from pathlib import Path

import pytest
from markupsafe import escape
from tornado import web
from tornado.httpclient import AsyncHTTPClient
from tornado.httpserver import HTTPServer
from webapp_client import (
    ADMIN,
    INSTRUCTOR,
    PLAIN,
    VIEWER,
    FakeHubAuth,
    PageSite,
    attribute,
    drawn,
    serve,
)

from spawner.hubconfig.rbac import CLASS_OAUTH_SCOPES, USAGE_SCOPE, class_service_scopes
from spawner.usage import schedules
from spawner.usage.documents import HOMES
from spawner.usage.ledger import Ledger
from spawner.usage.schema import sessions
from spawner.webapp import app as service
from spawner.webapp import classes
from spawner.webapp.access import NOT_AN_INSTRUCTOR
from spawner.webapp.base import BaseHandler, static_version
from spawner.webapp.formatting import ago, size
from spawner.webapp.hub_api import STOPS_AT_ONCE, HubApi
from spawner.webapp.prewarm import Prewarmer

ROOT = Path(__file__).resolve().parents[2]
SERVICE_TOKEN = "service-token"
PREWARM_INTERVAL_ENV = "QUOTA_SPAWNER_PREWARM_INTERVAL"

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
    def __init__(self, port: int, hub: Hub, prewarmer: Prewarmer, url: str):
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


BO = {**INSTRUCTOR, "name": "prof-bo",
      "scopes": ["access:services!service=usage", f"{USAGE_SCOPE}!group=ml-platform"]}
MODELS = {"admin": ADMIN, "prof-ada": INSTRUCTOR, "carol": PLAIN, "finance": VIEWER,
          "prof-bo": BO}


def seed(tmp_path: Path) -> tuple[str, Path]:
    """The ledger with alice's open session (two samples), the shipped table where cs101-gpu
    gives alice gpu-lab, and the watchdog's file, in tmp_path as the state folder."""
    url = f"sqlite:///{tmp_path / 'usage.sqlite'}"
    ledger = Ledger(url)
    now = time.time()
    with ledger.engine.begin() as connection:
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
    (tmp_path / "quota-spawner-gpu-usage.json").write_text(json.dumps({
        "version": 1, "time": now, "interval": 5, "gpus": {},
        "servers": {"jupyter-alice": {"user": "alice", "role": "gpu-lab", "gpus": ["GPU-1"],
                                      "gpu_memory": {"GPU-1": 1 << 30}}}}))
    return url, quota


def fake_hub() -> tuple[Hub, HTTPServer, str]:
    """The hub's users API on a port of its own: the fake, its server and its URL."""
    hub = Hub()
    hub_app = web.Application([(r"/hub/api/users", HubUsers),
                               (r"/hub/api/users/([^/]+)/server", HubServer)], hub=hub)
    hub_server, hub_port = serve(hub_app)
    return hub, hub_server, f"http://127.0.0.1:{hub_port}/hub/api"


@pytest.fixture
async def api(tmp_path, monkeypatch):
    url, quota = seed(tmp_path)
    auth = UserTokens(MODELS)
    monkeypatch.setattr(BaseHandler, "hub_auth", property(lambda self: auth))
    hub, hub_server, hub_api = fake_hub()
    app = service.make_app(usage_db=url, quota_file=str(quota), state_dir=str(tmp_path),
                           service_prefix="/services/usage/", hub_base_url="/",
                           hub_api_url=hub_api, hub_api_token=SERVICE_TOKEN)
    setup = app.settings["usage"]
    server, port = serve(app)
    yield Api(port, hub, Prewarmer(setup.hub, setup.reader), url)
    server.stop()
    hub_server.stop()
    setup.reader.close()


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
    # the members' names isolated (FSI … PDI): their bidi controls stay inside them
    assert found["message"].startswith(
        "Not every member of cs101 may start gpu-lab with pytorch: \u2068student1\u2069 and "
        "\u2068student2\u2069")
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
    assert ran["result"].splitlines() == [  # each name isolated: FSI … PDI
        "\u2068alice\u2069: skipped (The server is running already.)",
        "\u2068student1\u2069: starting", "\u2068student2\u2069: starting"]
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
    assert "\u2068student1\u2069: starting" in ran["result"]
    assert f"\u2068student2\u2069: refused ({DENIED})" in ran["result"]


async def test_a_server_outside_the_tokens_filter_is_refused(monkeypatch):
    # the hub's answer when the token holds servers!user=… or !group=… but not this one
    async def hub_call(hub, token, method, path, body=None):
        return 404, {"status": 404, "message": "No access to resources or resources not found"}

    monkeypatch.setattr(HubApi, "call", hub_call)
    hub = HubApi("http://hub/hub/api")
    for act in (hub.stop_server("t", "ann"),
                hub.start_server("t", "ann", {"profile": "student"})):
        assert await act == {"user": "ann", "outcome": "refused",
                             "message": "No access to resources or resources not found"}


async def test_a_class_is_stopped_side_by_side_within_the_bound(monkeypatch):
    # a class of 24: every stop asked before any is answered, up to STOPS_AT_ONCE at once
    asked: list[str] = []
    most = [0, 0]  # under way now, most ever
    enough = asyncio.Event()

    async def hub_call(hub, token, method, path, body=None):
        asked.append(path)
        most[0] += 1
        most[1] = max(most)
        if most[0] == STOPS_AT_ONCE:
            enough.set()
        await asyncio.wait_for(enough.wait(), 10)  # one at a time never gets here
        most[0] -= 1
        return 204, None

    monkeypatch.setattr(HubApi, "call", hub_call)
    names = [f"student{i}" for i in range(24)]
    results = await HubApi("http://hub/hub/api").stop_servers("t", names)
    assert [r["user"] for r in results] == names
    assert {r["outcome"] for r in results} == {"stopped"} and len(asked) == 24
    assert most[1] == STOPS_AT_ONCE


def test_the_service_scopes_of_the_classes():
    assert class_service_scopes({"cs102": ["prof-bo"], "cs101": ["prof-ada"]}) == [
        "servers!group=cs101", "servers!group=cs102"]


def test_the_shipped_hub_config_gives_the_service_its_class_scopes(tmp_path, monkeypatch):
    from shipped_config import load_hub_config

    c = load_hub_config(tmp_path, monkeypatch, QUOTA_SPAWNER_DEMO="1")
    (usage,) = [s for s in c.JupyterHub.services if s["name"] == "usage"]
    for scope in CLASS_OAUTH_SCOPES:
        assert scope in usage["oauth_client_allowed_scopes"]
    (own,) = [r for r in c.JupyterHub.load_roles if r["name"] == "usage-service"]
    assert "servers!group=cs101" in own["scopes"]
    assert usage["environment"]["QUOTA_SPAWNER_STATE_DIR"] == c.QuotaSpawner.state_dir


def test_the_link_to_a_server_is_escaped_as_the_hub_escapes_it():
    user = {"name": "a b/<c>@~", "servers": {"": {"ready": True, "pending": None}}}
    row = classes.member_row(user, {}, {}, False, "/jh/")
    assert row["url"] == "/jh/user/a%20b%2F%3Cc%3E@~/"


def test_the_prewarm_interval_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv(PREWARM_INTERVAL_ENV, raising=False)
    assert service.QuotaWebApp().prewarm_interval == 30.0
    monkeypatch.setenv(PREWARM_INTERVAL_ENV, "2")
    assert service.QuotaWebApp().prewarm_interval == 2.0
    monkeypatch.setenv(PREWARM_INTERVAL_ENV, "soon")
    assert service.QuotaWebApp().prewarm_interval == 30.0


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
    one = schedules.add(engine, "cs101", "student", "pytorch", 50.0, "prof-ada", 1.0)
    two = schedules.add(engine, "cs101", "student", "pytorch", 20.0, "prof-ada", 1.0)
    assert [s["id"] for s in schedules.due(engine, 60.0)] == [two["id"], one["id"]]
    assert schedules.due(engine, 10.0) == []
    assert schedules.cancel(engine, "cs102", one["id"]) == (False, None)
    assert schedules.cancel(engine, "cs101", one["id"]) == (True, "pending")
    assert schedules.cancel(engine, "cs101", one["id"]) == (False, "cancelled")
    assert schedules.finish(engine, one["id"], "done", "x") is False  # cancelled meanwhile
    assert schedules.finish(engine, two["id"], "done", "all started") is True
    assert schedules.cancel(engine, "cs101", two["id"]) == (False, "done")
    assert schedules.due(engine, 60.0) == []
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


# --- the page ----------------------------------------------------------------------------------

PREFIX = "/services/usage/"
SCRIPT = ROOT / "spawner" / "webapp" / "static" / "classes.js"
SCRIPT_VERSION = static_version("classes.js")  # in the scripts' URLs
FORMAT_VERSION = static_version("format.js")
LIVE_VERSION = static_version("live.js")
HOSTILE_USER = "<script>alert('u')</script>&"
HOSTILE_GROUP = "\"><img src=x onerror=alert('g')>/x"


class PageTokens(UserTokens):
    base_url = "/"  # where HubOAuth sets its XSRF cookie


class Site(PageSite):
    def __init__(self, port: int, hub: Hub, url: str):
        super().__init__(port, PREFIX)
        self.hub = hub
        self.url = url


@pytest.fixture
async def site(tmp_path, monkeypatch):
    url, quota = seed(tmp_path)
    auth = PageTokens(MODELS)
    monkeypatch.setattr(BaseHandler, "hub_auth", property(lambda self: auth))
    hub, hub_server, hub_api = fake_hub()
    # the pages and the API read the hub's address as the service does, from its environment
    monkeypatch.setenv("JUPYTERHUB_API_URL", hub_api)
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "service-token")
    monkeypatch.setenv("JUPYTERHUB_BASE_URL", "/")
    monkeypatch.setenv("QUOTA_SPAWNER_STATE_DIR", str(tmp_path))
    app = service.make_app(usage_db=url, quota_file=str(quota), service_prefix=PREFIX)
    server, port = serve(app)
    yield Site(port, hub, url)
    server.stop()
    hub_server.stop()
    app.settings["usage"].reader.close()


def row(page: str, user: str) -> str:
    found = re.search(rf'<tr data-user="{re.escape(str(escape(user)))}">(.*?)</tr>', page,
                      re.S)
    assert found, user
    return found.group(1)


def cell(row_html: str, name: str) -> str:
    found = re.search(rf'<td class="[^"]*\b{name}\b[^"]*"[^>]*>(.*?)</td>', row_html, re.S)
    assert found, name
    return html.unescape(re.sub(r"<[^>]+>", "", found.group(1))).strip()


async def test_an_instructor_lists_their_classes_only(site):
    r = await site.get("classes", "prof-ada")
    assert r.code == 200, r.body
    page = r.body.decode()
    assert re.findall(r'<ul id="classes">(.*?)</ul>', page, re.S)[0].count("<li>") == 1
    assert f'<a href="{PREFIX}classes/cs101">cs101</a>' in page
    assert "ml-platform" not in page
    assert "Signed in as" in page and "Back to the hub" in page  # base.html's frame
    assert site.hub.calls == []  # an instructor's classes come from their scopes


async def test_an_admin_lists_every_group(site):
    site.hub.users[HOSTILE_USER] = {"name": HOSTILE_USER, "groups": [HOSTILE_GROUP],
                                    "servers": {}}
    page = (await site.get("classes", "admin")).body.decode()
    listed = re.findall(r'<ul id="classes">(.*?)</ul>', page, re.S)[0]
    links = dict((html.unescape(name), html.unescape(link)) for link, name in re.findall(
        r'<li><a href="([^"]*)">([^<]*)</a></li>', listed))
    assert links == {
        "cs101": f"{PREFIX}classes/cs101", "cs101-gpu": f"{PREFIX}classes/cs101-gpu",
        "ml-platform": f"{PREFIX}classes/ml-platform",
        HOSTILE_GROUP: f"{PREFIX}classes/%22%3E%3Cimg%20src%3Dx%20onerror%3Dalert%28%27g%27%29%3E%2Fx"}
    assert "<img src=x" not in page


async def test_a_student_and_a_viewer_are_refused_with_a_sentence(site):
    for who in ("carol", "finance"):
        for path in ("classes", "classes/cs101"):
            r = await site.get(path, who)
            assert r.code == 403, (who, path)
            assert r.headers["Content-Type"].startswith("text/html")
            assert str(escape(NOT_AN_INSTRUCTOR)) in r.body.decode()
    assert site.hub.calls == []


async def test_the_instructor_of_another_class_is_refused_before_the_hub_is_asked(site):
    r = await site.get("classes/ml-platform", "prof-ada")
    assert r.code == 403
    assert "You manage the servers of cs101 only, not of ml-platform." in r.body.decode()
    assert site.hub.calls == []
    # a usage scope naming the class is not enough: the hub's refusal is passed on
    r = await site.get("classes/ml-platform", "prof-bo")
    assert r.code == 403
    assert "The hub refused to list the members of ml-platform for you" in r.body.decode()


async def test_the_dashboard_shows_each_member(site):
    r = await site.get("classes/cs101", "prof-ada")
    assert r.code == 200, r.body
    page = r.body.decode()
    assert re.findall(r'<tr data-user="([^"]*)">', page) == ["alice", "student1", "student2"]
    alice = row(page, "alice")
    assert cell(alice, "state") == "running"
    assert cell(alice, "role") == "gpu-lab · pytorch"
    assert cell(alice, "cpu") == "0.75 of 2 cores"
    assert cell(alice, "memory") == "1.5 GiB of 4 GiB"
    assert cell(alice, "gpu") == "1 GiB"
    assert re.search(r"\d+ days ago|h ago|min ago|just now", cell(alice, "activity"))
    assert 'class="open" href="/user/alice/"' in alice and " hidden" not in alice
    assert re.search(r'<button type="button" class="stop"[^>]*>Stop</button>', alice)
    student = row(page, "student1")
    assert cell(student, "state") == "stopped" and cell(student, "activity") == "never"
    assert cell(student, "cpu") == "–" and cell(student, "role") == "–"
    assert re.search(r'<a class="open"[^>]*\shidden>', student)
    assert re.search(r'class="stop"[^>]* disabled>', student)
    # the picker: what every member holds; what only some hold, with who lacks it
    options = re.findall(r'<option value="([^"]*)">([^<]*)</option>', page)
    # an option is text: its names isolated with FSI … PDI; elsewhere each is a <bdi>
    assert [(json.loads(html.unescape(v)), t) for v, t in options] == [
        (["student", "pytorch"], "\u2068student\u2069 with \u2068pytorch\u2069")]
    assert ("<bdi>gpu-lab</bdi> with <bdi>pytorch</bdi>: not held by <bdi>student1</bdi>, "
            "<bdi>student2</bdi>") in page
    assert "<bdi>gpu-lab</bdi> · <bdi>pytorch</bdi>" in alice
    assert 'id="stop-all"' in page and 'id="prewarm-at"' in page
    assert 'type="datetime-local"' in page
    # what the script needs, and nothing it would have to fetch from elsewhere
    assert attribute(page, "data-api") == PREFIX + "api/classes/cs101"
    assert attribute(page, "data-xsrf")
    assert attribute(page, "data-group") == "cs101"
    assert re.findall(r"<script\b[^>]*>", page) == [
        f'<script src="{PREFIX}static/format.js?v={FORMAT_VERSION}" defer>',
        f'<script src="{PREFIX}static/live.js?v={LIVE_VERSION}" defer>',
        f'<script src="{PREFIX}static/classes.js?v={SCRIPT_VERSION}" defer>']
    for label in ('<label for="prewarm-choice">', '<label for="prewarm-at">'):
        assert label in page
    assert {c[2] for c in site.hub.calls} == {"token user-prof-ada"}


async def test_the_page_allows_its_own_scripts_only(site):
    r = await site.get("classes/cs101", "prof-ada")
    csp = dict(part.strip().split(" ", 1) for part in
               r.headers["Content-Security-Policy"].split(";"))
    assert csp["script-src"] == "'self'" and csp["default-src"] == "'none'"
    assert csp["connect-src"] == "'self'"
    assert "<script>" not in r.body.decode() and "http://" not in r.body.decode()
    r = await site.get(f"static/classes.js?v={SCRIPT_VERSION}")
    assert r.code == 200 and r.headers["Content-Type"].startswith("text/javascript")


def test_the_script_writes_names_as_text_only():
    script = SCRIPT.read_text() + (SCRIPT.parent / "live.js").read_text()
    for forbidden in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write",
                      "window.confirm", "alert(", "eval(", "http://", "https://"):
        assert forbidden not in script, forbidden


async def test_the_script_gets_the_dashboard_as_the_page_draws_it(site):
    """The dashboard is drawn in one place: asked for HTML only, the class's API answers
    with the page's own drawing (its main block), from which the page's script patches the
    members, the picker and the schedules; every other client gets the JSON."""
    page = (await site.get("classes/cs101", "prof-ada")).body.decode()
    r = await site.get("api/classes/cs101", "prof-ada", headers={"Accept": "text/html"})
    assert r.code == 200 and r.headers["Content-Type"].startswith("text/html")
    live = r.body.decode()
    assert "<header>" not in live and "<script" not in live
    for part in ("members-body", "prewarm-choice", "lacking", "schedules-body"):
        assert re.search(rf'id="{part}"', live), part
    assert cell(row(live, "alice"), "cpu") == "0.75 of 2 cores"
    assert drawn(live) in drawn(page)
    r = await site.get("api/classes/cs101", "prof-ada", headers={"Accept": "*/*"})
    assert json.loads(r.body)["group"] == "cs101"
    r = await site.get("api/classes/ml-platform", "prof-ada", headers={"Accept": "text/html"})
    assert r.code == 403
    assert json.loads(r.body) == {
        "message": "You manage the servers of cs101 only, not of ml-platform."}


def test_the_dashboard_is_drawn_and_worded_by_the_service_only():
    """The rows, the picker and the schedules are the template's: the script makes none of
    them and writes none of their text (classes.py's *_text and formatting.py's filters)."""
    script = SCRIPT.read_text(encoding="utf-8")
    for words in ("cores", "not held by", "make(\"tr\")", "make(\"option\"", "data.members",
                  "data.schedules", "memory_limit", "ago(", "size("):
        assert words not in script, words


async def test_hostile_names_are_escaped(site):
    site.hub.users[HOSTILE_USER] = {
        "name": HOSTILE_USER, "groups": ["cs101", HOSTILE_GROUP], "last_activity": None,
        "servers": {"": {"ready": True, "pending": None,
                         "user_options": {"profile": "<b>r</b>", "image": "<i>i</i>"}}}}
    page = (await site.get("classes/cs101", "prof-ada")).body.decode()
    assert "<script>alert" not in page and "<b>r</b>" not in page
    hostile = row(page, HOSTILE_USER)
    assert str(escape(HOSTILE_USER)) in hostile
    assert cell(hostile, "role") == "<b>r</b> · <i>i</i>"
    link = re.search(r'class="open" href="([^"]*)"', hostile).group(1)
    assert html.unescape(link) == "/user/%3Cscript%3Ealert%28%27u%27%29%3C%2Fscript%3E%26/"
    # a hostile group, as an admin opens it
    quoted = classes.class_link(PREFIX, HOSTILE_GROUP)[len(PREFIX):]
    r = await site.get(quoted, "admin")
    assert r.code == 200, r.body
    page = r.body.decode()
    assert "<img src=x" not in page
    assert attribute(page, "data-group") == HOSTILE_GROUP
    assert attribute(page, "data-api") == classes.class_link(PREFIX + "api/", HOSTILE_GROUP)
    assert re.findall(r'<tr data-user="([^"]*)">', page) == [str(escape(HOSTILE_USER))]


async def test_schedules_are_shown_with_a_cancel_button_while_pending(site):
    engine = Ledger(site.url).engine
    at = time.time() + 3600
    pending = schedules.add(engine, "cs101", "student", "pytorch", at, "prof-ada")
    done = schedules.add(engine, "cs101", "student", "pytorch", at - 7200, "admin")
    schedules.finish(engine, done["id"], schedules.DONE, "student1: starting\nstudent2: starting")
    engine.dispose()
    page = (await site.get("classes/cs101", "prof-ada")).body.decode()
    rows = re.findall(r'<tr data-id="(\d+)">(.*?)</tr>', page, re.S)
    assert [int(i) for i, _ in rows] == [pending["id"], done["id"]]
    assert f'class="cancel secondary"\n          data-id="{pending["id"]}"' in rows[0][1]
    assert "cancel" not in rows[1][1]
    assert "student1: starting\nstudent2: starting" in rows[1][1]
    assert 'id="no-schedules" hidden' in page


def test_the_text_of_a_row():
    assert size(None) == "–"
    assert size(512 << 20) == "512 MiB"
    assert size(3 << 29) == "1.5 GiB"
    assert classes.cpu_text({"cpu": 0.5, "cpu_limit": 0.5}) == "0.50 of 0.5 cores"
    assert classes.cpu_text({"cpu": 1.0, "cpu_limit": None}) == "1.00 cores"
    assert ago("2027-01-05T09:00:00.123456Z", 1799139600.0 + 125) == "2 min ago"
    assert ago(None, 0) == "never"
    assert USERS  # the fake hub's users, shared by the API's and the pages' tests


async def test_refusal_pages_are_titled_by_the_page_refused(site):
    r = await site.get("classes", "carol")
    assert r.code == 403 and "<title>Classes</title>" in r.body.decode()


async def test_a_schedule_stored_at_an_absurd_time_never_breaks_the_page(site):
    """Stored before the API checked 'at': the page shows it, and it can be cancelled."""
    ledger = Ledger(site.url, create=False)
    planned = schedules.add(ledger.engine, "cs101", "student", "pytorch", 1e18,
                                   "prof-ada", time.time())
    ledger.dispose()
    for who in ("prof-ada", "admin"):
        r = await site.get("classes/cs101", who)
        assert r.code == 200, r.body[:300]
        assert "an invalid time (1e+18)" in r.body.decode()
    r = await site.client.fetch(
        f"{site.base}api/classes/cs101/schedules/{planned['id']}", method="DELETE",
        headers={"X-Test-User": "prof-ada"}, raise_error=False)
    assert r.code == 200 and json.loads(r.body)["state"] == "cancelled"


# --- the members' homes ------------------------------------------------------------------


def write_homes(folder: Path, at: float) -> None:
    """A watchdog's homes document, as a watchdog without a ledger writes it into the state
    folder: alice's server runs on her home (18 of 20 GiB); student1's home is there
    without a server (1 of 5 GiB); student2 has none yet."""
    (folder / HOMES.file).write_text(json.dumps({
        "version": 1, "node": "gpu-host-1", "at": at, "interval": 5, "mechanism": "btrfs",
        "enforced": True, "sentence": "Homes are btrfs subvolumes", "filesystem": None,
        "homes": [{"user": "alice", "name": "alice", "used": 18 << 30, "limit": 20 << 30},
                  {"user": None, "name": "student1", "used": 1 << 30, "limit": 5 << 30}]}))


async def test_each_members_home_is_shown_with_its_size_server_running_or_not(api, tmp_path):
    code, found = await api.call("GET", "/cs101")
    assert found["disk"] == "missing"  # no watchdog reads the homes: nothing to show
    assert {m["name"]: m["home_used"] for m in found["members"]} == {
        "alice": None, "student1": None, "student2": None}
    write_homes(tmp_path, time.time())
    code, found = await api.call("GET", "/cs101")
    assert code == 200 and found["disk"] == "fresh"
    homes = {m["name"]: (m["home_used"], m["home_limit"]) for m in found["members"]}
    assert homes == {"alice": (18 << 30, 20 << 30), "student1": (1 << 30, 5 << 30),
                     "student2": (None, None)}
    write_homes(tmp_path, time.time() - 600)  # the watchdog stopped reading them
    code, found = await api.call("GET", "/cs101")
    assert found["disk"] == "stale" and found["members"][0]["home_used"] is None


async def test_the_dashboard_shows_each_members_home(site, tmp_path):
    page = (await site.get("classes/cs101", "prof-ada")).body.decode()
    assert '<th scope="col">Home</th>' in page and cell(row(page, "alice"), "home") == "–"
    write_homes(tmp_path, time.time())
    page = (await site.get("classes/cs101", "prof-ada")).body.decode()
    assert cell(row(page, "alice"), "home") == "18 GiB of 20 GiB"
    assert cell(row(page, "student1"), "home") == "1 GiB of 5 GiB"
    assert cell(row(page, "student2"), "home") == "–"
    assert 'id="home-note"' not in page
    write_homes(tmp_path, time.time() - 600)
    page = (await site.get("classes/cs101", "prof-ada")).body.decode()
    assert "Homes are not shown: the watchdog's figures of the homes are stale." in \
        " ".join(page.split())
    assert cell(row(page, "alice"), "home") == "–"


def test_a_members_home_is_the_one_their_server_runs_on_else_the_one_named_for_them():
    now = 1000.0
    document = {"version": 1, "node": "n", "at": now, "homes": [
        {"user": "Ann", "name": "custom-ann", "used": 1, "limit": 2},  # an admin's own naming
        {"user": None, "name": "-4f-27-42rien", "used": 3, "limit": None},  # O'Brien's
        {"user": None, "name": "ann", "used": 9, "limit": 9}]}
    state, homes = classes.homes_of([document], ["Ann", "O'Brien", "nobody", ".."], now)
    assert state == "fresh"
    assert {name: (h.used, h.limit) for name, h in homes.items()} == {
        "Ann": (1, 2), "O'Brien": (3, None)}
    assert classes.home_text({"home_used": 3 << 30, "home_limit": None}) == "3 GiB"
    assert classes.homes_of([document], ["Ann"], now + 600)[0] == "stale"
    assert classes.homes_of([{"version": 2}], ["Ann"], now) == ("missing", {})
