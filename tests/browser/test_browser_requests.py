"""Requests for a bigger role in Chromium, reached through a real hub login: a plain user
lands on the page from the hub's Services menu; a student asks (with the keyboard), an
admin or the instructor of the class approves, the student spawns with the granted role,
and the grant ends by itself; another request is refused with a comment. The instructor
of another class, and the student, see no request they may not decide, and the API
refuses them too. "The user is told": the events in the hub's event log are those the
watchdog's role_request rule turns into messages, and the user's page shows the decision.

One hub for the module, at most one notebook container at a time."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import pytest
from browser import BIDI_NAME, Visit, assert_reads_in_order, expect, launch
from hubs import on_hub
from sqlalchemy import update

from harness import Hub, container_for, containers, shipped_table_without_requests
from spawner.contract import ROLE_LABEL
from spawner.policy.config import hub_id_from_secret_file
from spawner.quota.loader import parse_quota_table
from spawner.quota.units import format_moment
from spawner.usage.ledger import Ledger, default_url
from spawner.usage.schema import role_requests
from spawner.watchdog.hub_events import for_hub, role_request_events
from spawner.watchdog.model import Snapshot
from spawner.watchdog.rules import WatchdogRules
from spawner.webapp.formatting import isolate
from spawner.webapp.requests import NOT_DECIDER

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

ROLE = "project"  # small enough for a 2-core machine: asked for, then granted
OPTIONS = {"profile": ROLE, "image": "pytorch"}
HOSTILE_REASON = '<img src=x onerror="alert(1)"> for the term project & more'


def quota_text() -> str:
    """The shipped table, a small role nobody holds, and requests that instructors decide."""
    text = shipped_table_without_requests()
    role = (f"  {ROLE}:\n    description: Term projects, beyond the lab\n    cpus: 1\n"
            "    memory: 1G\n    images: [pytorch]\n")
    text = text.replace("  instructor:\n", role + "  instructor:\n", 1)
    text += (f"\nrequests:\n  roles: [{ROLE}, gpu-training]\n  max_days: 14\n"
             "  instructors_approve: true\n")
    parse_quota_table(text, "quotas.yaml")  # a typo here would only show as a hub refusal
    return text


@pytest.fixture(scope="module")
def hub(hub):
    """The session's hub (tests/hubs.py: cs101's instructor is prof-ada, cs102's prof-bo)
    with this module's table and people, and a fresh ledger."""
    people = {"prof-ada": ["cs101-staff"], "prof-bo": ["cs102-staff"], "dora": ["cs102"],
              "carol": [], **{s: ["cs101"] for s in ("student1", "student2", "student3")}}
    with on_hub(hub, quota_text(), people, ledger=True):
        yield hub


@pytest.fixture(scope="module")
def browser():
    yield from launch()


class Person(Visit):
    """One person's browser on the requests page."""

    def open_requests(self) -> None:
        self.open_service_page("requests")
        expect(self.page.locator("header h1")).to_have_text("Role requests")

    def mine(self, role: str = ROLE):
        return self.page.locator("#mine tr.request", has=self.page.locator(
            "td.role", has_text=role))

    def to_decide(self, user: str):
        return self.page.locator("#decide article.request", has=self.page.locator(
            "h3 .user", has_text=user))

    def message(self):
        return self.page.locator("#page-message")

    def check_clean(self) -> None:
        """Nothing from outside the hub, no dialog, no script error (a refused API call is
        logged by Chromium as a failed resource: not a script's error)."""
        outside = [u for u in self.requests if not u.startswith(self.hub.url + "/")
                   and not u.startswith("data:")]
        assert outside == [], outside
        assert self.dialogs == [], self.dialogs
        errors = [e for e in self.errors if not e.startswith("Failed to load resource")]
        assert errors == [], errors


@pytest.fixture
def person(browser, hub):
    """``person()`` opens a browser context; all are closed after the test."""
    opened: list[Person] = []

    def make(**context: Any) -> Person:
        p = Person(browser, hub, **context)
        opened.append(p)
        return p

    yield make
    for p in opened:
        p.context.close()


def log_in(person, name: str, **context: Any) -> Person:
    p = person(**context)
    p.log_in(name)
    p.open_requests()
    return p


def events_of(hub: Hub, user: str) -> list[dict[str, Any]]:
    return [e for e in hub.events() if e.get("user") == user
            and str(e.get("event", "")).startswith("role-request")]


