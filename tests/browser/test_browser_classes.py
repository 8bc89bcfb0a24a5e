"""The class dashboard in Chromium, reached through a real hub login, for each role:

- a student is refused the pages and the API;
- the instructor of another class sees their own class only, and is refused cs101's
  page and actions, at the API too;
- the instructor of cs101 pre-warms it from the page with the role and image picked (the
  containers carry them), keeps the keyboard's place while the table refreshes, opens a
  student's server, stops one and then all (a second press confirms), schedules and
  cancels a pre-warm; their OAuth token, as the hub issued it, carries cs101's scopes
  only, and a visitor whom the service lets through but whose token the hub does not
  allow is refused by the hub itself;
- an admin sees every group and stops another class's server.
"""

from __future__ import annotations

import re
import time
from datetime import datetime, timedelta

import pytest
from browser import BIDI_NAME, Visit, assert_reads_in_order, drawing, expect, launch, visits
from hubs import leave, on_hub

from harness import Hub, container_for
from spawner.contract import IMAGE_LABEL, ROLE_LABEL
from spawner.hubconfig.rbac import USAGE_SCOPE
from spawner.webapp.classes import NOT_AN_INSTRUCTOR
from spawner.webapp.formatting import isolate

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

QUOTAS = """\
images:
  pytorch: {image: "quota-spawner/pytorch:latest"}
  paddle: {image: "quota-spawner/paddle:latest"}
roles:
  student: {cpus: 0.5, memory: 512M, images: [pytorch, paddle]}
  lab: {cpus: 0.5, memory: 512M, images: [pytorch]}
  big: {cpus: 1, memory: 1G, images: [pytorch]}
assignments:
  default: []
  groups:
    cs101: [student, lab]
    cs101-gpu: [big]
    cs102: [student]
    cs101-staff: [student]
    cs102-staff: [student]
"""
SERVICE_REFUSAL = "You manage the servers of {mine} only, not of {other}."
WAIT = 180_000  # ms: a container's start on a busy 2-core machine


@pytest.fixture(scope="module")
def hub(hub):
    """The session's hub (tests/hubs.py: cs101's instructor is prof-ada, cs102's prof-bo,
    and ta-kim is cs101's observer) with this module's table and classes, and a fresh
    ledger."""
    people = {"prof-ada": ["cs101-staff"], "prof-bo": ["cs102-staff"], "ta-kim": [],
              "ann": ["cs101", "cs101-gpu"], "ben": ["cs101"], "dan": ["cs102"]}
    with on_hub(hub, QUOTAS, people, ledger=True):
        yield hub


@pytest.fixture(scope="module")
def browser():
    yield from launch()


@pytest.fixture
def make(browser, hub):
    yield from visits(browser, hub)


def both(role: str, image: str, between: str) -> str:
    """"role with image" as the page writes it in plain text: each name isolated."""
    return f"{isolate(role)}{between}{isolate(image)}"


def rows(v: Visit):
    return v.page.locator("#members-body tr")


def row(v: Visit, name: str):
    return v.page.locator(f'#members-body tr[data-user="{name}"]')


def press(v: Visit, locator) -> None:
    """As a keyboard user does: focus, then Enter."""
    locator.focus()
    v.page.keyboard.press("Enter")


def refused(response, sentence: str) -> None:
    assert response.status == 403, (response.status, response.text())
    assert response.json()["message"] == sentence


def usage_tokens(hub: Hub, name: str) -> list[dict]:
    """The OAuth tokens the hub issued to the usage service for ``name``, with scopes."""
    r = hub.api("GET", f"/users/{name}/tokens")
    r.raise_for_status()
    found = [t for value in r.json().values() if isinstance(value, list) for t in value]
    return [t for t in found if any(s.startswith(USAGE_SCOPE) for s in t.get("scopes", ()))]


def test_a_student_is_refused_the_pages_and_the_api(make):
    v = make()
    v.log_in("ann")
    for path in ("classes", "classes/cs101"):
        v.open_service_page(path, status=403)
        expect(v.page.locator("#message")).to_have_text(NOT_AN_INSTRUCTOR)
    expect(v.page.locator("header nav")).not_to_contain_text("Classes")
    refused(v.api("GET", "api/classes"), NOT_AN_INSTRUCTOR)
    refused(v.api("GET", "api/classes/cs101"), NOT_AN_INSTRUCTOR)
    refused(v.api("POST", "api/classes/cs101/stop", {"all": True}), NOT_AN_INSTRUCTOR)
    refused(v.api("POST", "api/classes/cs101/prewarm", {"role": "student", "image": "pytorch"}),
            NOT_AN_INSTRUCTOR)


