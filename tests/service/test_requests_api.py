"""Requests for a bigger role: the usage service's JSON API without a hub. The OAuth user
is faked by webapp_client.py, the hub's REST API (a user's groups) by a small
tornado app, as in test_table.py."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from requests_cases import DAY, DORA, HUB_ID, NOW, OTHER_INSTRUCTOR, STUDENT, table
from shipped_config import GOOD_ADMIN, GOOD_USER, load_hub_config
from sqlalchemy import create_engine
from tornado import web
from tornado.httpclient import AsyncHTTPClient
from webapp_client import ADMIN, HUB_TOKEN, INSTRUCTOR, PLAIN, VIEWER, FakeHubAuth, serve

from spawner.usage import event_store
from spawner.usage.ledger import Ledger
from spawner.webapp import app as service
from spawner.webapp import requests as requests_api
from spawner.webapp.base import BaseHandler

GROUPS = {"student1": ["cs101"], "bob": ["ml-platform"], "dora": ["cs102"],
          "carol": [], "prof-ada": ["cs101-staff"], "prof-bo": ["cs102-staff"]}
BOB = {**STUDENT, "name": "bob"}


class FakeHubUser(web.RequestHandler):
    """GET /hub/api/users/<name>: the user's groups, with the service's token only."""

    def get(self, name: str) -> None:
        if self.request.headers.get("Authorization") != f"token {HUB_TOKEN}":
            raise web.HTTPError(403)
        if name not in GROUPS:
            raise web.HTTPError(404)
        self.finish({"name": name, "groups": GROUPS[name]})


class Api:
    def __init__(self, port: int, url: str, quota: Path):
        self.base = f"http://127.0.0.1:{port}/services/usage/"
        self.client = AsyncHTTPClient()
        self.url = url  # the ledger, whose events table the service appends to
        self.quota = quota

    async def call(self, method: str, path: str, who: str, body=None,
                   content_type: str = "application/json"):
        data = None if body is None else (body if isinstance(body, str) else json.dumps(body))
        if method == "POST" and data is None:
            data = "{}"
        r = await self.client.fetch(self.base + path, method=method, body=data,
                                    headers={"X-Test-User": who, "Content-Type": content_type},
                                    raise_error=False, follow_redirects=False)
        try:
            found = json.loads(r.body) if r.body else None
        except ValueError:
            found = r.body.decode()
        return r.code, found

    async def get(self, path: str, who: str):
        return await self.call("GET", "api/requests/" + path, who)

    async def post(self, path: str, who: str, body=None, **kwargs):
        return await self.call("POST", "api/requests" + path, who, body, **kwargs)

    async def ask(self, who: str = "student1", role: str = "gpu-training",
                  starts: float = NOW, ends: float = NOW + 7 * DAY,
                  reason: str = "My thesis trains a model for a week."):
        return await self.post("", who, {"role": role, "starts": starts, "ends": ends,
                                         "reason": reason})

    def logged(self) -> list[dict]:
        engine = create_engine(self.url)
        try:
            return event_store.read_after(engine, 0)[0]
        finally:
            engine.dispose()


@pytest.fixture(params=[True], ids=["instructors-approve"])
async def api(request, tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'usage.sqlite'}"
    Ledger(url).dispose()
    quota = tmp_path / "quotas.yaml"
    quota.write_text(table(request.param))
    auth = FakeHubAuth({"admin": ADMIN, "prof-ada": INSTRUCTOR, "carol": PLAIN,
                        "finance": VIEWER, "student1": STUDENT, "dora": DORA, "bob": BOB,
                        "prof-bo": OTHER_INSTRUCTOR})
    monkeypatch.setattr(BaseHandler, "hub_auth", property(lambda self: auth))
    hub = web.Application([(r"/hub/api/users/([^/]+)", FakeHubUser)])
    hub_server, hub_port = serve(hub)
    prefix = "/services/usage/"
    state = tmp_path / "state"
    state.mkdir()
    app = service.make_app(usage_db=url, quota_file=str(quota), service_prefix=prefix,
                           state_dir=str(state), hub_id=HUB_ID,
                           hub_api_url=f"http://127.0.0.1:{hub_port}/hub/api",
                           hub_api_token=HUB_TOKEN, clock=lambda: NOW)
    server, port = serve(app)
    found = Api(port, url, quota)
    found.state = state
    yield found
    server.stop()
    hub_server.stop()
    app.settings["usage"].reader.close()


@pytest.fixture
def admins_only(api):
    api.quota.write_text(table(False))
    return api


# --- a student asks, lists and withdraws ---------------------------------------------------


async def wait_events(api: Api, count: int) -> list[dict]:
    """The log's events once ``count`` are written (the EventLog writes on its thread)."""
    for _ in range(200):
        found = api.logged()
        if len(found) >= count:
            return found
        await asyncio.sleep(0.01)
    return api.logged()


