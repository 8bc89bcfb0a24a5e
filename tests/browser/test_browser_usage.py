"""The usage page in Chromium, reached the way people reach it: log in at the hub, open
the Services menu, click "usage". The admin sees every session, the instructor of
cs101 only the class, and anyone else is refused; the charts are drawn; nothing is
loaded from outside the hub."""

from __future__ import annotations

import csv
import io
import time
from urllib.parse import quote

import pytest
from browser import BIDI_NAME, assert_reads_in_order, assert_text_reads_in_order, launch, visits
from browser import Visit as BrowserVisit
from hubs import SHIPPED_QUOTAS, on_hub
from ledger_sessions import ALL_USERS, CS101, HOSTILE_USER, seed_ledger
from playwright.sync_api import expect

from harness import Hub
from spawner.hubconfig.rbac import USAGE_SCOPE
from spawner.usage.ledger import Ledger, Sample, default_url

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

@pytest.fixture(scope="module")
def hub(hub):
    """The session's hub (tests/hubs.py) with the shipped table, and a ledger of the seeded
    sessions only: what the page shows."""
    people = {"prof-ada": ["cs101-staff"], "alice": ["cs101"], "carol": []}
    with on_hub(hub, SHIPPED_QUOTAS, people, ledger=True):
        seed_ledger(default_url(str(hub.workdir)))
        yield hub


@pytest.fixture(scope="module")
def browser():
    yield from launch()


class Visit(BrowserVisit):
    """One person's browser on the usage page."""

    def open_usage_from_the_menu(self) -> None:
        page = self.page
        page.get_by_role("button", name="Services").or_(
            page.get_by_role("link", name="Services")).click()
        page.get_by_role("link", name="usage", exact=True).click()
        page.wait_for_url("**/services/usage/**")
        expect(page.locator("header h1")).to_have_text("Usage")

    def pick(self, period: str) -> None:
        self.page.select_option("#period", period)
        with self.page.expect_navigation():
            self.page.click("form.picker button[type=submit]")

    def rows(self) -> set[str]:
        return set(self.page.locator("table.report tr.row td.key").all_inner_texts())

    def shot(self, name: str) -> None:
        super().shot(f"usage-{name}")


@pytest.fixture
def visit(browser, hub):
    yield from visits(browser, hub, Visit, accept_downloads=True)


def oauth_scopes(hub: Hub, user: str) -> set[str]:
    """The scopes of the token the usage page got for ``user`` through the hub's OAuth."""
    r = hub.api("GET", f"/users/{quote(user)}/tokens")
    r.raise_for_status()
    tokens = [t for t in r.json()["api_tokens"] if t.get("oauth_client") and
              "usage" in t["oauth_client"]]
    assert tokens, r.json()
    return set(tokens[-1]["scopes"])


# Each chart label as Chromium lays it out: one past its chart's edge is cut off on screen
# ("use not meas…"). The y axis's turned unit is left out.
CUT_LABELS = """() => {
  const cut = [];
  for (const svg of document.querySelectorAll("svg.chart")) {
    const width = svg.viewBox.baseVal.width;
    for (const t of svg.querySelectorAll("text:not([transform])")) {
      const box = t.getBBox();
      if (box.x < -0.5 || box.x + box.width > width + 0.5)
        cut.push(`${t.textContent}: ${box.x.toFixed(1)} to ${(box.x + box.width).toFixed(1)}`
                 + ` of ${width}`);
    }
  }
  return cut;
}"""


def test_the_admin_sees_everything_and_opens_a_user(hub, visit):
    v = visit()
    v.log_in("admin")
    v.open_usage_from_the_menu()
    page = v.page
    v.pick("30d")
    expect(page.locator("#scope")).to_contain_text("every session")
    assert v.rows() == ALL_USERS
    # the hostile name is text in the table, never markup
    expect(page.locator("td.key", has_text=HOSTILE_USER)).to_have_count(1)
    assert page.locator("table.report script").count() == 0
    # the charts: inline SVG with bars
    for chart in ("gpu-days", "top-users", "reserved-used.cpu", "reserved-used.memory"):
        assert page.locator(f"svg.chart.{chart} rect.bar").count() > 0, chart
    assert page.locator("svg.chart.gpu-days circle.used").count() >= 2
    assert page.evaluate(CUT_LABELS) == []
    expect(page.locator("#advice li.suggests").first).to_contain_text("would have served")
    v.shot("admin")

    # the CSV download holds the same report
    with page.expect_download() as download:
        page.click("#download-csv")
    text = open(download.value.path(), encoding="utf-8").read()
    assert {row[0] for row in csv.reader(io.StringIO(text))} == ALL_USERS | {"user", "(total)"}

    # one user's sessions over time, from the table
    page.locator("a.user-link", has_text="alice").click()
    page.wait_for_url("**/services/usage/user?**")
    expect(page.locator("#scope")).to_contain_text("the sessions of alice")
    assert page.locator("svg.chart.timeline rect.bar.session").count() == 3
    assert page.locator("table.sessions tr.session").count() == 3
    assert page.evaluate(CUT_LABELS) == []
    expect(page.locator("table.sessions")).to_contain_text("killed for memory")
    v.shot("admin-user")
    v.check_stayed_home()
    # what the hub's OAuth gave the page: the admin flag does it, not the scope
    assert USAGE_SCOPE not in oauth_scopes(hub, "admin")
    assert hub.user("admin")["admin"] is True


