"""What the Chromium tests share: the browser, a person's visit through the hub's login,
and the usage service's block of hub config (as the shipped config writes it)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from playwright.sync_api import Browser, expect, sync_playwright

from harness import ARTIFACTS
from spawner.hubconfig.passwords import DEMO_ADMIN_PASSWORD, DEMO_PASSWORD

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
]


def launch() -> Iterator[Browser]:
    """One Chromium for a module's tests (``yield from launch()`` in a fixture)."""
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@contextlib.contextmanager
def lab_page(browser: Browser) -> Iterator[Any]:
    """A page in a fresh context of ``browser``, whose script errors collect in
    ``page.errors``; the context is closed afterwards."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.errors = []
    page.on("pageerror", lambda e: page.errors.append(str(e)))
    try:
        yield page
    finally:
        context.close()


def password(name: str) -> str:
    return DEMO_ADMIN_PASSWORD if name == "admin" else DEMO_PASSWORD


def log_in(page, hub, name: str, next_url: str = "/hub/home") -> None:
    """Through the hub's login form, as a person does (the demo passwords)."""
    page.goto(f"{hub.url}/hub/login?next={next_url}")
    page.fill("input[name=username]", name)
    page.fill("input[name=password]", password(name))
    page.click("input[type=submit], button[type=submit]")
    if next_url == "/hub/home":
        page.wait_for_url("**/hub/home")


LAB_WAIT_MS = 60_000


def wait_for_lab(page, what: str) -> None:
    """JupyterLab's launcher on ``page``, as a person sees it after a start. A Lab that has
    not drawn it after a minute is kept for the team (its screenshot and the page's
    console errors in test-artifacts/, named after ``what``) and reloaded once, as a
    person would; a Lab that draws nothing after that fails the test. (Seen twice in
    some thirty CI runs, under load, with the server up and nothing in the hub's log.)"""
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    try:
        page.wait_for_selector(".jp-Launcher", timeout=LAB_WAIT_MS)
        return
    except Exception:
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / f"lab-not-drawn-{what}.png"))
        (ARTIFACTS / f"lab-not-drawn-{what}.txt").write_text(
            f"{page.url}\n" + "\n".join(errors) + "\n" + page.content()[-20_000:])
    page.reload()
    page.wait_for_selector(".jp-Launcher", timeout=LAB_WAIT_MS)


def usage_config(port: int, classes: dict[str, list[str]] | None = None) -> str:
    """The usage service's block of the shipped hub config, for Hub(extra_config=…),
    after the harness's own services and roles: the service on ``port``, its roles,
    instructors for ``classes`` (default cs101: prof-ada), the class dashboard's scopes
    and every user's access to the service."""
    classes = {"cs101": ["prof-ada"]} if classes is None else classes
    return f"""
import jupyterhub
from spawner.hubconfig.rbac import CLASS_OAUTH_SCOPES, class_service_scopes, instructor_roles
from spawner.webapp.requests import USER_SCOPES
from spawner.webapp.app import CUSTOM_SCOPES, webapp_service
CLASSES = {classes!r}
c.JupyterHub.custom_scopes = CUSTOM_SCOPES
usage, usage_role, usage_own_role = webapp_service(
    c.JupyterHub.bind_url, c.QuotaSpawner.usage_db, c.QuotaSpawner.quota_file,
    url="http://127.0.0.1:{port}", state_dir=c.QuotaSpawner.state_dir,
    secret_file=c.JupyterHub.cookie_secret_file, prefix=c.DockerSpawner.prefix,
    hub_id=c.QuotaSpawner.hub_id if "hub_id" in c.QuotaSpawner else "")
usage["oauth_client_allowed_scopes"] += CLASS_OAUTH_SCOPES
usage_own_role["scopes"] += class_service_scopes(CLASSES)
c.JupyterHub.services.append(usage)
c.JupyterHub.load_roles += [usage_role, usage_own_role, *instructor_roles(CLASSES)]
if jupyterhub.version_info >= (6,):
    c.JupyterHub.extra_user_scopes = list(USER_SCOPES)
else:
    c.JupyterHub.load_roles.append({{"name": "user", "scopes": ["self", *USER_SCOPES]}})
"""


# A name whose U+202E (RIGHT-TO-LEFT OVERRIDE) makes "…gnp.exe" read "…exe.png" (Unicode
# TR36's spoofing): not refused, isolated where the pages show it.
BIDI_NAME = "eve\u202egnp.exe"

