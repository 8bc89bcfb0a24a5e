"""The admins' host map page and its JSON API without a hub or a browser: the OAuth user is
faked by webapp_client.py, the hub's pool file and the watchdog's usage file are
written into a state folder as the hub and the watchdog write them. What the page does
in a browser, live, is for test_browser_gpu_map.py."""

from __future__ import annotations

import html
import json
import re
import threading
import time
from pathlib import Path

import pytest
from map_site import HOSTILE, HOSTILE_ROLE, Site, database_site, row_of, state_site, words
from map_states import G, busy_pool, idle_book, watched
from webapp_client import ADMIN, PageHubAuth, attribute, drawn
from webapp_client import serve as serve_app

from spawner.gpu.pool import Server
from spawner.gpu.snapshot import pool_snapshot
from spawner.usage.documents import GPU_USAGE, GPUS, DatabaseDocuments
from spawner.watchdog.app import gpu_usage_snapshot
from spawner.webapp import app as service
from spawner.webapp import gpus as gpu_page
from spawner.webapp.base import BaseHandler, static_version
from spawner.webapp.formatting import duration, percent, size
from spawner.webapp.gpus import ADMINS_ONLY, NO_STATE, map_document, user_link

PREFIX = "/services/usage/"
SCRIPT_VERSION = static_version("gpus.js")  # in the scripts' URLs
LIVE_VERSION = static_version("live.js")
STATIC = Path(gpu_page.__file__).parent / "static"


@pytest.fixture
async def site(tmp_path, monkeypatch):
    async with state_site(tmp_path, monkeypatch) as found:
        yield found


async def write_busy(site: Site, watchdog_age: float | None = 1.0, hostile: bool = False):
    """GPU-0 exclusive (alice, idle for the watchdog), GPU-1 shared by bob and carol,
    GPU-2 free, dave waiting for two GPUs; the watchdog also sees GPU-9, outside the
    pool. ``watchdog_age``: how old its file is (None: no file)."""
    now = time.time()
    pool = await busy_pool()
    if hostile:
        pool.servers["quota-bob"] = Server(HOSTILE, HOSTILE_ROLE, now - 50)
    site.write(GPUS.file, pool_snapshot(pool, now))
    pool.leave("quota-dave", "test")
    if watchdog_age is not None:
        usage = gpu_usage_snapshot(watched(now - watchdog_age), idle_book(), 5.0)
        usage["idle"][0]["since"] = now - 7200
        site.write(GPU_USAGE.file, usage)


# --- who may see it -----------------------------------------------------------------------


async def test_the_admin_gets_every_gpu_with_its_holders_and_the_queue(site):
    await write_busy(site)
    r = await site.get("gpus", "admin")
    assert r.code == 200 and r.headers["Content-Type"].startswith("text/html")
    page = r.body.decode()
    assert re.findall(r'<tr data-key="([^"]*)"', page) == [
        "cpus", "memory", "GPU-0", "GPU-1", "GPU-2", "GPU-9", "quota-dave"]
    g0 = words(row_of(page, "GPU-0"))
    assert "Exclusive" in g0 and "alice" in g0 and "Idle held, no utilisation for 2h" in g0
    assert "1 GiB on this GPU" in g0 and "0%" in g0 and "1 GiB of 80 GiB" in g0
    assert 'class="gpu exclusive idle"' in page
    g1 = words(row_of(page, "GPU-1"))
    assert "Shared · 2 of 3 places taken" in g1 and "75%" in g1 and "30 GiB of 80 GiB" in g1
    assert "bob · lab · shared by up to 3, cap 8 GiB · 6 GiB on this GPU" in g1
    assert "carol · lab · shared by up to 3, cap 8 GiB · for" in g1  # not seen: no memory
    assert "Idle" not in g1
    g2 = words(row_of(page, "GPU-2"))
    assert "Free" in g2 and "nobody" in g2 and "Lost GPU is lost" in g2
    assert "Not in the hub's pool" in words(row_of(page, "GPU-9"))
    dave = words(row_of(page, "quota-dave"))
    assert dave.startswith("1 dave train 2 GPUs, exclusive – 10")
    assert dave.endswith("2 GPUs –")  # waiting for GPUs; no preemption
    text = words(page)
    assert ("3 GPUs in the hub's pool: 1 exclusive, 1 shared, 1 free; 1 idle; 1 start "
            "waiting for a GPU. 1 other GPU on the host, outside the pool.") in text
    assert "The watchdog's figures are 1s old (it measures every 5s)." in text
    # the holders link to their usage page
    assert f'<a href="{PREFIX}user?name=alice" dir="auto">alice</a>' in page
    # the page carries what its script needs, and the header marks where we are
    assert attribute(page, "data-api") == PREFIX + "api/gpus"
    assert attribute(page, "data-xsrf")
    assert attribute(page, "data-interval") == "2000"
    assert f'href="{PREFIX}gpus" aria-current="page"' in page


