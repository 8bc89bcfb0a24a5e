"""The page for requests for a bigger role, without a hub or a browser: the OAuth user is
faked by webapp_client.py, the hub's REST API (a user's groups) by a small tornado
app, as in test_requests_api.py. What each role sees and may do; the page's actions go
through the API, whose refusals are checked here as well. What the page does in a browser
is for test_browser_requests.py."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest
from markupsafe import escape
from requests_cases import DAY, DORA, HUB_ID, NOW, OTHER_INSTRUCTOR, STUDENT, table
from tornado import web
from webapp_client import (
    ADMIN,
    HUB_TOKEN,
    INSTRUCTOR,
    PLAIN,
    VIEWER,
    FakeHubAuth,
    PageSite,
    attribute,
    serve,
)

from harness import shipped_table_without_requests
from spawner.usage.ledger import Ledger
from spawner.usage.schema import role_requests
from spawner.webapp import app as service
from spawner.webapp import requests as requests_api
from spawner.webapp.base import BaseHandler, static_version

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "/services/usage/"
SCRIPT = ROOT / "spawner" / "webapp" / "static" / "requests.js"
SCRIPT_VERSION = static_version("requests.js")  # in the script's URL
HOSTILE = "<script>alert(1)</script>"
HOSTILE_REASON = '<img src=x onerror="alert(2)"> & "quotes"'
HOSTILE_COMMENT = "</q><b onclick=alert(3)>no</b>"
GROUPS = {"student1": ["cs101"], "dora": ["cs102"], "carol": [], "admin": [],
          "prof-ada": ["cs101-staff"], "prof-bo": ["cs102-staff"], "finance": [],
          HOSTILE: ["cs101"]}
MODELS = {"admin": ADMIN, "prof-ada": INSTRUCTOR, "prof-bo": OTHER_INSTRUCTOR,
          "carol": PLAIN, "finance": VIEWER, "student1": STUDENT, "dora": DORA,
          HOSTILE: {**STUDENT, "name": HOSTILE}}


class PageHubAuth(FakeHubAuth):
    base_url = "/"  # where HubOAuth sets its XSRF cookie


class FakeHubUser(web.RequestHandler):
    """GET /hub/api/users/<name>: the user's groups, with the service's token only."""

    def get(self, name: str) -> None:
        if self.request.headers.get("Authorization") != f"token {HUB_TOKEN}":
            raise web.HTTPError(403)
        if name not in GROUPS:
            raise web.HTTPError(404)
        self.finish({"name": name, "groups": GROUPS[name]})


class Site(PageSite):
    def __init__(self, port: int, quota: Path, clock: list[float], url: str = ""):
        super().__init__(port, PREFIX)
        self.quota = quota
        self.clock = clock
        self.url = url

    async def page(self, who: str) -> str:
        r = await self.get("requests", who)
        assert r.code == 200, (r.code, r.body[:300])
        return r.body.decode()

    async def api(self, method: str, path: str, who: str, body=None):
        data = json.dumps(body if body is not None else {}) if method == "POST" else None
        r = await self.client.fetch(
            self.base + "api/requests" + path, method=method, body=data, raise_error=False,
            headers={"X-Test-User": who, "Content-Type": "application/json"})
        return r.code, json.loads(r.body)

    async def ask(self, who: str = "student1", role: str = "gpu-training",
                  ends: float = NOW + 7 * DAY, reason: str = "For my thesis.") -> int:
        code, found = await self.api("POST", "", who, {"role": role, "starts": NOW,
                                                        "ends": ends, "reason": reason})
        assert code == 200, found
        return found["request"]["id"]

    async def decide(self, rid: int, who: str, approve: bool, comment: str = ""):
        return await self.api("POST", f"/{rid}/decide", who,
                              {"approve": approve, "comment": comment})


@pytest.fixture
async def site(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'usage.sqlite'}"
    Ledger(url).dispose()
    quota = tmp_path / "quotas.yaml"
    quota.write_text(table(True))
    auth = PageHubAuth(MODELS)
    monkeypatch.setattr(BaseHandler, "hub_auth", property(lambda self: auth))
    hub = web.Application([(r"/hub/api/users/([^/]+)", FakeHubUser)])
    hub_server, hub_port = serve(hub)
    state = tmp_path / "state"
    state.mkdir()
    clock = [NOW]
    app = service.make_app(usage_db=url, quota_file=str(quota), service_prefix=PREFIX,
                           state_dir=str(state), hub_id=HUB_ID,
                           hub_api_url=f"http://127.0.0.1:{hub_port}/hub/api",
                           hub_api_token=HUB_TOKEN, clock=lambda: clock[0])
    server, port = serve(app)
    yield Site(port, quota, clock, url)
    server.stop()
    hub_server.stop()
    app.settings["usage"].reader.close()


def section(page: str, name: str) -> str:
    """The text of ``<section id=name>``; empty when the page has none."""
    found = re.search(rf'<section aria-labelledby="[^"]*" id="{name}">(.*?)</section>', page,
                      re.S)
    return found.group(1) if found else ""


def options(page: str) -> list[str]:
    return re.findall(r'<option value="([^"]*)"', section(page, "ask"))


def rows(page: str, part: str = "mine") -> list[str]:
    """Each request's text in a section, tags dropped, spaces folded."""
    pattern = r"<tr class=\"request.*?</tr>" if part == "mine" else r"<article.*?</article>"
    return [" ".join(html.unescape(re.sub(r"<[^>]+>", " ", plain(m))).split())
            for m in re.findall(pattern, section(page, part), re.S)]


