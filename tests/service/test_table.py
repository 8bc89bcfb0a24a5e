"""The quota table editor without a hub or a browser: its JSON API and its page. The OAuth
user is faked by webapp_client.py, and the hub's REST API by a small tornado app.
What the page does in a browser is for test_browser_table.py."""

from __future__ import annotations

import asyncio
import fnmatch
import html
import json
import logging
import re
import shutil
import threading
import time
from pathlib import Path

import pytest
from tornado import web
from webapp_client import (
    HUB_TOKEN,
    MODELS,
    FakeHubAuth,
    FakeHubUsers,
    PageHubAuth,
    PageSite,
    attribute,
    serve,
)
from webapp_client import TableApi as Api

from spawner.cli import main as cli_main
from spawner.gpu.inventory import declared_inventory
from spawner.gpu.pool import GpuPool
from spawner.gpu.snapshot import pool_snapshot
from spawner.host.admission import HostBook, HostCapacity
from spawner.usage.documents import GPUS, FolderDocuments
from spawner.usage.ledger import Ledger
from spawner.webapp import app as service
from spawner.webapp import table
from spawner.webapp.base import BaseHandler, static_version
from spawner.webapp.table import ADMINS_ONLY, table_schema

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[2]


def seed(tmp_path: Path) -> tuple[str, Path]:
    """An empty ledger and a copy of the shipped table, in tmp_path."""
    url = f"sqlite:///{tmp_path / 'usage.sqlite'}"
    Ledger(url).dispose()
    quota = tmp_path / "quotas.yaml"
    shutil.copy(ROOT / "hub_config" / "quotas.yaml", quota)
    return url, quota


async def serve_api(tmp_path, monkeypatch, **settings):
    """The service on a copy of the shipped table, a fake hub's users; the Api, and how to
    stop both."""
    url, quota = seed(tmp_path)
    auth = FakeHubAuth(MODELS)
    monkeypatch.setattr(BaseHandler, "hub_auth", property(lambda self: auth))
    seen: list = []
    hub = web.Application([(r"/hub/api/users", FakeHubUsers)], seen_tokens=seen)
    hub_server, hub_port = serve(hub)
    app = service.make_app(usage_db=url, quota_file=str(quota),
                           hub_api_url=f"http://127.0.0.1:{hub_port}/hub/api",
                           hub_api_token=HUB_TOKEN, **settings)
    server, port = serve(app)

    def stop() -> None:
        server.stop()
        hub_server.stop()
        app.settings["usage"].reader.close()

    return Api(port, quota, seen), stop


@pytest.fixture
async def api(tmp_path, monkeypatch):
    found, stop = await serve_api(tmp_path, monkeypatch)
    yield found
    stop()


def publish(state: Path, gpus: int, host: bool = True) -> None:
    """A pool snapshot in ``state``, as the hub writes one: ``gpus`` GPUs of 80 GiB, and
    (``host``) 16 CPUs and 64 GiB, 1 CPU and 4 GiB kept: notebooks may reserve 60 CPUs and
    60 GiB."""
    inventory = declared_inventory([{"uuid": f"GPU-{i}", "memory": "80G"}
                                    for i in range(gpus)])
    pool = GpuPool(inventory, "", logging.getLogger("test-table"))
    pool.set_host(HostBook(HostCapacity(cpus=16, memory=64 * 2**30, reserve_cpus=1,
                                        reserve_memory=4 * 2**30)) if host else None)
    FolderDocuments(str(state)).write(GPUS, json.dumps(pool_snapshot(pool, time.time())))


async def serve_hub_api(tmp_path, monkeypatch, **settings):
    """The editor beside a hub's state folder, where the hub publishes its pool snapshot
    (spawner/gpu/snapshot.py): ``.publish(gpus, host=True)`` writes one as the hub does."""
    state = tmp_path / "state"
    state.mkdir()
    found, stop = await serve_api(tmp_path, monkeypatch, state_dir=str(state), **settings)
    found.publish = lambda gpus, host=True: publish(state, gpus, host)
    return found, stop