async def test_the_api_gives_the_same_map_as_json(site):
    await write_busy(site)
    before = time.time()
    r = await site.get("api/gpus", "admin")
    assert r.code == 200 and r.headers["Content-Type"].startswith("application/json")
    assert r.headers["Cache-Control"] == "no-store"
    doc = json.loads(r.body)
    assert before - 1 <= doc["generated_at"] <= time.time()
    assert doc["watchdog"]["state"] == "fresh" and 0.5 < doc["watchdog"]["age"] < 5
    assert doc["watchdog"]["interval"] == 5.0 and doc["watchdog"]["host"] == "gpu-host-1"
    assert doc["pool"]["state"] == "ok" and doc["pool"]["hub"] == "hub-1"
    assert doc["summary"] == {"total": 3, "exclusive": 1, "shared": 1, "free": 1, "idle": 1,
                              "waiting": 1, "waiting_for_gpu": 1, "waiting_for_room": 0,
                              "other": 1}
    g0, g1, g2, g9 = doc["gpus"]
    assert g0["idle"] and g0["holders"][0]["user"] == "alice"
    assert g0["holders"][0]["gpu_memory"] == G
    assert [(h["user"], h["mode"]) for h in g1["holders"]] == [("bob", "shared:3"),
                                                                ("carol", "shared:3")]
    assert g1["utilization"] == 0.75 and not g9["in_pool"]
    (dave,) = doc["queue"]
    assert (dave["user"], dave["gpus"], dave["mode"], dave["position"]) == (
        "dave", 2, "exclusive", 1)


@pytest.mark.parametrize("who", ["prof-ada", "carol", "finance"])
async def test_only_admins_get_the_page_and_the_api(site, who):
    await write_busy(site)
    r = await site.get("gpus", who)
    assert r.code == 403
    page = r.body.decode()
    assert ADMINS_ONLY in words(page)
    assert "alice" not in page and "GPU-0" not in page and "gpus.js" not in page
    r = await site.get("api/gpus", who)
    assert r.code == 403 and r.headers["Content-Type"].startswith("application/json")
    assert json.loads(r.body) == {"message": ADMINS_ONLY}


async def test_without_a_login_nothing_is_shown(site):
    await write_busy(site)
    for path in ("gpus", "api/gpus"):
        r = await site.get(path)
        assert r.code in (302, 403), path
        assert b"alice" not in r.body


async def test_the_page_runs_its_own_script_only(site):
    await write_busy(site)
    r = await site.get("gpus", "admin")
    csp = dict(part.strip().split(" ", 1) for part in
               r.headers["Content-Security-Policy"].split(";"))
    assert csp["script-src"] == "'self'" and csp["default-src"] == "'none'"
    assert csp["connect-src"] == "'self'"
    page = r.body.decode()
    assert re.findall(r"<script\b[^>]*>", page) == [
        f'<script src="{PREFIX}static/live.js?v={LIVE_VERSION}" defer>',
        f'<script src="{PREFIX}static/gpus.js?v={SCRIPT_VERSION}" defer>']
    assert "http://" not in page and "https://" not in page  # nothing from the network
    r = await site.get(f"static/gpus.js?v={SCRIPT_VERSION}", "admin")
    assert r.code == 200 and r.headers["Content-Type"].startswith("text/javascript")
    script = r.body.decode() + (await site.get(f"static/live.js?v={LIVE_VERSION}")).body.decode()
    assert "innerHTML" not in script and "X-XSRFToken" in script and "http" not in script


