"""The usage page without a hub: who sees what, the period, the pages and downloads.

The hub's OAuth is replaced by the user models a real JupyterHub 6 hands over
(see test_browser_usage.py for the real thing): an admin's carries
``admin: true``; an instructor's the usage scope filtered to the class.
"""

from __future__ import annotations

import csv
import html
import io
import json
import re
import xml.etree.ElementTree as ET
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import quote

import pytest
from ledger_sessions import ALL_USERS, CS101, HOSTILE_GROUP, HOSTILE_USER, seed_ledger
from webapp_client import ADMIN, INSTRUCTOR, PLAIN, VIEWER, FakeHubAuth, PageSite, Text, serve

from spawner.hubconfig.rbac import USAGE_SCOPE, instructor_roles
from spawner.webapp import app as service
from spawner.webapp.access import Access, Refused, access_for, group_filter, user_group
from spawner.webapp.app import webapp_service
from spawner.webapp.base import BaseHandler
from spawner.webapp.report import window

ROOT = Path(__file__).resolve().parents[2]


# --- a seeded ledger (also used by test_browser_usage.py) -----------------------------------


# --- access decisions ---------------------------------------------------------------------


TWO_CLASSES = {"kind": "user", "name": "prof-bo", "admin": False,
               "scopes": [f"{USAGE_SCOPE}!group=cs102", f"{USAGE_SCOPE}!group=cs101",
                          f"{USAGE_SCOPE}!user=alice"]}


def test_who_sees_what():
    assert access_for(ADMIN) == Access("admin", everything=True)
    assert access_for(VIEWER) == Access("finance", everything=True)
    assert access_for(INSTRUCTOR) == Access("prof-ada", everything=False, groups=("cs101",))
    # two classes: both, sorted; a user filter is no way in
    assert access_for(TWO_CLASSES).groups == ("cs101", "cs102")
    assert access_for(PLAIN) is None
    assert access_for(None) is None
    assert access_for({"name": "x", "admin": "yes", "scopes": []}) is None  # only True counts


def test_an_instructor_is_held_to_the_class():
    ada = access_for(INSTRUCTOR)
    assert group_filter(ada, "") == "cs101"
    assert group_filter(ada, "cs101") == "cs101"
    with pytest.raises(Refused) as refused:
        group_filter(ada, "ml-platform")
    assert refused.value.status_code == 403
    assert str(refused.value) == "You can see the usage of cs101 only."
    admin = access_for(ADMIN)
    assert group_filter(admin, "") is None and group_filter(admin, "ml-platform") == "ml-platform"


def test_a_users_page_needs_sessions_in_the_class():
    ada = access_for(INSTRUCTOR)
    assert user_group(ada, "", ["cs101"]) == "cs101"
    with pytest.raises(Refused, match="has no sessions there"):
        user_group(ada, "", [])
    with pytest.raises(Refused, match="cs101 only"):
        user_group(ada, "ml-platform", ["cs101"])
    bo = access_for(TWO_CLASSES)
    assert user_group(bo, "", ["cs102"]) == "cs102"
    assert user_group(bo, "cs102", ["cs101", "cs102"]) == "cs102"
    assert user_group(access_for(ADMIN), "", []) is None


def test_periods():
    now = datetime(2025, 3, 14, 15, 30, tzinfo=timezone.utc).timestamp()
    utc = timezone.utc

    def days(w):
        return (w.since_day, w.until_day, w.until - w.since)

    this = window("", "", "", now, utc)
    assert this.period == "this-month" and this.since_day == "2025-03-01"
    assert this.until == now and this.label == "March 2025 so far"
    last = window("last-month", "", "", now, utc)
    assert days(last) == ("2025-02-01", "2025-02-28", 28 * 86400)
    assert last.label == "February 2025"
    assert window("30d", "", "", now, utc).since == now - 30 * 86400
    custom = window("custom", "2025-01-10", "2025-01-12", now, utc)
    assert days(custom) == ("2025-01-10", "2025-01-12", 3 * 86400)  # both days included
    with pytest.raises(Refused) as bad:
        window("custom", "10/01/2025", "", now, utc)
    assert bad.value.status_code == 400 and "not a date like 2025-01-31" in str(bad.value)
    with pytest.raises(Refused, match="before the start"):
        window("custom", "2025-01-12", "2025-01-10", now, utc)