@pytest.fixture
async def hub_api(tmp_path, monkeypatch):
    found, stop = await serve_hub_api(tmp_path, monkeypatch)
    yield found
    stop()


def without_gpu_lab(text: str) -> str:
    edited = text.replace("cs101: [student, gpu-lab]", "cs101: [student]")
    assert edited != text
    return edited


async def test_the_admin_reads_the_table_with_its_schema(api):
    code, found = await api.get()
    assert code == 200
    assert found["text"] == api.quota.read_text()
    assert len(found["version"]) == 64 and found["path"] == str(api.quota)
    assert found["problems"] == []
    assert found["schema"] == json.loads((ROOT / "docs" / "quota-table.schema.json").read_text())


def test_the_packaged_schema_is_the_documented_one():
    assert table_schema() == json.loads((ROOT / "docs" / "quota-table.schema.json").read_text())


@pytest.mark.parametrize("who", ["prof-ada", "carol", "finance"])
async def test_only_admins_may_use_the_editor(api, who):
    before = api.quota.read_bytes()
    _, current = await api.get()
    asks = [("GET", "", None), ("GET", "/versions", None), ("GET", "/versions/1", None),
            ("POST", "/check", {"text": "x"}), ("POST", "/preview", {"text": "x"}),
            ("POST", "", {"text": "images: {}\n", "version": current["version"],
                          "comment": "mine"}),
            ("POST", "/versions/1/restore", {"comment": "c", "version": current["version"]})]
    for method, path, body in asks:
        code, found = await api.call(method, path, who, body)
        assert code == 403, (method, path)
        assert "admins only" in found["message"]
    assert api.quota.read_bytes() == before


async def test_check_gives_file_and_line(api):
    code, found = await api.post("/check", {"text": api.quota.read_text()})
    assert (code, found["problems"]) == (200, [])
    broken = api.quota.read_text().replace("cpus: 8", "cpus: lots", 1)
    code, found = await api.post("/check", {"text": broken})
    assert code == 200 and found["problems"]
    problem = found["problems"][0]
    assert problem["file"] == str(api.quota) and problem["line"] > 1
    assert "cpus" in problem["message"]


# --- against the hub's GPUs and host, as validate --gpus and --engine ------------------------

GPU_TRAINING = "    gpus: 1\n    gpu_mode: exclusive"  # gpu-training's, the first GPU role


def asking(text: str, gpus: int) -> str:
    edited = text.replace(GPU_TRAINING, f"    gpus: {gpus}\n    gpu_mode: exclusive", 1)
    assert edited != text
    return edited


async def test_a_role_asking_more_gpus_than_the_hub_has_is_never_saved(hub_api, capsys):
    """The hub has 3 GPUs: a role asking 4 is refused by the check and the save with the
    words and line of quota-spawner validate --gpus 3; a role asking 3 is saved."""
    hub_api.publish(gpus=3)
    code, opened = await hub_api.get()
    assert code == 200 and opened["problems"] == []
    assert opened["against"] == (
        "Checked against this hub's 3 GPUs, the smallest with 80 GiB, as quota-spawner "
        "validate --gpus 3 --gpu-memory 80G, and its host: notebooks may reserve 60 CPUs "
        "and 60 GiB (a role larger than that can never start here, so it is a problem).")
    four = asking(opened["text"], 4)
    line = four.splitlines().index("    gpus: 4") + 1
    hub_api.quota.with_name("four.yaml").write_text(four)
    assert cli_main(["validate", "--gpus", "3", "--gpu-memory", "80G",
                     str(hub_api.quota.with_name("four.yaml"))]) == 1
    [said] = capsys.readouterr().out.splitlines()
    message = "role 'gpu-training': gpus is 4, but this hub has only 3 GPUs"
    assert said.endswith(f":{line}: {message}")

    code, found = await hub_api.post("/check", {"text": four})
    assert code == 200 and [(p["line"], p["message"]) for p in found["problems"]] == [
        (line, message)]
    code, found = await hub_api.post("/preview", {"text": four})
    assert code == 400 and found["problems"][0]["message"] == message
    before = hub_api.quota.read_bytes()
    code, found = await hub_api.post("", {"text": four, "version": opened["version"],
                                          "comment": "four GPUs"})
    assert code == 400 and found["message"] == "The table has 1 problem; nothing was written."
    assert [(p["line"], p["message"]) for p in found["problems"]] == [(line, message)]
    assert hub_api.quota.read_bytes() == before
    code, versions = await hub_api.get("/versions")
    assert versions["versions"] == []

    code, saved = await hub_api.post("", {"text": asking(opened["text"], 3),
                                          "version": opened["version"],
                                          "comment": "three GPUs"})
    assert code == 200 and saved["message"] == "Saved; the hub uses it from the next spawn."
    assert "    gpus: 3" in hub_api.quota.read_text()