async def test_the_page_script_gets_the_map_as_the_page_draws_it(site):
    """The map is drawn in one place: asked for HTML only, the API answers with the page's
    own drawing of the map (its main block: no frame, no script), which the page's script
    patches in; any other client, a browser's navigation too, gets the JSON."""
    await write_busy(site)
    page = (await site.get("gpus", "admin")).body.decode()
    r = await site.get("api/gpus", "admin", headers={"Accept": "text/html"})
    assert r.code == 200 and r.headers["Content-Type"].startswith("text/html")
    assert r.headers["Cache-Control"] == "no-store"
    live = r.body.decode()
    assert live.lstrip().startswith("<style>") and "<header>" not in live
    assert "<script" not in live and '<div id="live" data-generated-at="' in live
    assert drawn(live) in drawn(page)
    assert "Exclusive" in words(row_of(live, "GPU-0"))
    navigation = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"
    for accept in (None, "application/json", "*/*", navigation):
        r = await site.get("api/gpus", "admin", headers={"Accept": accept} if accept else {})
        assert r.headers["Content-Type"].startswith("application/json"), accept
        assert json.loads(r.body)["gpus"][0]["uuid"] == "GPU-0"
    # a refusal is the API's sentence, for the script to show
    r = await site.get("api/gpus", "prof-ada", headers={"Accept": "text/html"})
    assert r.code == 403 and json.loads(r.body) == {"message": ADMINS_ONLY}


def test_the_map_is_drawn_and_worded_by_the_service_only():
    """The map's markup and words are the template's and gpus.py's: its scripts make no
    element and write none of its sentences; they patch in what the service drew."""
    script = "".join((STATIC / name).read_text(encoding="utf-8")
                     for name in ("gpus.js", "live.js"))
    assert "createElement" not in script and "QuotaFormat" not in script
    for words_ in ("places taken", "Nobody is waiting", "room on the host", "shared by up to",
                   "on this GPU", "in the hub's pool", "The watchdog's figures", "Kept back",
                   "Not in the hub's pool", "nobody", "waiting for a GPU", "kept for it"):
        assert words_ not in script, words_


# --- user-chosen names --------------------------------------------------------------------


async def test_hostile_names_are_escaped(site):
    await write_busy(site, hostile=True)
    page = (await site.get("gpus", "admin")).body.decode()
    assert "<script>alert" not in page and "<img src=x" not in page
    # as text, the way a browser reads the page
    assert f"{HOSTILE} · {HOSTILE_ROLE} · shared by up to 3" in words(row_of(page, "GPU-1"))
    # in the link, quoted as the script's encodeURIComponent quotes it
    assert html.escape(user_link(PREFIX, HOSTILE)) in page
    assert "%3Cscript%3Ealert(1)%3C%2Fscript%3E%22%26" in user_link(PREFIX, HOSTILE)
    doc = json.loads((await site.get("api/gpus", "admin")).body)
    assert doc["gpus"][1]["holders"][0]["user"] == HOSTILE  # JSON carries the text as is


# --- old, missing and broken files ----------------------------------------------------------


async def test_stale_watchdog_figures_are_named_and_left_out(site):
    await write_busy(site, watchdog_age=60)
    page = (await site.get("gpus", "admin")).body.decode()
    assert 'class="freshness stale"' in page
    assert ("The watchdog's figures are 1m old, too old to trust (more than 15s): the "
            "CPUs and memory used, utilisation, GPU memory and idle marks are left out") \
        in words(page)
    g0 = words(row_of(page, "GPU-0"))
    assert "Idle" not in g0 and "– of 80 GiB" in g0 and "on this GPU" not in g0
    assert "GPU-9" not in page  # other GPUs come from fresh figures only
    doc = json.loads((await site.get("api/gpus", "admin")).body)
    assert doc["watchdog"]["state"] == "stale" and 59 < doc["watchdog"]["age"] < 70
    assert all(g["utilization"] is None and not g["idle"] for g in doc["gpus"])