def test_the_service_for_the_hub_config():
    svc, role, own = webapp_service("http://127.0.0.1:8000", "sqlite:////x/usage.sqlite",
                                   "/x/quotas.yaml", url="http://127.0.0.1:9999")
    assert svc["name"] == "usage" and svc["url"] == "http://127.0.0.1:9999"
    assert svc["command"][1:] == ["-m", "spawner.webapp"]
    assert svc["environment"]["QUOTA_SPAWNER_USAGE_DB"] == "sqlite:////x/usage.sqlite"
    assert svc["environment"]["QUOTA_SPAWNER_QUOTA_FILE"] == "/x/quotas.yaml"
    assert svc["oauth_client_allowed_scopes"] == [USAGE_SCOPE]
    assert svc["oauth_no_confirm"] is True
    assert role["scopes"] == [USAGE_SCOPE, "access:services!service=usage"]
    assert role["users"] == []
    # the table editor's preview reads users, groups and servers with the service's token
    assert own == {"name": "usage-service", "description": own["description"],
                   "scopes": ["list:users", "read:users:groups", "read:servers"],
                   "services": ["usage"]}
    (instructor,) = instructor_roles({"cs101": ["prof-ada"]})
    assert f"{USAGE_SCOPE}!group=cs101" in instructor["scopes"]
    assert "access:services!service=usage" in instructor["scopes"]
    (without,) = instructor_roles({"cs101": ["prof-ada"]}, usage_page="")
    assert not any("usage" in s for s in without["scopes"])


def test_the_shipped_hub_config_runs_the_page(tmp_path, monkeypatch):
    from shipped_config import load_hub_config

    c = load_hub_config(tmp_path, monkeypatch, QUOTA_SPAWNER_DEMO="1")
    (usage,) = [s for s in c.JupyterHub.services if s["name"] == "usage"]
    assert usage["environment"]["QUOTA_SPAWNER_USAGE_DB"] == c.QuotaSpawner.usage_db
    assert usage["environment"]["QUOTA_SPAWNER_QUOTA_FILE"] == c.QuotaSpawner.quota_file
    assert USAGE_SCOPE in c.JupyterHub.custom_scopes
    (ada,) = [r for r in c.JupyterHub.load_roles if "prof-ada" in r.get("users", [])]
    assert f"{USAGE_SCOPE}!group=cs101" in ada["scopes"]
    off = load_hub_config(tmp_path, monkeypatch, QUOTA_SPAWNER_DEMO="1",
                          QUOTA_SPAWNER_USAGE_URL="0")
    assert "usage" not in [s["name"] for s in off.JupyterHub.services]
    assert USAGE_SCOPE in off.JupyterHub.custom_scopes  # instructors' roles still name it


# --- the pages, served by tornado -------------------------------------------------------------


class Site(PageSite):
    def __init__(self, port: int):
        super().__init__(port)


@pytest.fixture
async def site(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'usage.sqlite'}"
    seed_ledger(url)
    auth = FakeHubAuth({"admin": ADMIN, "prof-ada": INSTRUCTOR, "carol": PLAIN,
                        "nobody": {**PLAIN, "scopes": []}})
    monkeypatch.setattr(BaseHandler, "hub_auth", property(lambda self: auth))
    app = service.make_app(usage_db=url, quota_file=str(ROOT / "hub_config" / "quotas.yaml"))
    server, port = serve(app)
    yield Site(port)
    server.stop()
    app.settings["usage"].reader.close()


def rows_of(page: str) -> set[str]:
    return {html.unescape(k) for k in re.findall(r'<tr class="row" data-key="([^"]*)"', page)}


async def test_the_admin_sees_every_session(site):
    r = await site.get("?period=30d", "admin")
    assert r.code == 200
    page = r.body.decode()
    assert rows_of(page) == ALL_USERS
    parsed = Text(page)
    assert "script" not in parsed.tags  # the hostile names are text, never markup
    assert HOSTILE_USER in parsed.words and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert r.headers["Content-Security-Policy"].startswith("default-src 'none'")
    # the charts are inline SVG, well-formed, with bars
    svgs = [page[m.start():page.index("</svg>", m.start()) + 6]
            for m in re.finditer(r"<svg ", page)]
    assert len(svgs) == 4  # per day, top users, CPU and memory (GPU is the top users)
    for svg in svgs:
        ET.fromstring(svg)
    assert 'class="chart gpu-days"' in page and 'class="chart top-users"' in page
    assert page.count('class="bar') > 10
    # every group, the hostile one too, in the picker
    assert '<option value="a&#34;b&amp;c">' in page or '<option value="a&quot;b&amp;c">' in page
    # the advice, from the quota table: bob's senior-engineer sessions fit pipeline
    assert "pipeline with 2 GiB and 1 CPU would have served 6 of them" in parsed.words
    # by group: the hostile group is a row, escaped
    r = await site.get(f"?period=30d&by=group&group={quote(HOSTILE_GROUP)}", "admin")
    assert rows_of(r.body.decode()) == {HOSTILE_GROUP}


