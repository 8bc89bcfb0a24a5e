"""The quota table editor's page without a hub or a browser: the OAuth user is faked as in
test_usage_service.py. What the page does in a browser is for the Chromium tests."""

from __future__ import annotations

import fnmatch
import html
import json
import re
import shutil
from pathlib import Path

import pytest
from test_usage_service import ADMIN, INSTRUCTOR, PLAIN, VIEWER, FakeHubAuth
from tornado.httpclient import AsyncHTTPClient
from tornado.httpserver import HTTPServer
from tornado.testing import bind_unused_port

from spawner.usage.ledger import Ledger
from spawner.webapp import app as service
from spawner.webapp import table_page
from spawner.webapp.table import ADMINS_ONLY, table_schema

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "/services/usage/"
BUNDLE = ROOT / "spawner" / "webapp" / "static" / "editor.js"


class PageHubAuth(FakeHubAuth):
    base_url = "/"  # where HubOAuth sets its XSRF cookie


class Site:
    def __init__(self, port: int, quota: Path):
        self.base = f"http://127.0.0.1:{port}{PREFIX}"
        self.client = AsyncHTTPClient()
        self.quota = quota

    async def get(self, path: str, who: str = ""):
        headers = {"X-Test-User": who} if who else {}
        return await self.client.fetch(self.base + path, headers=headers, raise_error=False,
                                       follow_redirects=False)


@pytest.fixture
async def site(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'usage.sqlite'}"
    Ledger(url).dispose()
    quota = tmp_path / "quotas.yaml"
    shutil.copy(ROOT / "hub_config" / "quotas.yaml", quota)
    auth = PageHubAuth({"admin": ADMIN, "prof-ada": INSTRUCTOR, "carol": PLAIN,
                        "finance": VIEWER})
    monkeypatch.setattr(service.UsageHandler, "hub_auth", property(lambda self: auth))
    app = service.make_app(usage_db=url, quota_file=str(quota), prefix=PREFIX)
    # until make_app wires the page in itself
    if not any(getattr(r.target, "__name__", "") == "TablePage"
               for r in app.wildcard_router.rules):
        app.wildcard_router.add_rules(table_page.routes(PREFIX))
    sock, port = bind_unused_port()
    server = HTTPServer(app)
    server.add_sockets([sock])
    yield Site(port, quota)
    server.stop()
    app.settings["usage_reader"]._pool.shutdown(wait=False)


def attribute(page: str, name: str) -> str:
    found = re.search(rf'\b{name}="([^"]*)"', page)
    assert found, name
    return html.unescape(found.group(1))


async def test_the_admin_gets_the_editor_with_the_table(site):
    r = await site.get("table", "admin")
    assert r.code == 200
    assert r.headers["Content-Type"].startswith("text/html")
    page = r.body.decode()
    text = site.quota.read_text()
    # the text, escaped, in the textarea the editor starts from
    found = re.search(r'<textarea id="table-text"[^>]*>(.*?)</textarea>', page, re.S)
    assert found and html.unescape(found.group(1)) == text
    assert attribute(page, "data-api") == PREFIX + "api/table"
    assert len(attribute(page, "data-version")) == 64
    assert attribute(page, "data-xsrf")
    assert json.loads(attribute(page, "data-schema")) == table_schema()
    assert json.loads(attribute(page, "data-problems")) == []
    scripts = re.findall(r"<script\b[^>]*>", page)
    assert scripts == [f'<script src="{PREFIX}static/editor.js?v='
                       f'{table_page.bundle_version()}" defer>']
    for needed in ('id="comment"', "required", 'id="save"', 'id="preview"',
                   'id="versions-body"', 'id="restore-form"', '<label for="comment">',
                   '<label for="restore-comment">'):
        assert needed in page
    assert "Signed in as" in page and "Back to the hub" in page


async def test_the_page_allows_its_own_scripts_only(site):
    r = await site.get("table", "admin")
    csp = dict(part.strip().split(" ", 1) for part in
               r.headers["Content-Security-Policy"].split(";"))
    assert csp["script-src"] == "'self'"
    assert csp["default-src"] == "'none'"
    assert csp["connect-src"] == "'self'"
    assert "<script>" not in r.body.decode()  # no inline script: 'self' would refuse it
    assert r.headers["X-Content-Type-Options"] == "nosniff"