# Where Chromium draws ``name`` in ``root``'s text and the first letter after it: without
# isolation the override runs on to the end of the line and the words after the name are
# drawn reversed, before its end (that letter's left < the name's right).
READING_ORDER = r"""([root, name]) => {
  const nodes = [];
  const walk = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
  while (walk.nextNode()) nodes.push(walk.currentNode);
  let text = "";
  const starts = nodes.map((n) => { const at = text.length; text += n.data; return at; });
  const point = (i) => {
    let k = nodes.length - 1;
    while (starts[k] > i) k--;
    return [nodes[k], i - starts[k]];
  };
  const box = (from, to) => {
    const range = document.createRange();
    range.setStart(...point(from));
    const [node, offset] = point(to - 1);
    range.setEnd(node, offset + 1);
    return range.getBoundingClientRect();
  };
  const i = text.indexOf(name);
  if (i < 0) return {error: `no ${JSON.stringify(name)} in ${JSON.stringify(text)}`};
  let j = i + name.length;  // the next letter drawn: not a space, not a bidi control
  while (j < text.length && /[\s\u200e\u200f\u202a-\u202e\u2066-\u2069]/.test(text[j])) j++;
  if (j >= text.length) return {error: `nothing after the name in ${JSON.stringify(text)}`};
  const own = box(i, i + name.length), next = box(j, j + 1);
  return {text, after: text[j], name_left: own.left, name_right: own.right,
          after_left: next.left, same_line: Math.abs(own.top - next.top) < own.height};
}"""
# A string no element lays out (a tooltip, an <option>), laid out in a line of the page.
TEXT_ORDER = r"""([text, name]) => {
  const line = document.createElement("span");
  line.style.whiteSpace = "pre";
  line.textContent = text;
  document.body.append(line);
  try { return (READING_ORDER)([line, name]); } finally { line.remove(); }
}""".replace("READING_ORDER", READING_ORDER)


def reading_order(locator, name: str = BIDI_NAME) -> dict[str, Any]:
    """How ``name`` and what follows it in ``locator``'s element are drawn (READING_ORDER)."""
    return locator.evaluate(f"(root, name) => ({READING_ORDER})([root, name])", name)


def assert_reads_in_order(locator, name: str = BIDI_NAME) -> None:
    """The words after ``name`` are drawn after it, on its line: its bidi controls stayed
    inside it."""
    found = reading_order(locator, name)
    assert "error" not in found, found
    assert found["same_line"] and found["after_left"] >= found["name_right"] - 0.5, found


def assert_text_reads_in_order(page, text: str, name: str = BIDI_NAME) -> None:
    """As assert_reads_in_order, for a string no element draws (a tooltip, an option)."""
    found = page.evaluate(TEXT_ORDER, [text, name])
    assert "error" not in found, found
    assert found["same_line"] and found["after_left"] >= found["name_right"] - 0.5, found


# an element as drawn: without whitespace-only text, numbers as N (ages and the figures
# measured move on between two loads)
DRAWING = r"""(element) => {
  const copy = element.cloneNode(true);
  const walk = (node) => {
    for (const child of Array.from(node.childNodes)) {
      if (child.nodeType === 3 && !child.nodeValue.trim()) node.removeChild(child);
      else walk(child);
    }
  };
  walk(copy);
  return copy.outerHTML.replace(/[0-9]+(\.[0-9]+)?/g, "N");
}"""


def drawing(locator) -> str:
    """``locator``'s element as drawn (DRAWING): two pages' drawings compare alike when the
    same markup is drawn, whoever drew it."""
    return locator.evaluate(DRAWING)


class Visit:
    """One person's browser context: script errors, requests and dialogs recorded."""

    def __init__(self, browser: Browser, hub, viewport: dict[str, int] | None = None,
                 **context: Any):
        self.hub = hub
        self.context = browser.new_context(viewport=viewport or {"width": 1200, "height": 900},
                                           **context)
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.dialogs: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error"
                     else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))

    def log_in(self, name: str) -> None:
        log_in(self.page, self.hub, name)

    def open_service_page(self, path: str, status: int = 200):
        """``/services/usage/<path>``, as typed in the address bar; checks the status."""
        response = self.page.goto(f"{self.hub.url}/services/usage/{path}")
        assert response is not None and response.status == status, (
            response and response.status)
        return response

    def api(self, method: str, path: str, data: Any = None):
        """A call to the service's JSON API from this browser, with its login cookies and
        the XSRF token the service's pages send (the ``_xsrf`` cookie)."""
        url = f"{self.hub.url}/services/usage/{path}"
        # the service's own cookie, not the hub's (path /hub/): the one sent to this URL
        # with the longest path
        sent = sorted((c for c in self.context.cookies(url) if c["name"] == "_xsrf"),
                      key=lambda c: len(c.get("path", "")))
        xsrf = sent[-1]["value"] if sent else ""
        return self.context.request.fetch(
            url, method=method,
            headers={"X-XSRFToken": xsrf, "Content-Type": "application/json"},
            data=data, fail_on_status_code=False)

    def shot(self, name: str) -> None:
        ARTIFACTS.mkdir(exist_ok=True)
        self.page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)

    def check_stayed_home(self) -> None:
        outside = [u for u in self.requests if not u.startswith(self.hub.url + "/")
                   and not u.startswith("data:")]
        assert outside == [], f"requests that left the hub: {outside}"
        # a refused page is a 4xx that Chromium logs as a failed resource: not a script's
        errors = [e for e in self.errors if not e.startswith("Failed to load resource")]
        assert errors == [], f"script errors: {errors}"
        assert self.dialogs == [], f"a script opened a dialog: {self.dialogs}"


def visits(browser: Browser, hub, kind: type[Visit] = Visit, **context: Any) -> Iterator[Any]:
    """A fixture's body: ``make()`` opens a ``kind`` of Visit; all are closed after the
    test."""
    opened: list[Visit] = []

    def make() -> Visit:
        v = kind(browser, hub, **context)
        opened.append(v)
        return v

    yield make
    for v in opened:
        v.context.close()


__all__ = ["BIDI_NAME", "CHROMIUM", "CHROMIUM_ARGS", "Visit", "assert_reads_in_order",
           "assert_text_reads_in_order", "expect", "launch", "log_in", "password",
           "reading_order", "usage_config", "visits"]
