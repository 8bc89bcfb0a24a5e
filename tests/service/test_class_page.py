"""The class dashboard's pages without a hub or a browser: the OAuth user is faked as in
test_usage_service.py and the hub's REST API as in test_class_api.py (which enforces the
instructor's group as the hub's RBAC would). What the page does in a browser is for
test_browser_classes.py."""

from __future__ import annotations

import html
import json
import re
import time
from pathlib import Path

import pytest
from markupsafe import escape
from test_class_api import USERS, Hub, HubServer, HubUsers, UserTokens
from test_usage_service import ADMIN, INSTRUCTOR, PLAIN, VIEWER
from tornado import web
from tornado.httpclient import AsyncHTTPClient
from tornado.httpserver import HTTPServer
from tornado.testing import bind_unused_port

from spawner.hubconfig.rbac import USAGE_SCOPE
from spawner.usage.ledger import Ledger
from spawner.usage.schema import sessions
from spawner.webapp import app as service
from spawner.webapp import class_logic as classes
from spawner.webapp import class_page
from spawner.webapp.classes import NOT_AN_INSTRUCTOR

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "/services/usage/"
SCRIPT = ROOT / "spawner" / "webapp" / "static" / "classes.js"
HOSTILE_USER = "<script>alert('u')</script>&"
HOSTILE_GROUP = "\"><img src=x onerror=alert('g')>/x"


class PageTokens(UserTokens):
    base_url = "/"  # where HubOAuth sets its XSRF cookie


class Site:
    def __init__(self, port: int, hub: Hub, url: str):
        self.base = f"http://127.0.0.1:{port}{PREFIX}"
        self.client = AsyncHTTPClient()
        self.hub = hub
        self.url = url

    async def get(self, path: str, who: str = ""):
        headers = {"X-Test-User": who} if who else {}
        return await self.client.fetch(self.base + path, headers=headers, raise_error=False,
                                       follow_redirects=False)


@pytest.fixture
async def site(tmp_path, monkeypatch):
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
    quota.write_text((ROOT / "hub_config" / "quotas.yaml").read_text().replace(
        "cs101: [student, gpu-lab]", "cs101: [student]\n    cs101-gpu: [gpu-lab]"))
    (tmp_path / "quota-spawner-gpu-usage.json").write_text(json.dumps({
        "version": 1, "time": now, "interval": 5, "gpus": {},
        "servers": {"jupyter-alice": {"user": "alice", "role": "gpu-lab", "gpus": ["GPU-1"],
                                      "gpu_memory": {"GPU-1": 1 << 30}}}}))
    bo = {**INSTRUCTOR, "name": "prof-bo",
          "scopes": ["access:services!service=usage", f"{USAGE_SCOPE}!group=ml-platform"]}
    auth = PageTokens({"admin": ADMIN, "prof-ada": INSTRUCTOR, "carol": PLAIN,
                       "finance": VIEWER, "prof-bo": bo})
    monkeypatch.setattr(service.UsageHandler, "hub_auth", property(lambda self: auth))
    hub = Hub()
    hub_app = web.Application([(r"/hub/api/users", HubUsers),
                               (r"/hub/api/users/([^/]+)/server", HubServer)], hub=hub)
    hub_sock, hub_port = bind_unused_port()
    hub_server = HTTPServer(hub_app)
    hub_server.add_sockets([hub_sock])
    # the pages and the API read the hub's address as the service does, from its environment
    monkeypatch.setenv("JUPYTERHUB_API_URL", f"http://127.0.0.1:{hub_port}/hub/api")
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "service-token")
    monkeypatch.setenv("JUPYTERHUB_BASE_URL", "/")
    monkeypatch.setenv("QUOTA_SPAWNER_STATE_DIR", str(tmp_path))
    app = service.make_app(usage_db=url, quota_file=str(quota), prefix=PREFIX)
    sock, port = bind_unused_port()
    server = HTTPServer(app)
    server.add_sockets([sock])
    yield Site(port, hub, url)
    server.stop()
    hub_server.stop()
    app.settings["usage_reader"]._pool.shutdown(wait=False)