def wait_event(hub: Hub, user: str, name: str, timeout: float = 10) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [e for e in events_of(hub, user) if e["event"] == name]
        if found:
            return found[-1]
        time.sleep(0.1)
    raise AssertionError(f"no {name} event for {user}: {events_of(hub, user)}")


def the_user_is_told(hub: Hub, event: dict[str, Any]) -> None:
    """The event carries the hub's id, and the watchdog's role_request rule makes of it a
    message about this user (the watchdog routes it to the user's channel)."""
    hub_id = hub_id_from_secret_file(hub.prefix, str(hub.workdir / "jupyterhub_cookie_secret"))
    assert hub_id and event["hub"] == hub_id
    (told,) = role_request_events(for_hub([event], hub_id), WatchdogRules(),
                                  Snapshot(time=time.time(), host="test"))
    assert told.incident.rule == "role_request"
    assert told.incident.server.user == event["user"]
    # the hub's sentence, with what the user typed (reason, comment) quoted as data
    text = event["text"]
    typed = event.get("comment") or event.get("reason")
    if typed and text.endswith(typed):
        text = text[:-len(typed)]
    assert told.incident.what.startswith(text.rstrip("."))


def window_ends_now(hub: Hub, request_id: int) -> None:
    """The request's window ends now, as if its hour had passed: its end is moved to this
    moment in the ledger, where the spawner and the service read it (nothing is told)."""
    ledger = Ledger(default_url(str(hub.workdir)), create=False)
    try:
        with ledger.engine.begin() as db:
            db.execute(update(role_requests).where(role_requests.c.id == request_id)
                       .values(ends=time.time()))
    finally:
        ledger.dispose()


def refused_spawn(hub: Hub, docker_client, user: str) -> str:
    r = hub.spawn(user, OPTIONS)
    assert r.status_code == 400, (r.status_code, r.text)
    assert containers(docker_client, user) == []
    return r.json()["message"]


def spawn_with_the_grant(hub: Hub, docker_client, user: str) -> None:
    r = hub.spawn(user, OPTIONS)
    assert r.status_code in (201, 202), r.text
    hub.wait_ready(user)
    assert container_for(docker_client, user).labels[ROLE_LABEL] == ROLE
    hub.stop_server(user)


# --- the front door --------------------------------------------------------------------------


def test_a_plain_user_lands_on_role_requests_from_the_services_menu(person):
    p = person()
    p.log_in("carol")
    page = p.page
    page.get_by_role("button", name="Services").or_(
        page.get_by_role("link", name="Services")).click()
    page.get_by_role("link", name="usage", exact=True).click()
    page.wait_for_url("**/services/usage/requests")
    expect(page.locator("header h1")).to_have_text("Role requests")
    expect(page.locator("header nav a[aria-current=page]")).to_have_text("Role requests")
    # an option is plain text: the table's names isolated (FSI … PDI)
    expect(page.locator("#ask-role option")).to_have_text(
        [f"{isolate(ROLE)} — {isolate('Term projects, beyond the lab')}",
         f"{isolate('gpu-training')} — {isolate('A whole GPU for training runs')}"])
    expect(page.locator("#ask-submit")).to_be_enabled()  # the script ran
    expect(page.locator("#decide")).to_have_count(0)
    expect(page.get_by_text("You have not asked for a role yet.")).to_be_visible()
    p.shot("requests-plain-user")
    # the report stays refused; the deciders' API too
    assert p.api("GET", "?period=30d").status == 403
    r = p.api("GET", "api/requests/pending")
    assert (r.status, r.json()["message"]) == (403, NOT_DECIDER)
    p.check_clean()


# --- ask, approve, spawn, give up ----------------------------------------------------------