HUGE = ("role 'senior-engineer' (4 CPUs, 100 GiB): none fit on this host: one server's "
        "100 GiB of memory is more than the notebooks' 60 GiB")


@pytest.mark.parametrize("source", ["file", "database"])
async def test_a_role_larger_than_the_hosts_share_is_never_saved_as_validate_says(
        tmp_path, monkeypatch, capsys, source):
    """Notebooks may reserve 60 GiB on the hub's host: a role of 100 GiB can never start
    there. validate --engine for that host exits 1 with FILE:LINE; the editor's check,
    preview, save and restore refuse it with the same words at the role's line, and write
    nothing. Saved while the service knew no host, it is a problem once the hub tells it."""
    api, stop = await serve_hub_api(tmp_path, monkeypatch, quota_source=source)
    try:
        api.publish(gpus=3)
        _, opened = await api.get()
        huge = opened["text"].replace("memory: 16G", "memory: 100G", 1)
        line = huge.splitlines().index("    memory: 100G") - 2  # senior-engineer:
        assert huge.splitlines()[line - 1] == "  senior-engineer:"
        copy = tmp_path / "huge.yaml"
        copy.write_text(huge)
        assert cli_main(["validate", str(copy), "--host-cpus", "16", "--host-memory", "64G",
                         "--reserve-cpus", "1", "--reserve-memory", "4G"]) == 1
        assert f"{copy}:{line}: {HUGE}" in capsys.readouterr().out.splitlines()

        code, found = await api.post("/check", {"text": huge})
        assert code == 200 and [(p["file"], p["line"], p["message"]) for p in found[
            "problems"]] == [(opened["path"], line, HUGE)]
        code, found = await api.post("/preview", {"text": huge})
        assert code == 400 and [p["message"] for p in found["problems"]] == [HUGE]
        before = api.quota.read_bytes()
        code, found = await api.post("", {"text": huge, "version": opened["version"],
                                          "comment": "a big box"})
        assert code == 400 and found["message"] == "The table has 1 problem; nothing was written."
        assert [(p["line"], p["message"]) for p in found["problems"]] == [(line, HUGE)]
        assert api.quota.read_bytes() == before
        _, now = await api.get()
        assert now["version"] == opened["version"] and now["problems"] == []
        assert (await api.get("/versions"))[1]["versions"] == []

        # saved while the hub publishes no host (admission off): then a problem, and its
        # restore is refused
        api.publish(gpus=3, host=False)
        code, saved = await api.post("", {"text": huge, "version": opened["version"],
                                          "comment": "a big box"})
        assert code == 200, saved
        api.publish(gpus=3)
        _, now = await api.get()
        assert [(p["line"], p["message"]) for p in now["problems"]] == [(line, HUGE)]
        code, fixed = await api.post("", {"text": opened["text"], "version": now["version"],
                                          "comment": "back to 16G"})
        assert code == 200, fixed
        written = api.quota.read_bytes()
        _, versions = await api.get("/versions")
        big = next(v["id"] for v in versions["versions"] if v["comment"] == "a big box")
        code, found = await api.post(f"/versions/{big}/restore",
                                     {"comment": "the big box again",
                                      "version": fixed["version"]})
        assert code == 400 and [(p["line"], p["message"]) for p in found["problems"]] == [
            (line, HUGE)]
        assert api.quota.read_bytes() == written
        assert (await api.get("/versions"))[1]["versions"] == versions["versions"]
    finally:
        stop()


