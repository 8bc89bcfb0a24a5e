"""The quota table editor's JSON API without a hub: the OAuth user is faked as in
test_usage_service.py, and the hub's REST API by a small tornado app."""

from __future__ import annotations

import asyncio
import json
import shutil
import threading
from pathlib import Path

import pytest
from test_usage_service import ADMIN, INSTRUCTOR, PLAIN, VIEWER, FakeHubAuth
from tornado import web
from tornado.httpclient import AsyncHTTPClient
from tornado.httpserver import HTTPServer
from tornado.testing import bind_unused_port

from spawner.usage.ledger import Ledger
from spawner.webapp import app as service
from spawner.webapp import table as table_api
from spawner.webapp.table import table_schema

ROOT = Path(__file__).resolve().parents[2]
HUB_TOKEN = "service-token"

# The hub's users: alice runs a gpu-lab server
HUB_USERS = [
    {"name": "alice", "groups": ["cs101"],
     "servers": {"": {"ready": True, "user_options": {"profile": "gpu-lab",
                                                      "image": "pytorch"}}}},
    {"name": "student1", "groups": ["cs101"], "servers": {}},
    {"name": "bob", "groups": ["ml-platform"], "servers": {}},
]


class FakeHubUsers(web.RequestHandler):
    """GET /hub/api/users, two users a page, as JupyterHub paginates."""

    def get(self) -> None:
        self.application.settings["seen_tokens"].append(
            self.request.headers.get("Authorization"))
        offset = int(self.get_argument("offset", "0"))
        page = HUB_USERS[offset:offset + 2]
        following = {"offset": offset + 2} if offset + 2 < len(HUB_USERS) else None
        self.finish({"items": page, "_pagination": {"offset": offset, "next": following}})


class Api:
    def __init__(self, port: int, quota: Path, hub_tokens: list):
        self.base = f"http://127.0.0.1:{port}/services/usage/api/table"
        self.client = AsyncHTTPClient()
        self.quota = quota
        self.hub_tokens = hub_tokens

    async def call(self, method: str, path: str = "", who: str = "admin", body=None,
                   content_type: str = "application/json"):
        headers = {"X-Test-User": who, "Content-Type": content_type}
        data = None if body is None else (
            body if isinstance(body, (bytes, str)) else json.dumps(body))
        if method == "POST" and data is None:
            data = "{}"
        r = await self.client.fetch(self.base + path, method=method, headers=headers,
                                    body=data, raise_error=False, follow_redirects=False)
        return r.code, json.loads(r.body) if r.body else None

    async def get(self, path: str = "", who: str = "admin"):
        return await self.call("GET", path, who)

    async def post(self, path: str = "", body=None, who: str = "admin", **kwargs):
        return await self.call("POST", path, who, body, **kwargs)


@pytest.fixture
async def api(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'usage.sqlite'}"
    Ledger(url).dispose()
    quota = tmp_path / "quotas.yaml"
    shutil.copy(ROOT / "hub_config" / "quotas.yaml", quota)
    auth = FakeHubAuth({"admin": ADMIN, "prof-ada": INSTRUCTOR, "carol": PLAIN,
                        "finance": VIEWER})
    monkeypatch.setattr(service.UsageHandler, "hub_auth", property(lambda self: auth))
    seen: list = []
    hub = web.Application([(r"/hub/api/users", FakeHubUsers)], seen_tokens=seen)
    hub_sock, hub_port = bind_unused_port()
    hub_server = HTTPServer(hub)
    hub_server.add_sockets([hub_sock])
    app = service.make_app(usage_db=url, quota_file=str(quota),
                           hub_api_url=f"http://127.0.0.1:{hub_port}/hub/api",
                           hub_api_token=HUB_TOKEN)
    sock, port = bind_unused_port()
    server = HTTPServer(app)
    server.add_sockets([sock])
    yield Api(port, quota, seen)
    server.stop()
    hub_server.stop()
    app.settings["usage_reader"]._pool.shutdown(wait=False)


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
    assert (code, found) == (200, {"problems": []})
    broken = api.quota.read_text().replace("cpus: 8", "cpus: lots", 1)
    code, found = await api.post("/check", {"text": broken})
    assert code == 200 and found["problems"]
    problem = found["problems"][0]
    assert problem["file"] == str(api.quota) and problem["line"] > 1
    assert "cpus" in problem["message"]


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


@pytest.mark.parametrize("endpoint, name", [("/check", "check"), ("/preview", "preview")])
async def test_a_slow_table_check_holds_up_no_other_visitor(api, monkeypatch, endpoint, name):
    """The check and the preview run on the service's threads: while one is slow (a large
    table), another visitor is answered. On the event loop, the second answer would wait."""
    release = threading.Event()
    original = getattr(table_api, name)

    def slow(*args):
        release.wait(5)
        return original(*args)

    monkeypatch.setattr(table_api, name, slow)
    _, now = await api.get()
    checking = asyncio.ensure_future(api.post(endpoint, {"text": now["text"]}))
    await asyncio.sleep(0.2)
    code, _ = await api.get("/versions", who="admin")
    assert code == 200
    assert not checking.done()  # answered while the check still ran
    release.set()
    code, found = await checking
    assert code == 200, found