def test_the_instructor_of_another_class_sees_their_own_only(make, hub):
    v = make()
    v.log_in("prof-bo")
    v.open_service_page("classes")
    expect(v.page.locator("#classes a")).to_have_text(["cs102"])
    v.page.locator("#classes a").click()
    v.page.wait_for_url("**/services/usage/classes/cs102")
    expect(rows(v)).to_have_count(1)
    expect(row(v, "dan").locator("td.state")).to_have_text("stopped")
    v.check_stayed_home()
    sentence = SERVICE_REFUSAL.format(mine="cs102", other="cs101")
    v.open_service_page("classes/cs101", status=403)
    expect(v.page.locator("#message")).to_have_text(sentence)
    refused(v.api("GET", "api/classes/cs101"), sentence)
    refused(v.api("POST", "api/classes/cs101/stop", {"users": ["ann"]}), sentence)
    refused(v.api("POST", "api/classes/cs101/prewarm", {"role": "student", "image": "pytorch"}),
            sentence)
    refused(v.api("POST", "api/classes/cs101/prewarm",
                  {"role": "student", "image": "pytorch", "at": 2e9}), sentence)
    assert hub.user("ann")["servers"] == {}


def test_the_instructor_prewarms_opens_and_stops_their_class(make, hub, docker_client):
    v = make()
    v.log_in("prof-ada")
    page = v.page
    v.open_service_page("classes")
    expect(page.locator("#classes a")).to_have_text(["cs101"])
    press(v, page.locator("#classes a"))
    page.wait_for_url("**/services/usage/classes/cs101")
    expect(rows(v)).to_have_count(2)
    expect(page.locator("#members-body th.name")).to_have_text(["ann", "ben"])
    expect(page.locator("#members-body td.state")).to_have_text(["stopped", "stopped"])
    # the picker offers what every member holds; big is ann's only, and the page says so
    options = page.locator("#prewarm-choice option").all_text_contents()
    # an option is plain text: its names isolated (FSI … PDI), as in the status lines below
    assert sorted(options) == [both("lab", "pytorch", " with "),
                               both("student", "paddle", " with "),
                               both("student", "pytorch", " with ")]
    expect(page.locator("#lacking")).to_have_text("big with pytorch: not held by ben")

    # The token the hub gave the service for prof-ada: cs101's scopes, nothing wider.
    (token,) = usage_tokens(hub, "prof-ada")
    scopes = set(token["scopes"])
    assert {"list:users!group=cs101", "read:users!group=cs101"} <= scopes, scopes
    assert {"servers!group=cs101", "start:servers!group=cs101",
            "delete:servers!group=cs101"} <= scopes, scopes
    wide = {"servers", "delete:servers", "read:servers", "list:users", "read:users"}
    assert not scopes & wide, scopes
    assert not [s for s in scopes if "cs102" in s], scopes

    # the service refuses another class before the hub is asked
    sentence = SERVICE_REFUSAL.format(mine="cs101", other="cs102")
    refused(v.api("POST", "api/classes/cs102/stop", {"all": True}), sentence)
    refused(v.api("GET", "api/classes/cs102"), sentence)

    # pre-warm now, with the role and image picked
    page.select_option("#prewarm-choice", label=both("lab", "pytorch", " with "))
    page.check("#when-now")
    press(v, page.locator("#prewarm"))
    expect(page.locator("#action-status")).to_contain_text(
        f"Pre-warm with {both('lab', 'pytorch', ' and ')}",
                                                           timeout=WAIT)
    expect(page.locator("#action-results li")).to_have_count(2)
    for name in ("ann", "ben"):
        expect(row(v, name).locator("td.state")).to_have_text("running", timeout=WAIT)
        expect(row(v, name).locator("td.role")).to_have_text("lab · pytorch")
        labels = container_for(docker_client, name).labels
        assert (labels[ROLE_LABEL], labels[IMAGE_LABEL]) == ("lab", "pytorch")
        assert hub.user(name)["servers"][""]["user_options"] == {"profile": "lab",
                                                                 "image": "pytorch"}

    # the table refreshes without taking the keyboard's place
    stop_ben = row(v, "ben").locator("button.stop")
    stop_ben.focus()
    before = sum(1 for u in v.requests if u.endswith("/api/classes/cs101"))
    # the next refresh (every 5 s), and a moment for the page to redraw the table
    with page.expect_response(lambda r: r.url.endswith("/api/classes/cs101"), timeout=10_000):
        pass
    page.wait_for_timeout(500)
    assert sum(1 for u in v.requests if u.endswith("/api/classes/cs101")) > before
    assert page.evaluate("() => document.activeElement.closest('tr').dataset.user") == "ben"
    assert page.evaluate("() => document.activeElement.className") == "stop"

    # open a student's server, through the hub, as the instructor
    link = row(v, "ann").locator("a.open")
    assert link.get_attribute("href") == "/user/ann/"
    other = v.context.new_page()
    other.goto(hub.url + "/user/ann/lab")
    if "/oauth2/authorize" in other.url:  # the hub asks before a server of someone else
        other.locator("form button[type=submit], form input[type=submit]").first.click()
    expect(other).to_have_url(re.compile(r"/user/ann/"), timeout=60_000)
    other.close()

    # A visitor the service lets through but the hub does not: the hub refuses them.
    kim = make()
    kim.log_in("ta-kim")
    kim.open_service_page("classes/cs101")
    expect(kim.page.locator("#members-body td.state")).to_have_text(["running", "running"])
    r = kim.api("POST", "api/classes/cs101/stop", {"users": ["ann"]})
    assert r.status == 403, r.text()
    assert r.json()["message"].startswith("The hub refused to stop these servers for you")
    assert [x["outcome"] for x in r.json()["results"]] == ["refused"]
    kim.page.bring_to_front()
    assert kim.errors == [], kim.errors
    press(kim, row(kim, "ben").locator("button.stop"))
    press(kim, row(kim, "ben").locator("button.stop"))
    expect(kim.page.locator("#action-status")).to_contain_text("The hub refused to stop")
    expect(kim.page.locator('#action-results li[data-user="ben"]')).to_contain_text("refused")
    assert hub.user("ann")["servers"][""]["ready"] and hub.user("ben")["servers"][""]["ready"]

    # stop one: the first press asks, the second stops
    page.bring_to_front()
    press(v, stop_ben)
    expect(stop_ben).to_have_text("Press again to stop")
    expect(page.locator("#action-status")).to_contain_text(
        f"Press Stop again to stop {isolate('ben')}'s")
    assert hub.user("ben")["servers"][""]["ready"]
    page.keyboard.press("Enter")
    expect(page.locator('#action-results li[data-user="ben"]')).to_contain_text(
        re.compile("ben: (stopped|stopping)"), timeout=WAIT)
    expect(row(v, "ben").locator("td.state")).to_have_text("stopped", timeout=WAIT)
    expect(row(v, "ann").locator("td.state")).to_have_text("running")

    # stop all: Escape keeps the servers, two presses stop them
    stop_all = page.locator("#stop-all")
    press(v, stop_all)
    expect(stop_all).to_have_text("Press again to stop every server of cs101")
    page.keyboard.press("Escape")
    expect(page.locator("#action-status")).to_have_text("Nothing was stopped.")
    expect(stop_all).to_have_text("Stop every server of cs101")
    assert hub.user("ann")["servers"][""]["ready"]
    press(v, stop_all)
    page.keyboard.press("Enter")
    expect(page.locator('#action-results li[data-user="ann"]')).to_contain_text(
        re.compile("ann: (stopped|stopping)"), timeout=WAIT)
    expect(page.locator("#members-body td.state")).to_have_text(["stopped", "stopped"],
                                                                timeout=WAIT)

    # the observer's pre-warm reaches the hub, which refuses every start
    r = kim.api("POST", "api/classes/cs101/prewarm", {"role": "student", "image": "pytorch"})
    assert r.status == 403, r.text()
    assert r.json()["message"].startswith("The hub refused to start these servers for you")
    assert hub.user("ann")["servers"] == {} and hub.user("ben")["servers"] == {}

    # schedule a pre-warm for a lab in an hour, see it listed, cancel it
    when = (datetime.now() + timedelta(hours=1)).replace(second=0, microsecond=0)
    page.select_option("#prewarm-choice", label=both("student", "paddle", " with "))
    page.fill("#prewarm-at", when.strftime("%Y-%m-%dT%H:%M"))
    assert page.is_checked("#when-at")
    press(v, page.locator("#prewarm"))
    expect(page.locator("#action-status")).to_contain_text(
        f"Scheduled: the servers of {isolate('cs101')} start with "
        f"{both('student', 'paddle', ' and ')} at "
        + when.strftime("%Y-%m-%d %H:%M"))
    planned = page.locator("#schedules-body tr")
    expect(planned).to_have_count(1)
    expect(planned.locator("td.schedule-state")).to_have_text("pending")
    expect(planned).to_contain_text("student · paddle")
    expect(planned).to_contain_text("prof-ada")
    (listed,) = v.api("GET", "api/classes/cs101/schedules").json()["schedules"]
    assert listed["at"] == when.timestamp()
    press(v, planned.locator("button.cancel"))
    expect(planned.locator("td.schedule-state")).to_have_text("cancelled")
    expect(page.locator("#action-status")).to_contain_text("Cancelled the pre-warm")
    expect(planned.locator("button.cancel")).to_have_count(0)
    v.shot("class-dashboard-instructor")
    v.check_stayed_home()