def test_ask_with_the_keyboard_then_the_admin_approves_and_the_grant_spawns(
        hub, person, docker_client):
    # without a grant, the role is refused at the spawn, with a sentence and no container
    assert refused_spawn(hub, docker_client, "student1").startswith(
        f"You asked for the role '{ROLE}', which you do not hold.")

    # a browser in New York with a 12-hour locale: the form still takes 24-hour times in
    # the service's zone (UTC), as the page's tables show them
    student = log_in(person, "student1", timezone_id="America/New_York", locale="en-US")
    page = student.page
    expect(page.locator("#held")).to_have_text("You hold student, gpu-lab.")
    expect(page.locator("label[for=ask-starts]")).to_contain_text("From (UTC)")
    assert page.get_attribute("#ask-starts", "type") == "text"
    shown = page.input_value("#ask-starts")
    utc_now = [datetime.fromtimestamp(time.time() + d, UTC).strftime("%Y-%m-%d %H:%M")
               for d in (-60, 0)]
    assert shown in utc_now, (shown, utc_now)
    expect(page.locator("#decide")).to_have_count(0)
    # the keyboard only: the role and the window keep their defaults (the first role,
    # from now to a day later), the reason is typed, Tab reaches the button, Enter asks
    expect(page.locator("#ask-role")).to_have_value(ROLE)
    page.focus("#ask-reason")
    page.keyboard.type(HOSTILE_REASON)
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.id") == "ask-submit"
    page.keyboard.press("Enter")
    # the asker reads about their own request, not the deciders' third-person sentence
    expect(student.message()).to_contain_text(f"You asked for the role '{ROLE}' from {shown}")
    expect(student.message()).to_contain_text("you are told either way.")
    assert page.evaluate("document.activeElement.id") == "page-message"
    row = student.mine()
    expect(row.locator(".status")).to_have_text("Waiting for a decision")
    expect(row.locator("td.reason")).to_have_text(HOSTILE_REASON)  # as text, not markup
    expect(row.locator("button.withdraw")).to_have_text("Withdraw")
    asked = wait_event(hub, "student1", "role-request")
    assert asked["reason"] == HOSTILE_REASON and asked["role"] == ROLE
    the_user_is_told(hub, asked)
    student.shot("requests-asked")

    # the student may not decide it: neither the page nor the API
    rid = asked["id"]
    r = student.api("GET", "api/requests/pending")
    assert (r.status, r.json()["message"]) == (403, NOT_DECIDER)
    r = student.api("POST", f"api/requests/{rid}/decide", {"approve": True})
    assert (r.status, r.json()["message"]) == (403, "You may not decide the requests of "
                                                    "student1.")

    # the instructor of another class sees the section (for cs102) but not this request
    other = log_in(person, "prof-bo")
    expect(other.page.locator("#decide h2")).to_have_text("Requests to decide")
    expect(other.to_decide("student1")).to_have_count(0)
    expect(other.page.locator("#none-to-decide")).to_be_visible()
    r = other.api("POST", f"api/requests/{rid}/decide", {"approve": True})
    assert (r.status, r.json()["message"]) == (403, "You may not decide the requests of "
                                                    "student1.")
    other.check_clean()

    # the admin approves, with the keyboard: a comment, Tab to Approve, Enter
    admin = log_in(person, "admin")
    request = admin.to_decide("student1")
    expect(request).to_have_count(1)
    expect(request.locator("dd.reason")).to_have_text(HOSTILE_REASON)
    expect(request.locator("dd.groups")).to_have_text("cs101")
    admin.shot("requests-to-decide")
    request.locator("input[name=comment]").focus()
    admin.page.keyboard.type("for the term project")
    admin.page.keyboard.press("Tab")
    assert admin.page.evaluate("document.activeElement.textContent") == "Approve"
    admin.page.keyboard.press("Enter")
    # the approver reads what they did; "Your request … was approved" is the student's
    expect(admin.message()).to_contain_text(
        f"You approved student1's request for the role '{ROLE}': they hold it from ")
    expect(admin.to_decide("student1")).to_have_count(0)
    r = admin.api("POST", f"api/requests/{rid}/decide", {"approve": False, "comment": "no"})
    assert (r.status, r.json()["message"]) == (400, "This request was already approved by "
                                                    "admin.")
    admin.check_clean()

    # the user is told: the event for the watchdog, and their page
    approved = wait_event(hub, "student1", "role-request-approved")
    assert (approved["who"], approved["comment"]) == ("admin", "for the term project")
    the_user_is_told(hub, approved)
    page.reload()
    expect(row.locator(".status")).to_contain_text("Approved by admin, until ")
    expect(row.locator("q.comment")).to_have_text("for the term project")
    expect(page.locator("#held")).to_contain_text(f"(granted for a time: {ROLE})")

    # the spawner honours the grant
    spawn_with_the_grant(hub, docker_client, "student1")

    # giving the grant up ends it at once
    row.locator("button.withdraw").click()
    expect(student.message()).to_have_text(f"You gave up your grant of the role '{ROLE}'.")
    expect(row.locator(".status")).to_contain_text("Withdrawn")
    wait_event(hub, "student1", "role-request-withdrawn")
    refused_spawn(hub, docker_client, "student1")
    student.check_clean()