async def test_user_named_text_is_escaped(site):
    site.quota.write_text(site.quota.read_text() + "# <script>alert('x')</script> & co\n")
    page = (await site.get("table", "admin")).body.decode()
    assert "<script>alert" not in page
    assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; co" in page


async def test_problems_are_listed_with_their_line(site):
    site.quota.write_text(site.quota.read_text().replace("cpus: 8", "cpus: lots", 1))
    page = (await site.get("table", "admin")).body.decode()
    problems = json.loads(attribute(page, "data-problems"))
    assert problems and problems[0]["line"] > 1
    assert f"Line {problems[0]['line']}:" in page
    assert "it cannot be saved until they are fixed" in page


@pytest.mark.parametrize("who", ["prof-ada", "carol", "finance"])
async def test_only_admins_get_the_page(site, who):
    r = await site.get("table", who)
    assert r.code == 403
    page = r.body.decode()
    assert html.escape(ADMINS_ONLY, quote=True) in page or ADMINS_ONLY in page
    assert "table-text" not in page and site.quota.read_text()[:40] not in page


async def test_without_a_login_the_page_sends_to_the_hub(site):
    r = await site.get("table")
    assert r.code in (302, 403)
    assert "table-text" not in r.body.decode()


async def test_the_bundle_is_served_as_a_script(site):
    r = await site.get(f"static/editor.js?v={table_page.bundle_version()}")
    assert r.code == 200
    assert r.headers["Content-Type"] == "text/javascript; charset=utf-8"
    assert r.headers["X-Content-Type-Options"] == "nosniff"
    assert r.body == BUNDLE.read_bytes()
    licenses = await site.get("static/editor.js.LICENSE.txt")
    assert licenses.code == 200 and licenses.headers["Content-Type"].startswith("text/plain")
    assert (await site.get("static/../table_page.py")).code in (403, 404)
    assert (await site.get("static/nothing.js")).code == 404


def test_the_bundle_is_committed_and_has_no_asset_from_the_network():
    text = BUNDLE.read_text(encoding="utf-8")
    assert len(text) > 100_000  # CodeMirror and the schema completion, all in one
    assert "yamlCompletion" in (ROOT / "editor" / "src" / "editor.js").read_text()
    for loaded in re.findall(r"""(?:import\(|fetch\(|src=)["'`](https?:)?//""", text):
        pytest.fail(f"the bundle loads something from the network: {loaded}")
    assert "shiki" not in text  # replaced at build time (editor/build.mjs)
    notice = (BUNDLE.parent / "editor.js.LICENSE.txt").read_text(encoding="utf-8")
    for package in ("codemirror", "@codemirror/view", "@codemirror/lang-yaml",
                    "codemirror-json-schema", "@codemirror/lint"):
        assert f"\n{package} " in notice, package


def test_the_package_ships_the_bundle():
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    globs = data["tool"]["setuptools"]["package-data"]["spawner"]
    shipped = BUNDLE.relative_to(ROOT / "spawner").as_posix()
    assert any(fnmatch.fnmatch(shipped, g) for g in globs)
    assert any(fnmatch.fnmatch("webapp/static/editor.js.LICENSE.txt", g) for g in globs)


def test_make_editor_builds_from_pinned_inputs():
    editor = ROOT / "editor"
    package = json.loads((editor / "package.json").read_text())
    pinned = {**package.get("dependencies", {}), **package["devDependencies"]}
    for name in ("codemirror", "@codemirror/lang-yaml", "codemirror-json-schema",
                 "@codemirror/lint", "esbuild"):
        assert name in pinned, name
    for name, version in pinned.items():
        assert re.fullmatch(r"\d+\.\d+\.\d+", version), f"{name} is not pinned: {version}"
    lock = json.loads((editor / "package-lock.json").read_text())
    for name, version in pinned.items():
        assert lock["packages"][f"node_modules/{name}"]["version"] == version, name
    assert package["scripts"]["build"] == "node build.mjs"
    assert (editor / "build.mjs").exists() and (editor / "src" / "editor.js").exists()
    makefile = (ROOT / "Makefile").read_text()
    target = re.search(r"^editor:\n((?:\t.*\n)+)", makefile, re.M)
    assert target and "npm ci" in target.group(1) and "npm run build" in target.group(1)