# what a refresh of the dashboard brings (static/classes.js's LIVE)
LIVE_PARTS = ("#members-body", "#no-members", "#prewarm-choice", "#prewarm", "#no-choices",
              "#lacking-block", "#schedules-body", "#no-schedules")
AGO = re.compile(r"just now|N min ago|N h ago|N days ago")


def live_parts(v: Visit) -> list[str]:
    """The dashboard's live parts as drawn; "12 min ago" and "just now" alike."""
    return [AGO.sub("ago", drawing(v.page.locator(part))) for part in LIVE_PARTS]


def test_a_refresh_brings_the_dashboard_as_the_service_draws_it(make, hub):
    """The script draws none of the dashboard: after its refresh the members, the picker
    and the schedules are, element for element, what a fresh load of the page shows, as
    the service drew it (with the schedules' times in the browser's zone)."""
    v = make()
    v.log_in("prof-ada")
    v.open_service_page("classes/cs101")
    r = v.api("POST", "api/classes/cs101/prewarm",
              {"role": "student", "image": "pytorch", "at": time.time() + 3600})
    assert r.status == 201, r.text()
    planned = r.json()["id"]
    try:
        v.open_service_page("classes/cs101")  # drawn with the pending schedule
        fresh = live_parts(v)
        assert 'class="cancel secondary"' in fresh[LIVE_PARTS.index("#schedules-body")]
        with v.page.expect_response(lambda r: r.url.endswith("/api/classes/cs101"),
                                    timeout=10_000):
            pass
        v.page.wait_for_timeout(500)
        assert live_parts(v) == fresh
        v.check_stayed_home()
    finally:
        v.api("DELETE", f"api/classes/cs101/schedules/{planned}")