def plain(page: str) -> str:
    """``page`` without the <bdi> around each name (inline: no space where it was)."""
    return re.sub(r"</?bdi>", "", page)


# --- every user: the landing page, the form and their requests -------------------------------


async def test_a_student_gets_the_form_and_no_decisions(site):
    r = await site.get("requests", "student1")
    assert r.code == 200 and r.headers["Content-Type"].startswith("text/html")
    page = r.body.decode()
    assert "<title>Role requests</title>" in page
    assert options(page) == ["gpu-training", "senior-engineer"]
    assert "You hold student, gpu-lab." in plain(page)
    # 24-hour times in the service's zone, as the tables show them, not the browser's
    # datetime-local (12-hour in some locales)
    assert 'type="datetime-local"' not in page
    assert 'data-tz="UTC"' in page and "<label for=\"ask-starts\">From (UTC)" in page
    for needed in ('placeholder="2026-12-20 14:00"', 'id="ask-reason"', "required",
                   '<label for="ask-role">', '<label for="ask-starts">',
                   '<label for="ask-ends">', '<label for="ask-reason"',
                   "at most 14 days long", "an instructor of your class"):
        assert needed in page, needed
    assert "You have not asked for a role yet." in page
    assert section(page, "decide") == "" and "Requests to decide" not in page
    assert attribute(page, "data-api") == PREFIX + "api/requests"
    assert attribute(page, "data-xsrf")
    assert attribute(page, "data-max-days") == "14"
    assert re.findall(r"<script\b[^>]*>", page) == [
        f'<script src="{PREFIX}static/requests.js?v={SCRIPT_VERSION}" defer>']
    # the header's link to this page is marked as the current one
    assert f'<a href="{PREFIX}requests" aria-current="page">Role requests</a>' in page
    # the API refuses what the page does not offer
    code, found = await site.api("GET", "/pending", "student1")
    assert (code, found["message"]) == (403, requests_api.NOT_DECIDER)


async def test_the_page_allows_its_own_scripts_only(site):
    r = await site.get("requests", "carol")
    csp = dict(part.strip().split(" ", 1) for part in
               r.headers["Content-Security-Policy"].split(";"))
    assert (csp["script-src"], csp["default-src"], csp["connect-src"]) == (
        "'self'", "'none'", "'self'")
    assert "<script>" not in r.body.decode()
    assert r.headers["X-Content-Type-Options"] == "nosniff"
    assert r.headers["Cache-Control"] == "no-store"


async def test_the_front_door_sends_a_plain_user_here(site):
    r = await site.get("", "carol")
    assert r.code == 302 and r.headers["Location"] == PREFIX + "requests"