async def test_a_missing_watchdog_file_is_said(site):
    await write_busy(site, watchdog_age=None)
    page = (await site.get("gpus", "admin")).body.decode()
    assert 'class="freshness missing"' in page
    assert ("No figures from the watchdog (the watchdogs' readings in the ledger's database: "
            "missing or unreadable)") in words(page)
    assert "alice" in words(row_of(page, "GPU-0"))  # the holders still show
    doc = json.loads((await site.get("api/gpus", "admin")).body)
    assert doc["watchdog"] == {"state": "missing", "time": None, "age": None,
                               "interval": None, "stale_after": None, "host": None,
                               "nodes": []}


async def test_no_files_at_all(site):
    r = await site.get("gpus", "admin")
    assert r.code == 200
    text = words(r.body.decode())
    assert "No GPU to show." in text and "No pool from the hub yet" in text
    assert "Nobody is waiting for a GPU or for room on the host." in text
    assert "No host figures from the hub yet" in text
    doc = json.loads((await site.get("api/gpus", "admin")).body)
    assert doc["gpus"] == [] and doc["queue"] == [] and doc["pool"]["state"] == "missing"


async def test_half_written_or_foreign_files_are_missing_not_errors(site):
    site.write(GPUS.file, '{"version": 1, "gpus": [')
    site.write(GPU_USAGE.file, json.dumps({"version": 99, "time": time.time()}))
    r = await site.get("gpus", "admin")
    assert r.code == 200 and "No pool from the hub yet" in words(r.body.decode())
    doc = json.loads((await site.get("api/gpus", "admin")).body)
    assert doc["pool"]["state"] == "missing" and doc["watchdog"]["state"] == "missing"


async def test_without_a_ledger_or_a_state_folder_the_page_says_so(tmp_path, monkeypatch):
    auth = PageHubAuth({"admin": ADMIN})
    monkeypatch.setattr(BaseHandler, "hub_auth", property(lambda self: auth))
    app = service.make_app(usage_db="none", service_prefix=PREFIX, state_dir="")
    server, port = serve_app(app)
    try:
        site = Site(port, tmp_path)
        r = await site.get("gpus", "admin")
        assert r.code == 200 and NO_STATE in words(r.body.decode())
        doc = json.loads((await site.get("api/gpus", "admin")).body)
        assert doc["state_dir"] is False and doc["gpus"] == []
    finally:
        server.stop()
        app.settings["usage"].reader.close()


async def test_the_map_reads_the_database_with_no_state_folder(tmp_path, monkeypatch):
    """A service on another machine: only the ledger's URL. The hub's pool and two
    watchdogs' readings (two nodes, each its own GPUs) are rows of the database; the rows
    of another hub are not shown."""
    async with database_site(tmp_path, monkeypatch) as (site, rows):
        pool = await busy_pool()
        now = time.time()
        rows.write(GPUS, json.dumps(pool_snapshot(pool, now)))
        usage = gpu_usage_snapshot(watched(), idle_book(), 5.0)
        node_a = {**usage, "time": now - 1, "node": "gpu-a",
                  "gpus": {k: v for k, v in usage["gpus"].items() if k == "GPU-0"}}
        node_b = {**usage, "time": now - 2, "node": "gpu-b", "idle": [],
                  "gpus": {k: v for k, v in usage["gpus"].items() if k != "GPU-0"}}
        rows.write(GPU_USAGE, json.dumps(node_a), node="gpu-a")
        rows.write(GPU_USAGE, json.dumps(node_b), node="gpu-b")
        DatabaseDocuments(rows.engine, "hub-2").write(
            GPUS, json.dumps({**pool_snapshot(pool, now), "hub": "hub-2", "gpus": []}))
        doc = json.loads((await site.get("api/gpus", "admin")).body)
        assert doc["state_dir"] is True and doc["pool"]["hub"] == "hub-1"
        by_uuid = {g["uuid"]: g for g in doc["gpus"]}
        assert by_uuid["GPU-0"]["usage"] == "fresh" and by_uuid["GPU-0"]["idle"]  # node a's
        assert by_uuid["GPU-1"]["utilization"] == 0.75  # node b's
        assert [(n["node"], n["state"]) for n in doc["watchdog"]["nodes"]] == [
            ("gpu-a", "fresh"), ("gpu-b", "fresh")]
        page = words((await site.get("gpus", "admin")).body.decode())
        assert "Readings from 2 watchdogs: gpu-a (fresh), gpu-b (fresh)." in page
        # node b stops measuring: its GPUs' numbers are left out, node a's stay
        rows.write(GPU_USAGE, json.dumps({**node_b, "time": now - 600}), node="gpu-b")
        doc = json.loads((await site.get("api/gpus", "admin")).body)
        by_uuid = {g["uuid"]: g for g in doc["gpus"]}
        assert by_uuid["GPU-0"]["usage"] == "fresh" and by_uuid["GPU-1"]["utilization"] is None
        page = words((await site.get("gpus", "admin")).body.decode())
        assert "gpu-a (fresh), gpu-b (stale, 10m old)." in page
        pool.leave("quota-dave", "test")