async def test_the_instructor_sees_the_class_only(site):
    r = await site.get("?period=30d", "prof-ada")
    assert r.code == 200
    page = r.body.decode()
    assert rows_of(page) == CS101
    assert "bob" not in Text(page).words and "ml-platform" not in page
    # another group, asked for in the URL: refused, not widened
    r = await site.get("?period=30d&group=ml-platform", "prof-ada")
    assert r.code == 403 and "You can see the usage of cs101 only." in r.body.decode()
    # the downloads hold the class only, too
    r = await site.get("report.csv?period=30d", "prof-ada")
    assert r.code == 200 and r.headers["Content-Type"].startswith("text/csv")
    assert "attachment" in r.headers["Content-Disposition"]
    keys = {row[0] for row in csv.reader(io.StringIO(r.body.decode()))}
    assert keys == CS101 | {"user", "(total)"}
    r = await site.get("report.json?period=30d&by=role", "prof-ada")
    report = json.loads(r.body)
    assert {row["key"] for row in report["rows"]} == {"gpu-lab", "student"}
    assert report["group"] == "cs101"


async def test_a_users_page_for_whom_may_see_it(site):
    hostile = quote(HOSTILE_USER, safe="")
    r = await site.get(f"user?name={hostile}&period=30d", "prof-ada")
    assert r.code == 200
    page = r.body.decode()
    assert "script" not in Text(page).tags
    assert 'class="chart timeline"' in page and 'data-reason="max-age"' in page
    r = await site.get("user?name=alice&period=30d", "admin")
    page = r.body.decode()
    assert r.code == 200 and page.count('class="session"') == 3
    assert {"culled", "stopped", "oom"} <= set(re.findall(
        r'rect class="bar session" data-reason="([^"]+)"', page))
    # a user outside the class: refused, whatever the URL says
    for path in ("user?name=bob&period=30d", "user?name=bob&group=ml-platform",
                 "user?name=nobody-at-all", f"user?name=mallory&group={quote(HOSTILE_GROUP)}"):
        r = await site.get(path, "prof-ada")
        assert r.code == 403, path
        assert "You can see the usage of" in r.body.decode()
    assert (await site.get("user?name=bob&period=30d", "admin")).code == 200


def home_cells(page: str) -> dict[str, str]:
    """Each row's home cell ("Total" for the total), as the browser shows it."""
    found = re.findall(r'<tr class="(?:row" data-key="([^"]*)|total)">.*?<td class="home">'
                       r'([^<]*)</td>', page, re.S)
    return {html.unescape(key) or "Total": html.unescape(cell) for key, cell in found}


async def test_the_homes_peak_of_size_on_the_pages_and_in_the_downloads(site):
    r = await site.get("?period=30d", "admin")
    page = r.body.decode()
    assert "Home: peak of size" in page
    assert home_cells(page) == {
        "alice": "3 GiB of 20 GiB", "bob": "2 GiB of 50 GiB", "student1": "–",
        HOSTILE_USER: "–", "mallory": "–", "dave": "–", "Total": "3 GiB of 50 GiB"}
    # the advice covers the home: bob's stayed far under its 50 GiB
    words = Text(page).words  # the names are isolated (<bdi>): a space around each
    assert ("bob used at most 1.2 GiB of 32 GiB and 0.5 of 8 CPUs, its home at most 2 GiB of "
            "50 GiB over 6 sessions as senior-engineer ; pipeline with 2 GiB and 1 CPU would "
            "have served 6 of them; a home of 5 GiB would do.") in words
    by_role = home_cells((await site.get("?period=30d&by=role", "admin")).body.decode())
    assert (by_role["gpu-lab"], by_role["student"]) == ("3 GiB of 20 GiB", "–")
    # one user's page: the summary and each session
    page = (await site.get("user?name=alice&period=30d", "admin")).body.decode()
    assert "the home held at most 3 GiB of 20 GiB." in Text(page).words
    assert re.findall(r'<td class="home">([^<]*)</td>', page) == ["3 GiB of 20 GiB"] * 3
    # the downloads: bytes
    r = await site.get("report.csv?period=30d", "admin")
    rows = {row["user"]: row for row in csv.DictReader(io.StringIO(r.body.decode()))}
    assert (rows["alice"]["home_size"], rows["alice"]["home_peak"]) == (str(20 * 2**30),
                                                                        str(3 * 2**30))
    assert (rows["dave"]["home_size"], rows["dave"]["home_peak"]) == ("", "")
    report = json.loads((await site.get("report.json?period=30d", "admin")).body)
    assert {(row["key"], row["home_size"], row["home_peak"]) for row in report["rows"]
            if row["key"] in ("bob", "dave")} == {("bob", 50 * 2**30, 2 * 2**30),
                                                  ("dave", None, None)}
    (advice,) = [a for a in report["advice"]
                 if (a["user"], a["role"]) == ("bob", "senior-engineer")]
    assert (advice["home_peak"], advice["home_size"], advice["home_suggestion"]) == (
        2 * 2**30, 50 * 2**30, 5 * 2**30)