async def test_a_student_sees_what_they_may_ask_for(api):
    code, found = await api.get("options", "student1")
    assert code == 200, found
    assert [r["name"] for r in found["roles"]] == ["gpu-training", "senior-engineer"]
    assert found["held"] == ["student", "gpu-lab"]
    assert (found["max_days"], found["max_open"], found["instructors_approve"]) == (
        14, 3, True)


async def test_a_student_asks_lists_and_withdraws(api):
    code, found = await api.ask()
    assert code == 200, found
    asked = found["request"]
    assert (asked["user"], asked["role"], asked["state"], asked["groups"]) == (
        "student1", "gpu-training", "pending", ["cs101"])
    # the asker reads about their own request; the deciders get the event's sentence
    assert found["message"] == (
        "You asked for the role 'gpu-training' from 2026-11-18 11:06 UTC to 2026-11-25 "
        "11:06 UTC. Admins, or an instructor of your class, will decide, and you are told "
        "either way.")
    code, mine = await api.get("mine", "student1")
    assert code == 200 and [r["id"] for r in mine["requests"]] == [asked["id"]]
    assert (await api.get("mine", "carol"))[1] == {"requests": []}

    (event,) = await wait_events(api, 1)
    assert event["event"] == "role-request" and event["hub"] == HUB_ID
    assert {k: event[k] for k in ("id", "user", "role", "starts", "ends", "reason", "who",
                                  "comment")} == {
        "id": asked["id"], "user": "student1", "role": "gpu-training", "starts": NOW,
        "ends": NOW + 7 * DAY, "reason": "My thesis trains a model for a week.",
        "who": "student1", "comment": ""}
    assert event["text"].startswith("student1 asks for the role 'gpu-training' from "
                                    "2026-11-18 11:06 UTC to 2026-11-25 11:06 UTC")

    # nobody else withdraws it
    code, refused = await api.post(f"/{asked['id']}/withdraw", "carol")
    assert (code, refused) == (400, {"message": f"You have no request {asked['id']}."})
    code, done = await api.post(f"/{asked['id']}/withdraw", "student1")
    assert code == 200 and done["request"]["state"] == "withdrawn"
    assert done["message"] == "You withdrew your request for the role 'gpu-training'."
    code, again = await api.post(f"/{asked['id']}/withdraw", "student1")
    assert code == 400 and "nothing to withdraw" in again["message"]
    events = await wait_events(api, 2)
    assert [e["event"] for e in events] == ["role-request", "role-request-withdrawn"]
    assert events[1]["who"] == "student1"
    # in the ledger's events table only, which a watchdog reads with no folder shared
    assert list(api.state.iterdir()) == []


@pytest.mark.parametrize("body, words", [
    ({"role": "instructor"}, "The role 'instructor' cannot be requested; these can: "
                             "gpu-training, senior-engineer."),
    ({"role": "gpu-lab"}, "cannot be requested"),
    ({"ends": NOW + 30 * DAY}, "the longest this hub grants is 14 days"),
    ({"ends": NOW - 1}, "has already ended"),
    ({"reason": "  "}, "Please say why you need this role"),
])
async def test_refusals_are_sentences(api, body, words):
    ask = {"role": "gpu-training", "starts": NOW, "ends": NOW + DAY, "reason": "why"} | body
    code, found = await api.post("", "student1", ask)
    assert code == 400 and words in found["message"], found
    assert api.logged() == []