async def test_without_a_login_the_page_sends_to_the_hub(site):
    r = await site.get("requests")
    assert r.code in (302, 403)
    assert "ask-form" not in r.body.decode()


async def test_the_states_of_ones_requests(site):
    waiting = await site.ask(role="senior-engineer", reason="Big loaders.")
    granted = await site.ask(ends=NOW + 2 * DAY)
    page = await site.page("student1")
    assert rows(page) == [
        "gpu-training 2026-11-18 11:06 UTC to 2026-11-20 11:06 UTC For my thesis. "
        "Waiting for a decision Withdraw",
        "senior-engineer 2026-11-18 11:06 UTC to 2026-11-25 11:06 UTC Big loaders. "
        "Waiting for a decision Withdraw"]
    # the roles asked for are still askable until granted: a second ask is refused by the API
    assert options(page) == ["gpu-training", "senior-engineer"]

    assert (await site.decide(granted, "admin", True, "for the thesis"))[0] == 200
    assert (await site.decide(waiting, "admin", False, "Not this term."))[0] == 200
    page = await site.page("student1")
    assert rows(page) == [
        "gpu-training 2026-11-18 11:06 UTC to 2026-11-20 11:06 UTC For my thesis. "
        "Approved by admin, until 2026-11-20 11:06 UTC for the thesis Give up the grant",
        "senior-engineer 2026-11-18 11:06 UTC to 2026-11-25 11:06 UTC Big loaders. "
        "Refused by admin Not this term."]
    assert "You hold student, gpu-training, gpu-lab (granted for a time: gpu-training)." \
        in plain(page)
    assert options(page) == ["senior-engineer"]
    assert 'class="request granted"' in page and 'class="request refused"' in page
    assert 'aria-label="Give up the grant: gpu-training, 2026-11-18 11:06 UTC to ' \
           '2026-11-20 11:06 UTC"' in page

    # the grant ends by itself
    site.clock[0] = NOW + 2 * DAY
    page = await site.page("student1")
    assert rows(page)[0] == ("gpu-training 2026-11-18 11:06 UTC to 2026-11-20 11:06 UTC "
                             "For my thesis. Expired: the grant ended on 2026-11-20 11:06 UTC "
                             "for the thesis")
    assert "You hold student, gpu-lab." in plain(page)
    assert options(page) == ["gpu-training", "senior-engineer"]


async def test_a_withdrawn_request_and_a_grant_to_come(site):
    rid = await site.ask()
    code, _ = await site.api("POST", f"/{rid}/withdraw", "student1")
    assert code == 200
    code, found = await site.api("POST", "", "student1", {
        "role": "senior-engineer", "starts": NOW + DAY, "ends": NOW + 3 * DAY,
        "reason": "Next week."})
    assert code == 200
    assert (await site.decide(found["request"]["id"], "admin", True))[0] == 200
    assert rows(await site.page("student1")) == [
        "senior-engineer 2026-11-19 11:06 UTC to 2026-11-21 11:06 UTC Next week. Approved by "
        "admin, from 2026-11-19 11:06 UTC until 2026-11-21 11:06 UTC Give up the grant",
        "gpu-training 2026-11-18 11:06 UTC to 2026-11-25 11:06 UTC For my thesis. Withdrawn "
        "on 2026-11-18 11:06 UTC"]


async def test_a_user_who_holds_every_requestable_role(site):
    site.quota.write_text(table(True).replace(
        "cs101: [student, gpu-lab]", "cs101: [student, gpu-lab, gpu-training, senior-engineer]"))
    page = await site.page("student1")
    assert "You hold every role that can be requested on this hub." in page
    assert "ask-form" not in page


async def test_requests_off_and_no_table(site):
    site.quota.write_text(shipped_table_without_requests())
    page = await site.page("student1")
    assert "Roles cannot be requested on this hub; ask an admin." in page
    assert "ask-form" not in page

    site.quota.write_text("roles: [\n")  # broken: the last good table is kept by the store
    assert (await site.get("requests", "student1")).code == 200

    site.quota.unlink()
    page = await site.page("student1")
    assert "ask-form" not in page
    assert "Your requests" in page  # still shown: they come from the ledger


