"""The quota table editor in Chromium, reached through a real hub login: the admin types
and sees the server's problems as they type, saves with a comment, meets a conflict when
the file changed under them, restores an older version from the history; instructors and
plain users are refused, the page and its API alike."""

from __future__ import annotations

import re
import time

import pytest
from browser import BIDI_NAME, assert_reads_in_order, launch, visits
from browser import Visit as BrowserVisit
from hubs import SHIPPED_QUOTAS, on_hub
from playwright.sync_api import expect

from harness import Hub
from spawner.webapp.table import ADMINS_ONLY

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

DESCRIPTION = "Data exploration and small models"  # line 16 of the shipped table
TYPO = "\nroles_typo: 1\n"


@pytest.fixture(scope="module")
def hub(hub):
    """The session's hub (tests/hubs.py) with the shipped table, and a fresh ledger."""
    with on_hub(hub, SHIPPED_QUOTAS, {"prof-ada": ["cs101-staff"], "carol": []}, ledger=True):
        yield hub


@pytest.fixture(scope="module")
def original(hub) -> str:
    return SHIPPED_QUOTAS


@pytest.fixture
def table(hub, original):
    """Every test starts from the shipped table, whatever the one before saved."""
    hub.quota_file.write_text(original, encoding="utf-8")
    yield hub.quota_file
    hub.quota_file.write_text(original, encoding="utf-8")


@pytest.fixture(scope="module")
def browser():
    yield from launch()


class Visit(BrowserVisit):
    """One person's browser, with the editor page's helpers."""

    def __init__(self, browser, hub: Hub):
        # tall enough that CodeMirror draws every line of the table (70vh of it)
        super().__init__(browser, hub, viewport={"width": 1200, "height": 2600})

    def open_editor(self):
        response = self.page.goto(f"{self.hub.url}/services/usage/table")
        assert response.status == 200, response.status
        expect(self.page.locator("#editor .cm-editor")).to_be_visible()
        # the history is read once the script runs
        expect(self.page.locator("#versions-body")).not_to_contain_text("Reading the history")
        return response

    def editor_text(self) -> str:
        """The document as CodeMirror draws it: every line, none left out of the viewport."""
        return self.page.evaluate("""() => {
          if (document.querySelector('.cm-content .cm-gap')) throw new Error('lines not drawn');
          return Array.from(document.querySelectorAll('.cm-content .cm-line'),
                            (line) => line.textContent).join('\\n');
        }""")

    def replace_text(self, text: str) -> None:
        """Select everything and put ``text`` in its place, as a paste would."""
        self.page.locator(".cm-content").click()
        self.page.keyboard.press("Control+a")
        self.page.keyboard.insert_text(text)
        assert self.editor_text() == text

    def save(self, comment: str) -> None:
        self.page.fill("#comment", comment)
        self.page.click("#save")

    def shot(self, name: str) -> None:
        super().shot(f"table-{name}")


@pytest.fixture
def visit(browser, hub):
    yield from visits(browser, hub, Visit)


def test_a_typo_shows_as_a_problem_while_typing(table, visit):
    before = table.read_bytes()
    v = visit()
    v.log_in("admin")
    v.open_editor()
    page = v.page
    expect(page.locator("#check-status")).to_have_text("The table has no problems.")
    # what the hub published when it started: no GPUs, host admission off on this hub
    expect(page.locator("#checked-against")).to_have_text(
        "Checked against this hub, which has no GPUs (its GPU roles are refused when they "
        "start); its host's room is not counted (host admission is off).")
    page.locator(".cm-content").click()
    page.keyboard.press("Control+End")
    page.keyboard.type(TYPO)
    lines = v.editor_text().split("\n")
    number = next(i for i, line in enumerate(lines, 1) if "roles_typo" in line)
    problem = page.locator("#problems li", has_text="roles_typo")
    expect(problem).to_have_count(1, timeout=5000)
    assert re.match(rf"Line {number}: unknown key 'roles_typo'", problem.inner_text()), \
        problem.inner_text()
    expect(page.locator("#check-status")).to_have_text(
        "The table has one problem; it cannot be saved until it is fixed.")
    expect(page.locator(".cm-gutter-lint .cm-lint-marker-error")).to_have_count(1)
    v.shot("typo")
    # the problem's button takes the cursor to the line
    problem.locator("button").click()
    assert page.evaluate("""() => Array.from(document.querySelectorAll('.cm-content .cm-line'))
        .findIndex((line) => line.classList.contains('cm-activeLine')) + 1""") == number
    # checking writes nothing
    time.sleep(0.5)
    assert table.read_bytes() == before
    assert v.errors == []