async def test_a_second_ask_and_bad_bodies_are_refused(api):
    assert (await api.ask())[0] == 200
    code, found = await api.ask()
    assert code == 400 and "still waiting for a decision" in found["message"]
    code, found = await api.post("", "student1", "role=gpu-training",
                                 content_type="application/x-www-form-urlencoded")
    assert code == 400 and "JSON" in found["message"]
    code, found = await api.post("", "student1", {"role": "gpu-training", "reason": "x",
                                                  "starts": "tomorrow", "ends": NOW + DAY})
    assert (code, found["message"]) == (
        400, "The request needs 'starts', as a time in Unix seconds.")
    code, found = await api.post("", "student1", {"starts": NOW, "ends": NOW + DAY})
    assert code == 400 and "'role'" in found["message"]


async def test_a_user_who_holds_the_role_is_told(api):
    code, found = await api.ask(who="bob")
    assert (code, found["message"]) == (400, "You already hold the role 'gpu-training'.")


# --- deciding ------------------------------------------------------------------------------


async def test_the_admin_sees_all_and_approves(api):
    _, first = await api.ask()
    _, second = await api.ask(who="dora", role="senior-engineer")
    code, found = await api.get("pending", "admin")
    assert code == 200
    assert [r["id"] for r in found["requests"]] == [first["request"]["id"],
                                                     second["request"]["id"]]
    rid = first["request"]["id"]
    code, done = await api.post(f"/{rid}/decide", "admin",
                                {"approve": True, "comment": "for the thesis"})
    assert code == 200, done
    assert (done["request"]["state"], done["request"]["decided_by"]) == ("approved", "admin")
    # the approver reads what they did; the student's sentence goes to the student
    assert done["message"] == (
        "You approved student1's request for the role 'gpu-training': they hold it from "
        "2026-11-18 11:06 UTC to 2026-11-25 11:06 UTC. They are told.")
    # the grant shows on the student's side
    _, options = await api.get("options", "student1")
    assert options["granted"] == ["gpu-training"] and "gpu-training" in options["held"]
    assert [r["name"] for r in options["roles"]] == ["senior-engineer"]
    code, again = await api.post(f"/{rid}/decide", "admin", {"approve": False,
                                                             "comment": "no"})
    assert (code, again["message"]) == (400, "This request was already approved by admin.")
    events = await wait_events(api, 3)
    approved = events[2]
    assert approved["event"] == "role-request-approved"
    assert (approved["user"], approved["who"], approved["comment"], approved["hub"]) == (
        "student1", "admin", "for the thesis", HUB_ID)
    assert approved["text"] == (
        "Your request for the role 'gpu-training' was approved by admin; you hold it from "
        "2026-11-18 11:06 UTC to 2026-11-25 11:06 UTC: for the thesis")


async def test_a_refusal_needs_a_comment(api):
    _, asked = await api.ask()
    rid = asked["request"]["id"]
    code, found = await api.post(f"/{rid}/decide", "admin", {"approve": False})
    assert (code, found["message"]) == (400, "Please say why you refuse: the user is told.")
    code, found = await api.post(f"/{rid}/decide", "admin", {"approve": "no"})
    assert (code, found["message"]) == (400, "The request needs 'approve', as true or false.")
    code, found = await api.post(f"/{rid}/decide", "admin",
                                 {"approve": False, "comment": "The GPUs are booked."})
    assert code == 200 and found["request"]["state"] == "refused"
    events = await wait_events(api, 2)
    assert events[1]["event"] == "role-request-refused"
    assert events[1]["text"] == ("Your request for the role 'gpu-training' was refused by "
                                 "admin: The GPUs are booked.")
    assert (await api.post("/999/decide", "admin", {"approve": True}))[0] == 404