async def test_without_the_hubs_inventory_the_editor_says_so_and_checks_the_rest(hub_api):
    code, opened = await hub_api.get()
    assert code == 200 and opened["against"] == table.UNKNOWN_ROOM
    code, found = await hub_api.post("/check", {"text": asking(opened["text"], 4)})
    assert (code, found["problems"], found["against"]) == (200, [], table.UNKNOWN_ROOM)
    broken = opened["text"].replace("cpus: 8", "cpus: lots", 1)
    code, found = await hub_api.post("", {"text": broken, "version": opened["version"],
                                          "comment": "typo"})
    assert code == 400 and "cpus must be a number" in found["problems"][0]["message"]
    code, saved = await hub_api.post("", {"text": asking(opened["text"], 4),
                                          "version": opened["version"], "comment": "four"})
    assert code == 200 and saved["message"] == (
        "Saved; the hub uses it from the next spawn. It was not checked against the hub's "
        "GPUs and host: this service does not know them yet.")
    hub_api.publish(gpus=0, host=False)  # a hub without GPUs or host admission
    _, now = await hub_api.get()
    assert now["problems"] == [] and now["against"] == (
        "Checked against this hub, which has no GPUs (its GPU roles are refused when they "
        "start); its host's room is not counted (host admission is off).")


async def test_posts_must_be_json(api):
    code, found = await api.post("/check", "text=x",
                                 content_type="application/x-www-form-urlencoded")
    assert code == 400 and "JSON" in found["message"]
    code, found = await api.post("/check", "{not json")
    assert code == 400
    code, found = await api.post("/check", {"nothing": 1})
    assert code == 400 and "'text'" in found["message"]


async def test_preview_reads_the_hubs_users(api):
    edited = without_gpu_lab(api.quota.read_text())
    code, found = await api.post("/preview", {"text": edited})
    assert code == 200, found
    assert found["sentences"][:2] == [
        "2 users lose gpu-lab.", "1 running server keeps its limits until it stops."]
    assert found["details"]["losses"] == {"gpu-lab": ["alice", "student1"]}
    assert found["details"]["running"][0]["user"] == "alice"
    # every page was read with the service's own token
    assert api.hub_tokens == [f"token {HUB_TOKEN}"] * 2
    code, found = await api.post("/preview", {"text": api.quota.read_text()})
    assert found["sentences"] == ["Nothing changes for anyone."]
    code, found = await api.post("/preview", {"text": "roles: [\n"})
    assert code == 400 and found["problems"]


async def test_save_list_view_and_restore(api):
    _, current = await api.get()
    original = current["text"]
    edited = without_gpu_lab(original)
    code, saved = await api.post("", {"text": edited, "version": current["version"],
                                      "comment": "gpu-lab ends with the term"})
    assert code == 200, saved
    assert api.quota.read_text() == edited
    code, now = await api.get()
    assert now["version"] == saved["version"] != current["version"]

    code, trail = await api.get("/versions")
    assert code == 200
    mine, before = trail["versions"]
    assert (mine["who"], mine["comment"], mine["restored_from"]) == (
        "admin", "gpu-lab ends with the term", None)
    assert mine["id"] == saved["audit_id"] and mine["sha"] == saved["version"]
    assert before["who"] == "(before the editor)" and "text" not in mine
    code, one = await api.get(f"/versions/{mine['id']}")
    assert code == 200 and one["text"] == edited
    assert "-    cs101: [student, gpu-lab]" in one["diff"]
    assert (await api.get("/versions/999"))[0] == 404

    code, restored = await api.post(f"/versions/{before['id']}/restore",
                                    {"comment": "back for the summer school",
                                     "version": saved["version"]})
    assert code == 200, restored
    assert api.quota.read_text() == original
    _, trail = await api.get("/versions")
    assert trail["versions"][0]["restored_from"] == before["id"]
    assert trail["versions"][0]["comment"] == "back for the summer school"
    # a restore needs a comment too, and refuses a stale version
    code, found = await api.post(f"/versions/{mine['id']}/restore",
                                 {"comment": "", "version": restored["version"]})
    assert code == 400 and "comment" in found["message"]
    code, found = await api.post(f"/versions/{mine['id']}/restore",
                                 {"comment": "again", "version": saved["version"]})
    assert code == 409 and api.quota.read_text() == original