def test_save_with_a_comment_and_the_history(table, original, visit):
    v = visit()
    v.log_in("admin")
    v.open_editor()
    page = v.page
    edited = original.replace(DESCRIPTION, "Exploration, saved from the browser")
    v.replace_text(edited)
    expect(page.locator("#check-status")).to_have_text("The table has no problems.")
    v.save("describe the explore role")
    expect(page.locator("#save-result")).to_contain_text(
        "Saved; the hub uses it from the next spawn.")
    expect(page.locator("#save-result pre.diff")).to_contain_text(
        "+    description: Exploration, saved from the browser")
    assert table.read_text(encoding="utf-8") == edited
    row = page.locator("#versions-body tr", has_text="describe the explore role")
    expect(row).to_have_count(1)
    expect(row.locator("td").nth(1)).to_have_text("admin")
    v.shot("saved")

    # another change, without a comment: refused, nothing written
    v.replace_text(edited.replace("Exploration, saved", "Exploration, unsaved"))
    page.fill("#comment", "")
    page.click("#save")
    # an empty comment: the browser's own check (the field is required) stops the form
    assert page.evaluate("document.getElementById('comment').validity.valueMissing")
    # blanks only: the page's sentence
    page.fill("#comment", "   ")
    page.click("#save")
    expect(page.locator("#save-result")).to_have_text(
        "Say why you make this change: the comment is required.")
    v.shot("no-comment")
    time.sleep(0.5)
    assert table.read_text(encoding="utf-8") == edited
    assert v.errors == []


def test_a_conflict_shows_the_diff_and_loads_the_current_table(table, original, visit):
    v = visit()
    v.log_in("admin")
    v.open_editor()
    page = v.page
    # another admin saves after this page was opened
    theirs = original.replace(DESCRIPTION, "Changed by another admin")
    table.write_text(theirs, encoding="utf-8")
    mine = original.replace(DESCRIPTION, "My own description")
    v.replace_text(mine)
    v.save("my edit")
    conflict = page.locator("#conflict")
    expect(conflict).to_be_visible()
    expect(page.locator("#save-result")).to_contain_text("nothing was written")
    expect(page.locator("#conflict-diff")).to_contain_text("+    description: Changed by "
                                                           "another admin")
    expect(page.locator("#conflict-diff")).to_contain_text("+    description: My own "
                                                           "description")
    v.shot("conflict")
    assert table.read_text(encoding="utf-8") == theirs
    page.click("#load-current")
    expect(conflict).to_be_hidden()
    expect(page.locator(".cm-content")).to_contain_text("Changed by another admin")
    assert v.editor_text() == theirs
    v.shot("conflict-loaded")
    # from the current version, a save goes through
    v.replace_text(theirs.replace("Changed by another admin", "Agreed description"))
    v.save("after the conflict")
    expect(page.locator("#save-result")).to_contain_text("Saved;")
    assert "Agreed description" in table.read_text(encoding="utf-8")
    # the 409 itself is logged by Chromium as a failed resource; nothing else went wrong
    assert [e for e in v.errors if "status of 409" not in e] == []