async def test_an_instructor_decides_for_their_group_only(api):
    _, mine = await api.ask()  # student1, in cs101
    _, other = await api.ask(who="dora")  # in cs102
    code, found = await api.get("pending", "prof-ada")
    assert code == 200 and [r["user"] for r in found["requests"]] == ["student1"]
    code, found = await api.get("pending", "prof-bo")
    assert code == 200 and [r["user"] for r in found["requests"]] == ["dora"]
    code, refused = await api.post(f"/{other['request']['id']}/decide", "prof-ada",
                                   {"approve": True})
    assert (code, refused["message"]) == (403, "You may not decide the requests of dora.")
    code, done = await api.post(f"/{mine['request']['id']}/decide", "prof-ada",
                                {"approve": True})
    assert code == 200 and done["request"]["decided_by"] == "prof-ada"
    assert done["message"].endswith("2026-11-25 11:06 UTC. They are told.")


async def test_instructors_decide_only_when_the_table_allows(admins_only):
    api = admins_only
    _, mine = await api.ask()
    code, found = await api.get("pending", "prof-ada")
    assert (code, found["message"]) == (403, "On this hub, requests are decided by admins "
                                             "only.")
    code, found = await api.post(f"/{mine['request']['id']}/decide", "prof-ada",
                                 {"approve": True})
    assert (code, found["message"]) == (403, "You may not decide the requests of student1.")
    assert (await api.get("pending", "admin"))[0] == 200
    _, options = await api.get("options", "student1")
    assert options["instructors_approve"] is False


@pytest.mark.parametrize("who", ["carol", "student1", "finance"])
async def test_others_may_not_see_or_decide(api, who):
    _, asked = await api.ask(who="dora")
    code, found = await api.get("pending", who)
    assert code == 403 and found["message"] == requests_api.NOT_DECIDER
    code, found = await api.post(f"/{asked['request']['id']}/decide", who,
                                 {"approve": True})
    assert (code, found["message"]) == (403, "You may not decide the requests of dora.")
    assert [e["event"] for e in await wait_events(api, 1)] == ["role-request"]


async def test_nobody_decides_their_own_request(api):
    # an admin who asks (the table gives "admin" the default role only)
    code, asked = await api.ask(who="admin")
    assert code == 200, asked
    code, found = await api.post(f"/{asked['request']['id']}/decide", "admin",
                                 {"approve": True})
    assert (code, found["message"]) == (400, "You cannot decide your own request.")


async def test_a_visitor_without_a_login_is_refused(api):
    code, found = await api.post("", "nobody", {"role": "gpu-training"})
    assert code == 403 and found["message"] == "Log in to the hub to ask for a role."


# --- the report stays for admins and instructors -------------------------------------------


@pytest.mark.parametrize("path", ["?period=30d", "user?name=student1", "report.csv", "report.json"])
async def test_the_report_still_refuses_a_plain_user(api, path):
    for who in ("student1", "carol"):
        code, found = await api.call("GET", path, who)
        assert code == 403, (path, who)
        assert "you are neither" in found
    assert (await api.call("GET", "api/table", "student1"))[0] == 403


# --- the hub's side ------------------------------------------------------------------------


def test_every_user_may_reach_the_service_and_it_writes_to_the_hubs_log(tmp_path, monkeypatch):
    c = load_hub_config(tmp_path, monkeypatch, QUOTA_SPAWNER_DEMO_PASSWORD=GOOD_USER,
                        QUOTA_SPAWNER_DEMO_ADMIN_PASSWORD=GOOD_ADMIN)
    assert "access:services!service=usage" in c.JupyterHub.extra_user_scopes
    # the default "user" role is extended, not redefined
    assert "user" not in [r["name"] for r in c.JupyterHub.load_roles]
    (usage,) = [s for s in c.JupyterHub.services if s["name"] == "usage"]
    environment = usage["environment"]
    assert environment["QUOTA_SPAWNER_STATE_DIR"] == str(tmp_path)
    assert environment["QUOTA_SPAWNER_HUB_SECRET_FILE"] == c.JupyterHub.cookie_secret_file
    assert environment["QUOTA_SPAWNER_PREFIX"] == "quota"