# --- who decides -------------------------------------------------------------------------


async def test_the_admin_sees_every_waiting_request(site):
    await site.ask()
    await site.ask(who="dora", role="senior-engineer", reason="Lab project.")
    own = await site.ask(who="admin", reason="To try the GPU queue.")
    page = await site.page("admin")
    # nobody decides their own request: the admin's is under "Your requests" only
    assert [r.split(" ")[0] for r in rows(page)] == ["gpu-training"]
    assert (await site.decide(own, "admin", True))[1]["message"] == \
        "You cannot decide your own request."
    assert "Requests to decide" in page
    assert rows(page, "decide") == [
        "student1 asks for the role gpu-training Window 2026-11-18 11:06 UTC to 2026-11-25 "
        "11:06 UTC Groups cs101 Reason For my thesis. Asked 2026-11-18 11:06 UTC "
        "Comment for \u2068student1\u2069 (required to refuse) Approve Refuse",
        "dora asks for the role senior-engineer Window 2026-11-18 11:06 UTC to 2026-11-25 "
        "11:06 UTC Groups cs102 Reason Lab project. Asked 2026-11-18 11:06 UTC "
        "Comment for \u2068dora\u2069 (required to refuse) Approve Refuse"]
    decide = section(page, "decide")
    assert 'aria-label="Approve the request of student1 for gpu-training"' in decide
    assert '<label for="comment-1">' in decide and 'id="comment-1"' in decide
    # the admin may ask too: the form is there
    assert "ask-form" in page


async def test_the_instructor_of_the_class_decides_for_it(site):
    rid = await site.ask()
    await site.ask(who="dora")
    page = await site.page("prof-ada")
    assert [r.split(" asks")[0] for r in rows(page, "decide")] == ["student1"]
    code, found = await site.decide(rid, "prof-ada", True)
    assert code == 200, found
    page = await site.page("prof-ada")
    assert "No request waits for your decision." in page
    assert rows(await site.page("student1"))[0].endswith(
        "Approved by prof-ada, until 2026-11-25 11:06 UTC Give up the grant")


async def test_the_instructor_of_another_class_does_not_see_it(site):
    rid = await site.ask()
    page = await site.page("prof-bo")
    assert "Requests to decide" in page  # prof-bo decides for cs102
    assert rows(page, "decide") == [] and "No request waits for your decision." in page
    code, found = await site.decide(rid, "prof-bo", True)
    assert (code, found["message"]) == (403, "You may not decide the requests of student1.")
    code, found = await site.api("GET", "/pending", "prof-bo")
    assert code == 200 and found["requests"] == []


async def test_instructors_do_not_decide_unless_the_table_allows(site):
    site.quota.write_text(table(False))
    rid = await site.ask()
    page = await site.page("prof-ada")
    assert section(page, "decide") == "" and "Requests to decide" not in page
    assert "an instructor of your class" not in page
    code, found = await site.api("GET", "/pending", "prof-ada")
    assert (code, found["message"]) == (403, "On this hub, requests are decided by admins only.")
    code, found = await site.decide(rid, "prof-ada", True)
    assert (code, found["message"]) == (403, "You may not decide the requests of student1.")


@pytest.mark.parametrize("who", ["carol", "student1", "finance", "dora"])
async def test_others_get_no_decisions(site, who):
    rid = await site.ask(who="dora" if who != "dora" else "student1")
    page = await site.page(who)
    assert section(page, "decide") == "" and "Requests to decide" not in page
    code, found = await site.decide(rid, who, True)
    assert code in (400, 403) and found["message"] in (
        "You may not decide the requests of dora.",
        "You may not decide the requests of student1.")


# --- escaping ------------------------------------------------------------------------------


