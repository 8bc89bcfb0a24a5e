"""The quota table editor's API and page with quota_source "database", in tornado: the table
is the ledger's newest version (the file, read-only, only seeds the first), a save adds a
version the hub's store reads at its next look, conflicts and bad tables are refused as
for a file, and a restore is a save. SQLite here; PostgreSQL in
tests/service/test_table_database_postgres.py."""

from __future__ import annotations

import html
import logging
import re
import shutil
from pathlib import Path

import pytest
from tornado import web
from webapp_client import HUB_TOKEN, MODELS, FakeHubUsers, PageHubAuth, PageSite, serve
from webapp_client import TableApi as Api

from spawner.quota.editing import FROM_FILE
from spawner.quota.store import QuotaStore
from spawner.usage.ledger import Ledger
from spawner.usage.table_versions import Audit, DatabaseSource
from spawner.webapp import app as service
from spawner.webapp.base import BaseHandler

ROOT = Path(__file__).resolve().parents[2]
LOG = logging.getLogger("test-table-database-api")
PREFIX = "/services/usage/"
KEY = "database:default"


@pytest.fixture
async def db_site(tmp_path, monkeypatch, ledger_url):
    """The service with the database source: a created ledger, and the shipped table as
    the seed, read-only in a read-only folder (a ConfigMap)."""
    Ledger(ledger_url).dispose()
    quota = tmp_path / "config" / "quotas.yaml"
    quota.parent.mkdir()
    shutil.copy(ROOT / "hub_config" / "quotas.yaml", quota)
    quota.chmod(0o444)
    quota.parent.chmod(0o555)
    auth = PageHubAuth(MODELS)
    monkeypatch.setattr(BaseHandler, "hub_auth", property(lambda self: auth))
    seen: list = []
    hub_server, hub_port = serve(web.Application([(r"/hub/api/users", FakeHubUsers)],
                                                 seen_tokens=seen))
    app = service.make_app(usage_db=ledger_url, quota_file=str(quota), quota_source="database",
                           hub_api_url=f"http://127.0.0.1:{hub_port}/hub/api",
                           hub_api_token=HUB_TOKEN, service_prefix=PREFIX)
    server, port = serve(app)
    reader = app.settings["usage"].reader
    # the hub's own store, in another process: the same ledger, the key, not the path
    hub = Ledger(ledger_url, create=False)
    yield (Api(port, quota, seen), PageSite(port, PREFIX),
           QuotaStore(DatabaseSource(lambda: hub.engine, "default", "/elsewhere/q.yaml")))
    server.stop()
    hub_server.stop()
    reader.close()
    hub.dispose()
    quota.parent.chmod(0o755)


async def test_the_editor_reads_saves_and_restores_versions_in_the_database(db_site):
    api, _, hub = db_site
    code, opened = await api.get()
    assert code == 200
    assert (opened["path"], opened["source"]) == (KEY, "database")
    assert opened["text"] == api.quota.read_text() and opened["problems"] == []
    edited = opened["text"].replace("cs101: [student, gpu-lab]", "cs101: [student]")
    assert edited != opened["text"]
    code, saved = await api.post("", {"text": edited, "version": opened["version"],
                                      "comment": "gpu-lab ends with the term"})
    assert code == 200, saved
    assert "-    cs101: [student, gpu-lab]" in saved["diff"]
    assert api.quota.read_text() == opened["text"]  # the file is never written
    assert sorted(api.quota.parent.iterdir()) == [api.quota]  # nor a lock or temp file
    assert hub.get(LOG).groups["cs101"] == ("student",)  # the hub's next spawn
    code, now = await api.get()
    assert (now["text"], now["version"]) == (edited, saved["version"])

    code, trail = await api.get("/versions")
    mine, seeded = trail["versions"]
    assert (mine["who"], mine["id"]) == ("admin", saved["audit_id"])
    assert seeded["who"] == FROM_FILE and str(api.quota) in seeded["comment"]
    code, one = await api.get(f"/versions/{seeded['id']}")
    assert code == 200 and one["text"] == opened["text"]

    code, restored = await api.post(f"/versions/{seeded['id']}/restore",
                                    {"comment": "back for the summer school",
                                     "version": saved["version"]})
    assert code == 200, restored
    assert hub.get(LOG).groups["cs101"] == ("student", "gpu-lab")
    _, trail = await api.get("/versions")
    assert trail["versions"][0]["restored_from"] == seeded["id"]