def test_restore_an_older_version(table, original, visit):
    v = visit()
    v.log_in("admin")
    v.open_editor()
    page = v.page
    first = original.replace(DESCRIPTION, "First of two")
    second = original.replace(DESCRIPTION, "Second of two")
    v.replace_text(first)
    v.save("restore test: first")
    expect(page.locator("#save-result")).to_contain_text("Saved;")
    v.replace_text(second)
    v.save("restore test: second")
    expect(page.locator("#save-result")).to_contain_text("Saved;")
    assert table.read_text(encoding="utf-8") == second

    row = page.locator("#versions-body tr", has_text="restore test: first")
    expect(row).to_have_count(1)
    row.locator("button").click()
    expect(page.locator("#version-view")).to_be_visible()
    expect(page.locator("#version-content")).to_contain_text("Why: restore test: first")
    # the audit trail keeps the diff of each change, with who made it and when
    expect(page.locator("#version-content pre.diff").first).to_contain_text(
        f"-    description: {DESCRIPTION}")
    expect(page.locator("#version-content pre.diff").first).to_contain_text(
        "+    description: First of two")
    expect(page.locator("#version-content")).to_contain_text("description: First of two")
    page.fill("#restore-comment", "back to the first")
    page.click("#restore-form button[type=submit]")
    expect(page.locator("#restore-result")).to_contain_text("Saved")
    assert table.read_text(encoding="utf-8") == first
    # the editor shows the restored table, and the history says so
    expect(page.locator(".cm-content")).to_contain_text("First of two")
    expect(page.locator("#versions-body tr", has_text="back to the first")).to_contain_text(
        "(restores version")
    v.shot("restored")
    assert v.errors == []


CHECK_FROM_THE_PAGE = """async () => {
  const xsrf = (document.cookie.match(/(?:^|; )_xsrf=([^;]*)/) || [])[1] || "";
  const r = await fetch("/services/usage/api/table/check", {
    method: "POST", credentials: "same-origin", redirect: "manual",
    headers: {"Content-Type": "application/json", "Accept": "application/json",
              "X-XSRFToken": decodeURIComponent(xsrf)},
    body: JSON.stringify({text: "roles: {}\\n"})});
  return {status: r.status, type: r.type, xsrf: xsrf !== "", body: await r.text()};
}"""


@pytest.mark.parametrize("name", ["prof-ada", "carol"])
def test_anyone_but_an_admin_is_refused(table, visit, name):
    v = visit()
    v.log_in(name)
    page = v.page
    response = page.goto(f"{v.hub.url}/services/usage/table")
    assert response.status == 403
    expect(page.locator("body")).to_contain_text(ADMINS_ONLY)
    # the refusal is titled by the page refused, not "Usage"
    expect(page).to_have_title("Quota table")
    expect(page.locator("header h1")).to_have_text("Quota table")
    assert page.locator(".cm-editor").count() == 0
    assert ".cm-" not in page.content() and "editor.js" not in page.content()
    v.shot(f"refused-{name}")
    answer = page.evaluate(CHECK_FROM_THE_PAGE)
    assert answer["status"] == 403, answer
    assert ADMINS_ONLY in answer["body"], answer


def test_completion_offers_the_fields_of_a_role(table, visit):
    v = visit()
    v.log_in("admin")
    v.open_editor()
    page = v.page
    # a new field in the junior-researcher role, asked for with Ctrl+Space
    page.locator(".cm-line", has_text="images: [pytorch, paddle]").first.click()
    page.keyboard.press("End")
    page.keyboard.press("Enter")
    page.keyboard.type("gpu_")
    page.keyboard.press("Control+Space")
    options = page.locator(".cm-tooltip-autocomplete li")
    expect(options.first).to_be_visible(timeout=5000)
    offered = set(options.all_inner_texts())
    assert any("gpu_mode" in o for o in offered), offered
    assert any("gpu_share" in o for o in offered), offered
    v.shot("completion")
    # picking one with the keyboard writes it into the table
    page.locator(".cm-tooltip-autocomplete li", has_text="gpu_mode").click()
    assert re.search(r"^ +gpu_mode", v.editor_text(), re.M), v.editor_text()
    assert v.errors == []