async def test_names_reasons_and_comments_are_escaped(site):
    rid = await site.ask(who=HOSTILE, reason=HOSTILE_REASON)
    page = await site.page("admin")
    assert "<script>alert(1)" not in page and "<img src=x" not in page
    assert escape(HOSTILE) in page and escape(HOSTILE_REASON) in page
    assert f'aria-label="Approve the request of {escape(HOSTILE)} for gpu-training"' \
        in page
    assert (await site.decide(rid, "admin", False, HOSTILE_COMMENT))[0] == 200
    mine = await site.page(HOSTILE)
    assert f"Signed in as <strong class=\"me\" dir=\"auto\">{escape(HOSTILE)}</strong>" in mine
    assert "<b onclick" not in mine and escape(HOSTILE_COMMENT) in mine
    assert "<img src=x" not in mine
    assert rows(mine) == [f"gpu-training 2026-11-18 11:06 UTC to 2026-11-25 11:06 UTC "
                          f"{HOSTILE_REASON} Refused by admin {HOSTILE_COMMENT}"]


# --- a row stored before the input checks -----------------------------------------------


def store_broken(site: Site, user: str = "dora", state: str = "pending") -> int:
    """A request as the API stored it before it checked times: a window in year 318857."""
    ledger = Ledger(site.url, create=False)
    with ledger.engine.begin() as connection:
        rid = connection.execute(role_requests.insert().values(
            user_name=user, groups="cs102", role="gpu-training", starts=1e13,
            ends=1.0000000036e13, reason="x", state=state, asked_at=NOW)
        ).inserted_primary_key[0]
    ledger.dispose()
    return int(rid)


async def test_a_broken_row_never_breaks_the_pages_and_can_be_refused_or_deleted(site):
    good = await site.ask()  # student1's ordinary request, beside it
    broken = store_broken(site)
    for who in ("admin", "dora", "student1"):
        page = await site.page(who)  # 200, for everyone
    admin = await site.page("admin")
    assert "an invalid time (1e+13)" in section(admin, "decide")
    assert 'class="request waiting broken"' in admin
    assert "Its window holds a time no calendar can show" in " ".join(admin.split())
    assert 'data-decision="delete"' in admin  # admins may delete it
    page = await site.page("dora")
    assert rows(page) and "an invalid time" in rows(page)[0]
    code, found = await site.api("GET", "/pending", "admin")
    assert code == 200 and [r["id"] for r in found["requests"]] == [good, broken]
    code, found = await site.api("GET", "/mine", "dora")
    assert code == 200 and found["requests"][0]["window"].startswith("from an invalid time")
    # never approved; refused, or deleted by an admin only
    code, found = await site.decide(broken, "admin", True)
    assert (code, found["message"]) == (400, "This request's window holds a time no calendar "
                                             "can show; it can only be refused or deleted.")
    code, found = await site.api("DELETE", f"/{broken}", "dora")
    assert (code, found["message"]) == (403, "Only admins may delete a request, and only one "
                                             "whose window cannot be shown.")
    code, found = await site.api("DELETE", f"/{good}", "admin")
    assert code == 400 and "the grants' record" in found["message"]
    code, found = await site.api("DELETE", f"/{broken}", "admin")
    assert (code, found["message"]) == (200, f"Request {broken} of dora, whose window could "
                                             "not be shown, is deleted.")
    code, found = await site.api("GET", "/mine", "dora")
    assert (code, found) == (200, {"requests": []})
    assert (await site.api("DELETE", f"/{broken}", "admin"))[0] == 404
    # refusing one works as for any other
    other = store_broken(site)
    code, found = await site.decide(other, "admin", False, "Ask again with real dates.")
    assert code == 200 and found["request"]["state"] == "refused"
    await site.page("dora")


async def test_the_page_says_times_in_the_services_zone_and_24_hours(site):
    page = await site.page("student1")
    assert "24-hour, in UTC, as everywhere on this" in page


# --- the script -----------------------------------------------------------------------------


async def test_the_script_is_served_and_builds_no_html(site):
    r = await site.get(f"static/requests.js?v={SCRIPT_VERSION}")
    assert r.code == 200
    assert r.headers["Content-Type"] == "text/javascript; charset=utf-8"
    text = r.body.decode()
    assert text == SCRIPT.read_text(encoding="utf-8")
    for unsafe in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write",
                   "eval(", "DOMParser"):
        assert unsafe not in text, unsafe
    assert re.search(r"""(https?:)?//[a-z]""", text.replace("// ", "")) is None
    assert '"X-XSRFToken": xsrf' in text