async def test_the_state_folder_comes_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("QUOTA_SPAWNER_STATE_DIR", str(tmp_path))
    assert service.QuotaWebApp().state_dir == str(tmp_path)
    assert service.QuotaWebApp(state_dir="").state_dir == ""


async def test_the_files_are_read_on_the_worker_threads(site, monkeypatch):
    threads = []
    real = gpu_page.read_map

    def spy(folder, now):
        threads.append(threading.current_thread().name)
        return real(folder, now)

    monkeypatch.setattr(gpu_page, "read_map", spy)
    await write_busy(site)
    assert (await site.get("gpus", "admin")).code == 200
    assert (await site.get("api/gpus", "admin")).code == 200
    assert len(threads) == 2 and all(t.startswith("usage-page") for t in threads)


# --- the document and its words -------------------------------------------------------------


async def test_a_preemption_under_way_names_its_victims():
    pool = await busy_pool()
    ticket = pool.queue.ticket("quota-dave")
    pool.allocator.reserve("quota-dave", ["GPU-0"])
    pool.queue.evicting["quota-alice"] = "quota-dave"
    ticket.plan = type("Plan", (), {"victims": ("quota-alice",), "uuids": ("GPU-0",)})()
    now = time.time()
    doc = map_document(pool_snapshot(pool, now), None, now)
    ticket.plan = None
    pool.leave("quota-dave", "test")
    users = gpu_page.holder_users(doc)
    (waiting,) = doc["queue"]
    assert gpu_page.preemption_text(waiting, users, {"GPU-0": "0"}) == \
        "under way: stopping \u2068alice\u2069; GPU 0 kept for it"  # the name isolated
    assert doc["gpus"][0]["reserved_for"] == "quota-dave"
    assert doc["gpus"][0]["holders"][0]["evicting_for"] == "quota-dave"


@pytest.mark.parametrize(("seconds", "text"), [
    (None, "–"), (-3, "0s"), (0.4, "0s"), (0.5, "1s"), (45, "45s"), (60, "1m"),
    (200, "3m20s"), (3600, "1h"), (7500, "2h05m"), (86400, "1d"), (100800, "1d4h")])
def test_durations(seconds, text):
    assert duration(seconds) == text


@pytest.mark.parametrize(("num", "text"), [
    (None, "–"), (0, "0 B"), (512, "512 B"), (1536, "1.5 KiB"), (1000 * 2**20, "1000 MiB"),
    (8 * G, "8 GiB"), (80 * G, "80 GiB"), (int(9.96 * G), "9.96 GiB"), (2**50, "1024 TiB")])
def test_sizes(num, text):
    assert size(num) == text


def test_percent():
    assert (percent(None), percent(0.0), percent(0.755), percent(1.0)) == (
        "–", "0%", "76%", "100%")