def test_an_invalid_table_is_refused_at_save_with_its_line(table, original, visit):
    v = visit()
    v.log_in("admin")
    v.open_editor()
    page = v.page
    bad = original.replace("    memory: 4G\n", "    memory: four gigabytes\n", 1)
    line = bad.split("\n").index("    memory: four gigabytes") + 1
    v.replace_text(bad)
    problem = page.locator("#problems li", has_text=f"Line {line}:")
    expect(problem).to_have_count(1, timeout=5000)
    # the page lets the admin press save; the service refuses, with the same problems
    v.save("a size nobody can read")
    expect(page.locator("#save-result")).to_have_text(
        "The table has 1 problem; nothing was written.")
    expect(problem).to_have_count(1)
    v.shot("invalid-save")
    time.sleep(0.5)
    assert table.read_text(encoding="utf-8") == original
    history = page.locator("#versions-body tr", has_text="a size nobody can read")
    expect(history).to_have_count(0)
    assert [e for e in v.errors if "status of 400" not in e] == []


def test_a_saved_edit_applies_at_the_next_spawn(table, original, visit, docker_client):
    """The preview names the running server that keeps its limits; the next spawn gets
    the new ones."""
    from harness import container_for

    hub = visit().hub
    hub.start_server("carol", {"profile": "junior-researcher", "image": "pytorch"})
    try:
        assert container_for(docker_client, "carol").attrs["HostConfig"]["Memory"] == 4 * 2**30
        v = visit()
        v.log_in("admin")
        v.open_editor()
        page = v.page
        v.replace_text(original.replace("    memory: 4G\n", "    memory: 3G\n", 1))
        expect(page.locator("#check-status")).to_have_text("The table has no problems.")
        page.click("#preview")
        result = page.locator("#preview-result li")
        expect(result.first).to_be_visible()
        sentences = result.all_inner_texts()
        assert "1 running server keeps its limits until it stops." in sentences, sentences
        assert any(s.startswith("junior-researcher changes: memory") for s in sentences), \
            sentences
        v.shot("preview")
        v.save("smaller explore servers")
        expect(page.locator("#save-result")).to_contain_text("Saved;")
        # the preview told of changes now made: it is gone with the save
        expect(page.locator("#preview-result li")).to_have_count(0)
        # the running server keeps its limits
        assert container_for(docker_client, "carol").attrs["HostConfig"]["Memory"] == 4 * 2**30
        hub.stop_server("carol")
        hub.start_server("carol", {"profile": "junior-researcher", "image": "pytorch"})
        assert container_for(docker_client, "carol").attrs["HostConfig"]["Memory"] == 3 * 2**30
        assert v.errors == []
    finally:
        hub.stop_server("carol")


def test_a_comment_with_a_bidi_override_reads_in_order_in_the_history(table, original,
                                                                     visit):
    """A restore's comment holding U+202E (RIGHT-TO-LEFT OVERRIDE): the history draws the
    words after it ("(restores version N)") after it, not reversed into it."""
    v = visit()
    v.log_in("admin")
    v.open_editor()
    page = v.page
    v.replace_text(original.replace(DESCRIPTION, "Bidi test"))
    v.save("bidi test: an edit")
    expect(page.locator("#save-result")).to_contain_text("Saved;")
    page.locator("#versions-body tr").last.locator("button").click()  # the oldest
    expect(page.locator("#version-view")).to_be_visible()
    page.fill("#restore-comment", BIDI_NAME)
    page.click("#restore-form button[type=submit]")
    expect(page.locator("#restore-result")).to_contain_text("Saved")
    row = page.locator("#versions-body tr").first
    expect(row).to_contain_text("(restores version")
    assert_reads_in_order(row.locator("td").nth(2))
    v.shot("bidi-history")
    assert v.errors == []