async def test_the_editor_refuses_a_bad_table_and_a_stale_version(db_site):
    api, _, hub = db_site
    _, opened = await api.get()
    broken = opened["text"].replace("cpus: 4", "cpus: lots", 1)
    code, found = await api.post("", {"text": broken, "version": opened["version"],
                                      "comment": "more CPUs"})
    assert code == 400
    [problem] = found["problems"]
    assert problem["file"] == KEY and problem["line"] > 1 and "cpus" in problem["message"]
    assert (await api.get("/versions"))[1]["versions"] == []

    first = opened["text"].replace("cpus: 4", "cpus: 6", 1)
    code, _ = await api.post("", {"text": first, "version": opened["version"],
                                  "comment": "first admin"})
    assert code == 200
    code, found = await api.post("", {"text": opened["text"].replace("cpus: 4", "cpus: 5", 1),
                                      "version": opened["version"], "comment": "second admin"})
    assert code == 409
    assert "changed by admin" in found["message"]
    assert "-    cpus: 4" in found["diff"] and "+    cpus: 6" in found["diff"]
    assert found["current_text"] == first
    assert hub.get(LOG).roles["senior-engineer"].cpus == 6


async def test_the_page_names_the_database_table_and_its_seed(db_site):
    api, site, _ = db_site
    r = await site.get("table", "admin")
    assert r.code == 200
    page = r.body.decode()
    help_text = " ".join(html.unescape(re.sub(r"<[^>]+>", "", re.search(
        r'<p class="scope" id="editor-help">(.*?)</p>', page, re.S).group(1))).split())
    assert help_text.startswith(
        f"The table the hub reads is kept in the usage ledger's database, as {KEY} (the file "
        f"{api.quota} only seeds its first version, and is never written). Each save is a "
        "new version.")


async def test_the_editor_shows_a_bad_newest_version_and_the_version_the_hub_runs(
        db_site, ledger_url):
    """A bad version written around the editor: the hub runs the newest good one, and the
    editor says so, with the bad one's problems by line, until a good one is newer."""
    api, site, hub = db_site
    _, opened = await api.get()
    assert opened["running"] == {"newest": None, "runs": None, "passed_over": [],
                                 "problems": []}
    edited = opened["text"].replace("cpus: 4", "cpus: 6", 1)
    code, saved = await api.post("", {"text": edited, "version": opened["version"],
                                      "comment": "more CPUs"})
    assert code == 200
    good = saved["audit_id"]
    ledger = Ledger(ledger_url, create=False)
    try:
        bad = Audit(ledger.engine).record(path=KEY, who="a script", comment="by hand",
                                          text=edited.replace("cpus: 6", "cpus: lots", 1),
                                          previous=edited)
    finally:
        ledger.dispose()
    line = edited.splitlines().index("    cpus: 6") + 1
    problem = {"file": f"quota table (database, version {bad})", "line": line,
               "message": "role 'senior-engineer': cpus must be a number, like 2 or 0.5, "
                          "not text 'lots'"}
    code, now = await api.get()
    assert code == 200 and now["running"] == {
        "newest": bad, "runs": good, "passed_over": [{"version": bad, "problems": [problem]}],
        "problems": []}
    assert [(p["line"], p["message"]) for p in now["problems"]] == [
        (line, problem["message"])]  # the newest, in the editor, with its line
    assert hub.get(LOG).roles["senior-engineer"].cpus == 6  # the hub's choice: the same
    page = (await site.get("table", "admin")).body.decode()
    runs = re.search(r'<p id="table-runs"[^>]*>(.*?)</p>', page, re.S).group(1)
    assert " ".join(html.unescape(runs).split()) == (
        f"Version {bad}, the newest, has problems, so the hub runs version {good}, the "
        f"newest good version. The text below is version {bad}: fix it and save, or restore "
        f"version {good}.")

    code, restored = await api.post(f"/versions/{good}/restore",
                                    {"comment": "back to 6", "version": now["version"]})
    assert code == 200, restored
    _, after = await api.get()
    assert after["running"]["runs"] == after["running"]["newest"] == restored["audit_id"]
    assert 'id="table-runs"' not in (await site.get("table", "admin")).body.decode()