def test_the_instructor_approves_and_the_grant_ends_by_itself(hub, person, docker_client):
    student = log_in(person, "student2")
    # a window of an hour: long enough to approve and spawn; the test ends it in the ledger
    ends = time.time() + 3600
    r = student.api("POST", "api/requests", {"role": ROLE, "starts": time.time(),
                                              "ends": ends, "reason": "A quick run."})
    assert r.status == 200, r.text()
    rid = r.json()["request"]["id"]
    # a request of cs102, which prof-ada must not see
    dora = log_in(person, "dora")
    r = dora.api("POST", "api/requests", {"role": ROLE, "starts": time.time(),
                                           "ends": time.time() + 3600, "reason": "cs102 work"})
    assert r.status == 200, r.text()
    dora_id = r.json()["request"]["id"]

    prof = log_in(person, "prof-ada")
    expect(prof.to_decide("student2")).to_have_count(1)
    expect(prof.to_decide("dora")).to_have_count(0)
    r = prof.api("POST", f"api/requests/{dora_id}/decide", {"approve": True})
    assert (r.status, r.json()["message"]) == (403, "You may not decide the requests of dora.")
    prof.to_decide("student2").get_by_role("button", name="Approve").click()
    expect(prof.message()).to_contain_text(
        f"You approved student2's request for the role '{ROLE}'")
    the_user_is_told(hub, wait_event(hub, "student2", "role-request-approved"))
    prof.check_clean()

    spawn_with_the_grant(hub, docker_client, "student2")
    student.page.reload()
    expect(student.mine().locator(".status")).to_contain_text("Approved by prof-ada, until ")

    # after the window: the role is refused again, and the page shows the grant ended
    window_ends_now(hub, rid)
    assert refused_spawn(hub, docker_client, "student2").startswith(
        f"You asked for the role '{ROLE}', which you do not hold.")
    student.page.reload()
    expect(student.mine().locator(".status")).to_contain_text("Expired: the grant ended on ")
    expect(student.mine().locator("button.withdraw")).to_have_count(0)
    expect(student.page.locator("#held")).to_have_text("You hold student, gpu-lab.")
    student.shot("requests-expired")
    r = student.api("POST", f"api/requests/{rid}/withdraw", {})
    assert (r.status, r.json()["message"]) == (400, "This grant has already ended.")
    student.check_clean()


# --- ask, refuse ---------------------------------------------------------------------------


def test_a_refusal_needs_a_comment_and_the_user_is_told(hub, person, docker_client):
    student = log_in(person, "student3")
    student.page.fill("#ask-reason", "More memory for the assignment.")
    student.page.click("#ask-submit")
    expect(student.mine().locator(".status")).to_have_text("Waiting for a decision")
    rid = wait_event(hub, "student3", "role-request")["id"]

    prof = log_in(person, "prof-ada")
    request = prof.to_decide("student3")
    # no comment: the page says why before asking, and the API refuses as well
    request.get_by_role("button", name="Refuse").click()
    expect(request.locator(".decide-result")).to_have_text(
        "Please say why you refuse: the user is told.")
    r = prof.api("POST", f"api/requests/{rid}/decide", {"approve": False, "comment": " "})
    assert (r.status, r.json()["message"]) == (400, "Please say why you refuse: the user "
                                                    "is told.")
    comment = "Use gpu-lab: <b>the lab GPUs</b> are enough."
    request.locator("input[name=comment]").fill(comment)
    request.get_by_role("button", name="Refuse").click()
    expect(prof.message()).to_have_text(
        f"You refused student3's request for the role '{ROLE}'. They are told, with your "
        "comment.")
    expect(prof.to_decide("student3")).to_have_count(0)
    prof.check_clean()

    refused = wait_event(hub, "student3", "role-request-refused")
    assert refused["comment"] == comment
    the_user_is_told(hub, refused)
    student.page.reload()
    row = student.mine()
    expect(row.locator(".status")).to_have_text("Refused by prof-ada")
    expect(row.locator("q.comment")).to_have_text(comment)
    expect(row.locator("q.comment b")).to_have_count(0)  # text, not markup
    expect(row.locator("button.withdraw")).to_have_count(0)
    student.shot("requests-refused")
    refused_spawn(hub, docker_client, "student3")
    student.check_clean()