def test_an_admin_sees_every_group_and_stops_another_classes_server(make, hub):
    hub.start_server("dan", {"profile": "student", "image": "pytorch"})
    ada = make()
    ada.log_in("prof-ada")
    ada.open_service_page("classes/cs101")
    refused(ada.api("POST", "api/classes/cs102/stop", {"users": ["dan"]}),
            SERVICE_REFUSAL.format(mine="cs101", other="cs102"))
    assert hub.user("dan")["servers"][""]["ready"]

    v = make()
    v.log_in("admin")
    page = v.page
    v.open_service_page("classes")
    listed = page.locator("#classes a").all_text_contents()
    assert {"cs101", "cs101-gpu", "cs101-staff", "cs102", "cs102-staff"} <= set(listed), listed
    page.locator("#classes a", has_text=re.compile("^cs102$")).click()
    page.wait_for_url("**/services/usage/classes/cs102")
    expect(row(v, "dan").locator("td.state")).to_have_text("running")
    expect(row(v, "dan").locator("td.role")).to_have_text("student · pytorch")
    stop = row(v, "dan").locator("button.stop")
    press(v, stop)
    page.keyboard.press("Enter")
    expect(row(v, "dan").locator("td.state")).to_have_text("stopped", timeout=WAIT)
    assert v.api("GET", "api/classes/cs101").status == 200
    v.shot("class-dashboard-admin")
    v.check_stayed_home()


def test_a_member_named_with_a_bidi_override_reads_in_order(make, hub):
    """A member of cs102 named with U+202E (RIGHT-TO-LEFT OVERRIDE): in "not held by dan,
    eve…, zed" the names after theirs are drawn after it, not reversed into it, as the
    service draws the page and as the script redraws it, for the instructor and an admin."""
    joined = {BIDI_NAME: ["cs102"], "zed": ["cs102"], "amy": ["cs102", "cs101-gpu"]}
    for name, groups in joined.items():
        hub.create_user(name, groups)
    try:
        for who in ("prof-bo", "admin"):
            v = make()
            v.log_in(who)
            v.open_service_page("classes/cs102")
            lacking = v.page.locator("#lacking li", has_text=BIDI_NAME)
            expect(lacking).to_contain_text("big with pytorch: not held by dan, ")
            assert_reads_in_order(lacking)  # as the service drew it
            # the script's first refresh draws the list again, in place of the service's
            lacking.evaluate("(li) => { li.dataset.drawn = 'service'; }")
            v.page.wait_for_function(
                "() => { const li = document.querySelector('#lacking li');"
                " return li && li.dataset.drawn !== 'service'; }", timeout=30_000)
            assert_reads_in_order(lacking)
            v.shot(f"class-dashboard-bidi-{who}")
            v.check_stayed_home()
    finally:
        for name, groups in joined.items():
            leave(hub, name, groups)