def test_the_instructor_sees_the_class_only(hub, visit):
    v = visit()
    v.log_in("prof-ada")
    v.open_usage_from_the_menu()
    page = v.page
    v.pick("30d")
    expect(page.locator("#scope")).to_contain_text("the sessions of group cs101")
    assert v.rows() == CS101
    expect(page.locator("#charts")).not_to_contain_text("bob")
    assert page.locator("svg.chart.top-users rect.bar").count() > 0
    v.shot("instructor")
    # the class's hostile user: a page whose name is text
    page.locator("a.user-link", has_text=HOSTILE_USER).click()
    page.wait_for_url("**/services/usage/user?**")
    expect(page.locator("#scope strong.name")).to_have_text(HOSTILE_USER)
    assert page.locator("svg.chart.timeline rect.bar.session").count() == 1
    v.shot("instructor-user")
    # another user's page, by URL: refused, not just hidden
    response = page.goto(f"{hub.url}/services/usage/user?name=bob&period=30d")
    assert response.status == 403
    expect(page.locator("#message")).to_contain_text(
        "You can see the usage of the members of cs101 only")
    v.shot("instructor-refused")
    response = page.goto(f"{hub.url}/services/usage/?period=30d&group=ml-platform")
    assert response.status == 403
    v.check_stayed_home()
    # the hub's OAuth carried the usage scope filtered to the class
    assert f"{USAGE_SCOPE}!group=cs101" in oauth_scopes(hub, "prof-ada")


def test_anyone_else_is_refused(hub, visit):
    v = visit()
    v.log_in("carol")
    page = v.page
    # every user may reach the service (for requests for a bigger role), but its report
    # is refused with the service's own sentence
    response = page.goto(f"{hub.url}/services/usage/?period=30d")
    assert response.status == 403
    expect(page.locator("body")).to_contain_text("The usage page is for admins and for the "
                                                 "instructors of a class")
    assert page.locator("table.report").count() == 0
    v.shot("refused")


def seed_sessions_of(url: str, user: str, count: int = 2) -> None:
    """``count`` sampled sessions of ``user`` in the last day, in the junior-researcher role
    the shipped table gives everyone: a row, bars, a timeline and a line of advice."""
    ledger = Ledger(url)
    now = time.time()
    for n in range(count):
        container, start = f"bidi-{n}", now - (6 - 2 * n) * 3600
        ledger.open(hub="seeded", user=user, container=container, role="junior-researcher",
                    image="pytorch", cpu_limit=2, mem_limit=4 * 2**30, groups=["cs101"],
                    requested=start - 5)
        ledger.started("seeded", container, f"bidi{n}", when=start)
        ledger.ready("seeded", container, when=start + 10)
        ledger.fold([Sample("seeded", container, start + 1800, cpu=0.5, memory=2**30,
                            gpu_util=None, gpu_memory=None)])
        ledger.close("seeded", container, "stopped", when=start + 3600)
    ledger.dispose()


def test_a_name_with_a_bidi_override_reads_in_order(hub, visit):
    """A user named with U+202E (RIGHT-TO-LEFT OVERRIDE): on the report and on their own
    page, the words after the name (advice, the period line, a chart's title and its
    tooltips) are drawn after it, not reversed into it. Run last: it adds to the ledger."""
    seed_sessions_of(default_url(str(hub.workdir)), BIDI_NAME)
    v = visit()
    v.log_in("admin")
    v.open_service_page("?period=30d")
    page = v.page
    assert BIDI_NAME in v.rows()
    assert_reads_in_order(page.locator("#advice li", has_text=BIDI_NAME))
    bar = page.locator(f'svg.chart.reserved-used.cpu g.row[data-name="{BIDI_NAME}"]')
    # a bar's tooltip, "…: 2 CPU-hours reserved, …", as a line of text
    assert_text_reads_in_order(page, bar.locator("rect.reserved title").text_content())
    v.shot("bidi-report")

    page.locator("a.user-link", has_text=BIDI_NAME).click()
    page.wait_for_url("**/services/usage/user?**")
    assert_reads_in_order(page.locator("#scope"))  # "the sessions of ….": the full stop
    assert_reads_in_order(page.locator("svg.chart.timeline text.chart-title"))
    assert_reads_in_order(page.locator("#summary p.advice"))
    v.shot("bidi-user")
    v.check_stayed_home()