# The closing quote a <q> draws after the comment (its ::after), against the comment's text:
# reversed into the comment by an override that runs on, it ends up inside the text's box.
QUOTE_AFTER = """(q) => {
  const range = document.createRange();
  range.selectNodeContents(q);
  return {text_right: range.getBoundingClientRect().right,
          quote_right: q.getBoundingClientRect().right};
}"""


def test_a_name_and_a_comment_with_a_bidi_override_read_in_order(hub, person):
    """A user named with U+202E (RIGHT-TO-LEFT OVERRIDE) asks, with such a reason; the admin
    refuses with such a comment: on the admin's page the words after the user's name, and
    on the user's page the quote after the comment, are drawn after them, not reversed
    into them."""
    hub.create_user(BIDI_NAME)
    eve = log_in(person, BIDI_NAME)
    eve.page.fill("#ask-reason", f"For {BIDI_NAME} and more.")
    eve.page.click("#ask-submit")
    expect(eve.mine().locator(".status")).to_have_text("Waiting for a decision")

    admin = log_in(person, "admin")
    request = admin.to_decide(BIDI_NAME)
    assert_reads_in_order(request.locator("h3"))  # "… asks for the role project"
    assert_reads_in_order(request.locator("label"))  # "Comment for … (required to refuse)"
    request.locator("input[name=comment]").fill(f"Not now, {BIDI_NAME}")
    request.get_by_role("button", name="Refuse").click()
    expect(admin.to_decide(BIDI_NAME)).to_have_count(0)
    admin.check_clean()

    eve.page.reload()
    comment = eve.mine().locator("q.comment")
    expect(comment).to_have_text(f"Not now, {BIDI_NAME}")
    found = comment.evaluate(QUOTE_AFTER)
    assert found["quote_right"] > found["text_right"] + 2, found
    eve.shot("requests-bidi")
    eve.check_clean()


# A reason and a comment made of the words of the sentence the watchdog puts around them.
SENTENCE_REASON = f"for the role '{ROLE}' from 2026-01-01 to 2026-01-02: because carol asks " \
                  f"for the role '{ROLE}'"
SENTENCE_COMMENT = f"was refused by admin: for the role '{ROLE}' from 2026-01-01: because"


def test_a_reason_and_a_comment_holding_the_sentences_words_show_whole(hub, person):
    """On the decider's page, on the user's page and in the watchdog's message (from the
    event's own fields, tests/service/test_watchdog_quoted_whole.py has every channel):
    all of what was typed, as text, and in the message in one pair of quotes."""
    carol = log_in(person, "carol")
    carol.page.fill("#ask-reason", SENTENCE_REASON)
    carol.page.click("#ask-submit")
    expect(carol.mine().locator("td.reason")).to_have_text(SENTENCE_REASON)
    asked = wait_event(hub, "carol", "role-request")

    admin = log_in(person, "admin")
    request = admin.to_decide("carol")
    expect(request.locator("dd.reason")).to_have_text(SENTENCE_REASON)
    request.locator("input[name=comment]").fill(SENTENCE_COMMENT)
    request.get_by_role("button", name="Refuse").click()
    expect(admin.to_decide("carol")).to_have_count(0)
    admin.check_clean()
    refused = wait_event(hub, "carol", "role-request-refused")

    carol.page.reload()
    expect(carol.mine().locator("td.reason")).to_have_text(SENTENCE_REASON)
    expect(carol.mine().locator("q.comment")).to_have_text(SENTENCE_COMMENT)
    carol.check_clean()
    window = f"from {format_moment(asked['starts'])} to {format_moment(asked['ends'])}"
    hub_id = hub_id_from_secret_file(hub.prefix, str(hub.workdir / "jupyterhub_cookie_secret"))
    said = role_request_events(for_hub([asked, refused], hub_id), WatchdogRules(),
                               Snapshot(time=time.time(), host="test"))
    assert [e.incident.what for e in said] == [
        f"carol asks for the role '{ROLE}' {window}: \"{SENTENCE_REASON}\"",
        f"Your request for the role '{ROLE}' was refused by admin: \"{SENTENCE_COMMENT}\""]