@pytest.mark.parametrize("raw, sentence", [
    ("%ED%A0%80", "The 'name' in the address is not UTF-8 text; please check the link."),
    ("al%00ice", "The 'name' in the address holds a NUL character (U+0000) at character 3, "
                 "which is not text that can be stored; please remove it and send it again."),
])
async def test_an_address_argument_that_is_not_text_is_a_sentence(site, caplog, raw, sentence):
    """A query's bytes that are no UTF-8 (the encoding of a lone surrogate), or NUL, which
    PostgreSQL's text refuses: 400 with the sentence naming the argument, no traceback."""
    r = await site.get(f"user?name={raw}&period=30d", "admin")
    assert r.code == 400
    assert html.unescape(re.search(r'<section class="message" id="message"><p>(.*?)</p>',
                                   r.body.decode()).group(1)) == sentence
    assert [x.getMessage() for x in caplog.records if x.exc_info] == []


async def test_a_refusal_names_the_visitor_the_login_found(site):
    """An error page's frame (who is signed in, their pages) is the user model the
    request's login already found; a visitor the hub refuses is named nowhere."""
    r = await site.get("user?name=bob&period=30d", "prof-ada")
    page = r.body.decode()
    assert r.code == 403 and "You can see the usage of" in page
    assert 'Signed in as <strong class="me" dir="auto">prof-ada</strong>' in page
    assert 'aria-label="Pages of this service"' in page
    r = await site.get("user?name=alice", "nobody")
    assert r.code == 403 and "Signed in as" not in r.body.decode()


async def test_anyone_else_is_refused_with_a_sentence(site):
    # the front door sends a user to what they may do here: ask for a bigger role
    r = await site.get("", "carol")
    assert r.code == 302 and r.headers["Location"] == "/services/usage/requests"
    for who in ("carol", "nobody"):
        for path in ("" if who == "nobody" else "?period=30d", "user?name=alice",
                     "report.csv", "report.json"):
            r = await site.get(path, who)
            assert r.code == 403, (who, path)
            assert "The usage page is for admins and for the instructors of a class" in \
                r.body.decode()
    # not logged in: sent to the hub's login
    r = await site.get("")
    assert r.code == 302 and r.headers["Location"].startswith("/hub/login")


async def test_bad_dates_are_a_sentence(site):
    r = await site.get("?period=custom&since=yesterday", "admin")
    assert r.code == 400 and "is not a date like 2025-01-31" in r.body.decode()
    # the last day of the calendar has no day after it: out of range, not a 500
    for query in ("until=9999-12-31", "since=0001-01-01", "since=2026-01-01junk"):
        r = await site.get(f"?period=custom&{query}", "admin")
        assert r.code == 400, (query, r.code)
        assert ("out of range: reports cover 1970-01-01 to 9998-12-31" in r.body.decode()
                or "is not a date like" in r.body.decode())
    r = await site.get("user?name=alice&period=custom&until=9999-12-31", "admin")
    assert r.code == 400 and "<title>Usage</title>" in r.body.decode()


async def test_a_ledger_not_there_yet_is_a_sentence(tmp_path, monkeypatch):
    auth = FakeHubAuth({"admin": ADMIN})
    monkeypatch.setattr(BaseHandler, "hub_auth", property(lambda self: auth))
    missing = tmp_path / "state" / "usage.sqlite"
    app = service.make_app(usage_db=f"sqlite:///{missing}")
    server, port = serve(app)
    try:
        r = await Site(port).get("", "admin")
        assert r.code == 503
        assert "Nothing has been recorded yet: the usage ledger does not exist" in r.body.decode()
        assert not missing.exists()  # the page never creates the hub's ledger
        missing.parent.mkdir()
        missing.write_bytes(b"")  # there, but without the ledger's tables and version
        r = await Site(port).get("", "admin")
        assert r.code == 503 and "The usage ledger is older than this page" in r.body.decode()
        seed_ledger(f"sqlite:///{missing}")  # the hub created it: the page shows it
        r = await Site(port).get("?period=30d", "admin")
        assert r.code == 200 and rows_of(r.body.decode()) == ALL_USERS
    finally:
        server.stop()