def test_the_hub_id_is_the_spawners(tmp_path, monkeypatch):
    from spawner.policy.config import hub_id_from_secret

    secret = tmp_path / "cookie_secret"
    secret.write_text("ab" * 32)
    monkeypatch.delenv("QUOTA_SPAWNER_HUB_ID", raising=False)
    monkeypatch.setenv("QUOTA_SPAWNER_HUB_SECRET_FILE", str(secret))
    monkeypatch.setenv("QUOTA_SPAWNER_PREFIX", "quota")
    assert service.QuotaWebApp().event_hub_id() == hub_id_from_secret(
        "quota", bytes.fromhex("ab" * 32))
    monkeypatch.setenv("QUOTA_SPAWNER_HUB_ID", "mine")
    assert service.QuotaWebApp().event_hub_id() == "mine"


# --- hostile input: checked before anything is stored ----------------------------------------


@pytest.mark.parametrize("starts, ends, words", [
    (1e13, 1.0000000036e13, "A request may start at most 366 days from now"),
    (NOW + 367 * DAY, NOW + 368 * DAY, "A request may start at most 366 days from now"),
    (NOW, 1e300, "the longest this hub grants is 14 days"),
    (-1e300, NOW + DAY, None),  # a start in the past means now: a normal request
])
async def test_a_window_out_of_range_is_refused_and_nothing_stored(api, starts, ends, words):
    code, found = await api.ask(starts=starts, ends=ends)
    if words is None:
        assert code == 200 and found["request"]["starts"] == NOW
        return
    assert code == 400 and words in found["message"], found
    assert (await api.get("mine", "student1"))[1] == {"requests": []}
    assert api.logged() == []


@pytest.mark.parametrize("raw", ["NaN", "Infinity", "-Infinity", "1e400"])
async def test_nan_and_infinities_are_refused(api, raw):
    body = f'{{"role": "gpu-training", "reason": "x", "starts": {raw}, "ends": {NOW + DAY}}}'
    code, found = await api.post("", "student1", body)
    assert code == 400, found
    assert found["message"] in (
        "The request holds NaN or Infinity, which are not numbers here.",
        "'starts' must be a finite number: a time in Unix seconds.")
    assert (await api.get("mine", "student1"))[1] == {"requests": []}


@pytest.mark.parametrize("rid", ["99999999999999999999", "9223372036854775808", "0"])
async def test_ids_out_of_the_databases_range_are_a_sentence(api, rid):
    sentence = (f"'{rid}' is not a request id: ids are whole numbers from 1 to "
                "9223372036854775807.")
    for path, who, body in ((f"/{rid}/withdraw", "student1", {}),
                            (f"/{rid}/decide", "admin", {"approve": True})):
        assert await api.post(path, who, body) == (400, {"message": sentence})
    assert await api.call("DELETE", f"api/requests/{rid}", "admin") == (
        400, {"message": sentence})
    # the largest id is an id: there is just no such request
    assert (await api.post("/9223372036854775807/withdraw", "student1"))[0] == 400
    assert (await api.post("/9223372036854775807/decide", "admin",
                           {"approve": True}))[0] == 404


async def test_a_role_no_longer_requestable_cannot_be_approved(api):
    _, asked = await api.ask()
    rid = asked["request"]["id"]
    # an admin takes the role out of requests: roles before anyone decides
    text = api.quota.read_text().replace("roles: [gpu-training, senior-engineer]",
                                         "roles: [senior-engineer]")
    api.quota.write_text(text)
    code, found = await api.post(f"/{rid}/decide", "prof-ada", {"approve": True})
    assert (code, found["message"]) == (400, (
        "The role 'gpu-training' can no longer be requested: the quota table's requests: "
        "roles does not list it now. Refuse this request, or have an admin add the role "
        "back first."))
    _, options = await api.get("options", "student1")
    assert "gpu-training" not in options["held"] and options["granted"] == []
    # a shorter max_days since the ask: the window is re-checked too
    api.quota.write_text(text.replace("roles: [senior-engineer]",
                                      "roles: [gpu-training, senior-engineer]")
                         .replace("max_days: 14", "max_days: 3"))
    code, found = await api.post(f"/{rid}/decide", "admin", {"approve": True})
    assert code == 400 and "longer than the 3 days the quota table now allows" in \
        found["message"]
    code, found = await api.post(f"/{rid}/decide", "admin",
                                 {"approve": False, "comment": "Too long now."})
    assert code == 200