def attribute(page: str, name: str) -> str:
    found = re.search(rf'\b{name}="([^"]*)"', page)
    assert found, name
    return html.unescape(found.group(1))


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
    assert cell(alice, "memory") == "1.5 GiB of 4.0 GiB"
    assert cell(alice, "gpu") == "1.0 GiB"
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
    assert [(json.loads(html.unescape(v)), t) for v, t in options] == [
        (["student", "pytorch"], "student with pytorch")]
    assert "gpu-lab with pytorch: not held by student1, student2" in page
    assert 'id="stop-all"' in page and 'id="prewarm-at"' in page
    assert 'type="datetime-local"' in page
    # what the script needs, and nothing it would have to fetch from elsewhere
    assert attribute(page, "data-api") == PREFIX + "api/classes/cs101"
    assert attribute(page, "data-xsrf")
    assert attribute(page, "data-group") == "cs101"
    assert re.findall(r"<script\b[^>]*>", page) == [
        f'<script src="{PREFIX}static/classes.js?v={class_page.script_version()}" defer>']
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
    r = await site.get(f"static/classes.js?v={class_page.script_version()}")
    assert r.code == 200 and r.headers["Content-Type"].startswith("text/javascript")


def test_the_script_writes_names_as_text_only():
    script = SCRIPT.read_text()
    for forbidden in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write",
                      "window.confirm", "alert(", "eval(", "http://", "https://"):
        assert forbidden not in script, forbidden


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
    quoted = class_page.class_link(PREFIX, HOSTILE_GROUP)[len(PREFIX):]
    r = await site.get(quoted, "admin")
    assert r.code == 200, r.body
    page = r.body.decode()
    assert "<img src=x" not in page
    assert attribute(page, "data-group") == HOSTILE_GROUP
    assert attribute(page, "data-api") == class_page.class_link(PREFIX + "api/", HOSTILE_GROUP)
    assert re.findall(r'<tr data-user="([^"]*)">', page) == [str(escape(HOSTILE_USER))]


async def test_schedules_are_shown_with_a_cancel_button_while_pending(site):
    engine = Ledger(site.url).engine
    at = time.time() + 3600
    pending = classes.add_schedule(engine, "cs101", "student", "pytorch", at, "prof-ada")
    done = classes.add_schedule(engine, "cs101", "student", "pytorch", at - 7200, "admin")
    classes.finish(engine, done["id"], classes.DONE, "student1: starting\nstudent2: starting")
    engine.dispose()
    page = (await site.get("classes/cs101", "prof-ada")).body.decode()
    rows = re.findall(r'<tr data-id="(\d+)">(.*?)</tr>', page, re.S)
    assert [int(i) for i, _ in rows] == [pending["id"], done["id"]]
    assert f'class="cancel secondary"\n          data-id="{pending["id"]}"' in rows[0][1]
    assert "cancel" not in rows[1][1]
    assert "student1: starting\nstudent2: starting" in rows[1][1]
    assert 'id="no-schedules" hidden' in page


def test_the_text_of_a_row():
    assert class_page.size_text(None) == "–"
    assert class_page.size_text(512 << 20) == "512 MiB"
    assert class_page.size_text(3 << 29) == "1.5 GiB"
    assert class_page.cpu_text({"cpu": 0.5, "cpu_limit": 0.5}) == "0.50 of 0.5 cores"
    assert class_page.cpu_text({"cpu": 1.0, "cpu_limit": None}) == "1.00 cores"
    assert class_page.ago_text("2027-01-05T09:00:00.123456Z",
                               1799139600.0 + 125) == "2 min ago"
    assert class_page.ago_text(None, 0) == "never"
    assert USERS  # the fake hub's users, shared with test_class_api


async def test_refusal_pages_are_titled_by_the_page_refused(site):
    r = await site.get("classes", "carol")
    assert r.code == 403 and "<title>Classes</title>" in r.body.decode()


async def test_a_schedule_stored_at_an_absurd_time_never_breaks_the_page(site):
    """Stored before the API checked 'at': the page shows it, and it can be cancelled."""
    ledger = Ledger(site.url, create=False)
    planned = classes.add_schedule(ledger.engine, "cs101", "student", "pytorch", 1e18,
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