async def test_an_invalid_table_is_refused_and_nothing_written(api):
    _, current = await api.get()
    before = api.quota.read_bytes()
    broken = current["text"].replace("cpus: 8", "cpus: lots", 1)
    code, found = await api.post("", {"text": broken, "version": current["version"],
                                      "comment": "more CPUs"})
    assert code == 400
    assert found["problems"][0]["file"] == str(api.quota)
    assert found["problems"][0]["line"] > 1
    code, found = await api.post("", {"text": without_gpu_lab(current["text"]),
                                      "version": current["version"], "comment": "  "})
    assert code == 400 and "comment" in found["message"]
    assert api.quota.read_bytes() == before
    _, trail = await api.get("/versions")
    assert trail["versions"] == []


async def test_a_concurrent_edit_is_refused_with_the_diffs(api):
    _, opened = await api.get()
    first = without_gpu_lab(opened["text"])
    code, _ = await api.post("", {"text": first, "version": opened["version"],
                                  "comment": "first admin"})
    assert code == 200
    second = opened["text"].replace("cpus: 8", "cpus: 6", 1)
    code, found = await api.post("", {"text": second, "version": opened["version"],
                                      "comment": "second admin"})
    assert code == 409
    assert "changed by admin" in found["message"]
    assert "-    cs101: [student, gpu-lab]" in found["diff"]
    assert "+    cpus: 6" in found["yours"] and "+    cs101: [student, gpu-lab]" in found["yours"]
    assert found["current_text"] == first
    assert api.quota.read_text() == first


async def test_a_conflict_with_an_edit_outside_the_editor_shows_what_changed(api):
    """The version the admin opened was never saved through the editor (the trail has no
    row for it), and the file is then changed by hand: the 409 still says what changed
    since they started, from the text the service showed them."""
    _, opened = await api.get()
    by_hand = opened["text"].replace("cpus: 8", "cpus: 4", 1)
    api.quota.write_text(by_hand)
    mine = without_gpu_lab(opened["text"])
    code, found = await api.post("", {"text": mine, "version": opened["version"],
                                      "comment": "cs101 loses gpu-lab"})
    assert code == 409
    assert "-    cpus: 8" in found["diff"] and "+    cpus: 4" in found["diff"]
    assert "-    cs101: [student, gpu-lab]" in found["yours"]
    assert api.quota.read_text() == by_hand


async def test_crlf_is_saved_as_lf(api):
    _, current = await api.get()
    edited = without_gpu_lab(current["text"]).replace("\n", "\r\n")
    code, _ = await api.post("", {"text": edited, "version": current["version"],
                                  "comment": "from a Windows browser"})
    assert code == 200
    assert b"\r" not in api.quota.read_bytes()
    assert api.quota.read_text() == without_gpu_lab(current["text"])


# --- hostile input and a responsive service -----------------------------------------------


async def test_version_ids_out_of_range_are_a_sentence(api):
    sentence = ("'99999999999999999999' is not a version id: ids are whole numbers from 1 "
                "to 9223372036854775807.")
    assert await api.get("/versions/99999999999999999999") == (400, {"message": sentence})
    _, now = await api.get()
    assert await api.post("/versions/99999999999999999999/restore",
                          {"comment": "x", "version": now["version"]}) == (
        400, {"message": sentence})


async def test_a_save_comment_has_a_limit(api):
    _, now = await api.get()
    code, found = await api.post("", {"text": now["text"], "version": now["version"],
                                      "comment": "c" * 2001})
    assert (code, found["message"]) == (400, "Please keep the comment under 2000 characters.")


SURROGATE = ("holds an unpaired UTF-16 surrogate (U+D800) at character {}, which is not text "
             "that can be stored; please remove it and send it again.")