async def test_long_texts_and_large_bodies_are_refused(api):
    code, found = await api.ask(reason="x" * 2001)
    assert (code, found["message"]) == (400, "Please keep the reason under 2000 characters.")
    _, asked = await api.ask()
    code, found = await api.post(f"/{asked['request']['id']}/decide", "admin",
                                 {"approve": True, "comment": "y" * 2001})
    assert (code, found["message"]) == (400, "Please keep the comment under 2000 characters.")
    body = json.dumps({"reason": "z" * (1 << 20)})
    code, found = await api.post("", "student1", body)
    assert (code, found["message"]) == (413, "The request is 1,048,590 bytes; this service "
                                             "takes at most 1,048,576 bytes (1 MiB).")
    assert (await api.get("mine", "student1"))[1]["requests"] == [asked["request"]]


def no_traceback(records) -> None:
    """Nothing the service logged carries a traceback: a refusal is not an error."""
    assert [r.getMessage() for r in records if r.exc_info] == []


@pytest.mark.parametrize("raw, shown", [("\ud800", "an unpaired UTF-16 surrogate (U+D800)"),
                                        ("\x00", "a NUL character (U+0000)")])
async def test_a_reason_or_a_comment_that_is_not_text_is_refused(api, caplog, raw, shown):
    """A lone surrogate is valid JSON but no character (UTF-8 cannot encode it), and NUL is
    what PostgreSQL's text refuses: a sentence, nothing stored, no traceback."""
    code, found = await api.ask(reason=f"For my{raw} thesis")
    assert (code, found["message"]) == (400, (
        f"The reason holds {shown} at character 7, which is not text that can be stored; "
        "please remove it and send it again."))
    assert (await api.get("mine", "student1"))[1] == {"requests": []}
    _, asked = await api.ask()
    rid = asked["request"]["id"]
    code, found = await api.post(f"/{rid}/decide", "admin",
                                 {"approve": False, "comment": raw + "no"})
    assert (code, found["message"]) == (400, (
        f"The comment holds {shown} at character 1, which is not text that can be stored; "
        "please remove it and send it again."))
    # a surrogate in a key is refused as well, before any field is read
    code, found = await api.post("", "student1", '{"role": "gpu-training", "\\udfff": 1}')
    assert (code, found["message"]) == (400, (
        "The name of a field holds an unpaired UTF-16 surrogate (U+DFFF) at character 1, "
        "which is not text that can be stored; please remove it and send it again."))
    _, mine = await api.get("mine", "student1")
    assert [(r["id"], r["state"]) for r in mine["requests"]] == [(rid, "pending")]
    assert [e["event"] for e in await wait_events(api, 1)] == ["role-request"]
    no_traceback(caplog.records)


def body_routes() -> list[str]:
    """Every route of the service whose handler takes a JSON body (a POST), as a path:
    a number for an id, cs101 for a class."""
    found = []
    for route in service.routes("/services/usage/"):
        handler = route[1]
        if isinstance(handler, type) and "post" in {
                name for klass in handler.__mro__ if klass.__module__.startswith("spawner.")
                for name in vars(klass)}:
            found.append(route[0].replace(r"(\d+)", "1").replace("([^/]+)", "cs101")
                         .removeprefix("/services/usage/"))
    return found


async def test_every_endpoint_that_takes_a_body_refuses_a_lone_surrogate(api, caplog):
    """The check is the body's parser's (inputs.parse_json), so no endpoint can miss it."""
    paths = body_routes()
    assert {"api/requests", "api/requests/1/decide", "api/table", "api/table/check",
            "api/table/versions/1/restore", "api/classes/cs101/prewarm"} <= set(paths)
    for path in paths:
        code, found = await api.call("POST", path, "admin", '{"role": "x", "why": "\\ud800"}')
        assert (code, found) == (400, {"message": (
            "The why holds an unpaired UTF-16 surrogate (U+D800) at character 1, which is "
            "not text that can be stored; please remove it and send it again.")}), path
    assert api.logged() == []
    no_traceback(caplog.records)