async def test_a_save_holding_a_lone_surrogate_is_refused(api, caplog):
    """"\\ud800" is valid JSON but no character: in the comment or in the table's text,
    on a save, a restore, a check or a preview, a sentence; nothing written, no traceback."""
    _, now = await api.get()
    before = api.quota.read_bytes()
    edited = without_gpu_lab(now["text"])
    code, found = await api.post("", {"text": edited, "version": now["version"],
                                      "comment": "term\ud800 ends"})
    assert (code, found["message"]) == (400, "The comment " + SURROGATE.format(5))
    code, found = await api.post("", {"text": "\ud800" + edited, "version": now["version"],
                                      "comment": "the term ends"})
    assert (code, found["message"]) == (400, "The table's text " + SURROGATE.format(1))
    for path in ("/check", "/preview"):
        code, found = await api.post(path, {"text": "\ud800"})
        assert (code, found["message"]) == (400, "The table's text " + SURROGATE.format(1))
    assert api.quota.read_bytes() == before
    # a restore's comment: there is a version to restore once a save went through
    code, saved = await api.post("", {"text": edited, "version": now["version"],
                                      "comment": "the term ends"})
    assert code == 200, saved
    _, trail = await api.get("/versions")
    code, found = await api.post(f"/versions/{trail['versions'][-1]['id']}/restore",
                                 {"comment": "\ud800", "version": saved["version"]})
    assert (code, found["message"]) == (400, "The comment " + SURROGATE.format(1))
    assert api.quota.read_text() == edited
    _, trail = await api.get("/versions")
    assert [v["comment"] for v in trail["versions"]][:1] == ["the term ends"]
    assert len(trail["versions"]) == 2  # the save and the table before it: no restore
    assert [r.getMessage() for r in caplog.records if r.exc_info] == []


@pytest.mark.parametrize("endpoint, name", [("/check", "checked"), ("/preview", "preview")])
async def test_a_slow_table_check_holds_up_no_other_visitor(api, monkeypatch, endpoint, name):
    """The check and the preview run on the service's threads: while one is slow (a large
    table), another visitor is answered. On the event loop, the second answer would wait."""
    release = threading.Event()
    original = getattr(table, name)

    def slow(*args):
        release.wait(5)
        return original(*args)

    monkeypatch.setattr(table, name, slow)
    _, now = await api.get()
    checking = asyncio.ensure_future(api.post(endpoint, {"text": now["text"]}))
    await asyncio.sleep(0.2)
    code, _ = await api.get("/versions", who="admin")
    assert code == 200
    assert not checking.done()  # answered while the check still ran
    release.set()
    code, found = await checking
    assert code == 200, found


# --- the page ----------------------------------------------------------------------------------

PREFIX = "/services/usage/"
BUNDLE = ROOT / "spawner" / "webapp" / "static" / "editor.js"
EDITOR_VERSION = static_version("editor.js")  # in the bundle's URL


class Site(PageSite):
    def __init__(self, port: int, quota: Path):
        super().__init__(port, PREFIX)
        self.quota = quota


@pytest.fixture
async def site(tmp_path, monkeypatch):
    url, quota = seed(tmp_path)
    auth = PageHubAuth(MODELS)
    monkeypatch.setattr(BaseHandler, "hub_auth", property(lambda self: auth))
    app = service.make_app(usage_db=url, quota_file=str(quota), service_prefix=PREFIX)
    server, port = serve(app)
    yield Site(port, quota)
    server.stop()
    app.settings["usage"].reader.close()


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
                       f'{EDITOR_VERSION}" defer>']
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
    r = await site.get(f"static/editor.js?v={EDITOR_VERSION}")
    assert r.code == 200
    assert r.headers["Content-Type"] == "text/javascript; charset=utf-8"
    assert r.headers["X-Content-Type-Options"] == "nosniff"
    assert r.body == BUNDLE.read_bytes()
    licenses = await site.get("static/editor.js.LICENSE.txt")
    assert licenses.code == 200 and licenses.headers["Content-Type"].startswith("text/plain")
    assert (await site.get("static/../table.py")).code in (403, 404)
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
