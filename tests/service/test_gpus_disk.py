"""The host map's disk, page and API, without a hub or a browser: the watchdogs' homes
documents, made as the watchdog makes them (spawner/watchdog/homes.py's disk_document
from a cycle's reading), written into a state folder, or as rows of the ledger's
database for two nodes. The page's other parts are test_gpus.py's and
test_gpus_host.py's; in a browser, test_browser_gpu_map.py."""

from __future__ import annotations

import html
import json
import re
import time
from pathlib import Path

import pytest
from map_site import HOSTILE, database_site, state_site, words

from spawner.homes.base import HomeUse, Space
from spawner.usage.documents import HOMES
from spawner.watchdog.homes import disk_document
from spawner.watchdog.model import DiskReading, Server, ServerSample, Snapshot
from spawner.webapp.gpus import user_link

PREFIX = "/services/usage/"
GiB = 2**30
SENTENCE = "Homes are btrfs subvolumes under /srv/homes, each limited by a qgroup"


@pytest.fixture
async def site(tmp_path, monkeypatch):
    async with state_site(tmp_path, monkeypatch) as found:
        yield found


def homes_read(at: float, node: str = "gpu-host-1", user: str = "alice") -> dict:
    """A cycle's homes, the watchdog's way: ``user``'s server runs on the home alice (19 of
    20 GiB), bob's (20 of 20 GiB, full) and carol's (2 of 20 GiB) have no server here; the
    filesystem of 100 GiB holds 70, with 25 free, and the three sizes reserve 60."""
    server = Server(container_id="c1", name="quota-alice", user=user, role="student",
                    image="pytorch", hub_id="hub-1", disk=20 * GiB)
    found = {"alice": HomeUse("alice", 19 * GiB, 20 * GiB),
             "bob": HomeUse("bob", 20 * GiB, 20 * GiB),
             "carol": HomeUse("carol", 2 * GiB, 20 * GiB)}
    disk = DiskReading("btrfs", True, SENTENCE, found,
                       Space(Path("/srv/homes"), 100 * GiB, 70 * GiB, 25 * GiB))
    snapshot = Snapshot(time=at, host=node, disk=disk,
                        servers={"c1": ServerSample(server, home="alice")})
    return disk_document(snapshot, 5.0, node).to_json()


def disk_section(page: str) -> str:
    found = re.search(r'<section aria-labelledby="disk-label">(.*?)</section>', page, re.S)
    assert found
    return found.group(1)


def row(section: str, key: str) -> str:
    found = re.search(rf'<tr data-key="{re.escape(key)}"[^>]*>(.*?)</tr>', section, re.S)
    assert found, key
    return words(found.group(1))


async def test_the_admin_sees_the_filesystem_what_is_reserved_and_each_home(site):
    site.write(HOMES.file, homes_read(time.time() - 2))
    page = (await site.get("gpus", "admin")).body.decode()
    disk = disk_section(page)
    text = words(disk)
    assert "gpu-host-1: the watchdog's figures of the homes are 2s old (it reads them " \
        "every 5s). 3 homes; 1 full; 1 nearly full (90% or more of its size)." in text
    assert SENTENCE in text
    assert row(disk, "filesystem:gpu-host-1") == (
        "/srv/homes 100 GiB 70 GiB 25 GiB 60 GiB (60% of the filesystem)")
    assert f'<meter min="0" max="{95 * GiB}" value="{70 * GiB}">' in disk  # of used + free
    assert re.findall(r'<tr data-key="home:gpu-host-1:([^"]*)"', disk) == [
        "alice", "bob", "carol"]
    assert row(disk, "home:gpu-host-1:alice") == (
        "alice alice 19 GiB of 20 GiB (95%) Nearly full")
    assert f'<a href="{html.escape(user_link(PREFIX, "alice"))}" dir="auto">alice</a>' in disk
    assert row(disk, "home:gpu-host-1:bob") == (
        "no server here bob 20 GiB of 20 GiB (100%) Full: writes are refused")
    assert row(disk, "home:gpu-host-1:carol") == "no server here carol 2 GiB of 20 GiB (10%) –"
    assert 'class="home full"' in disk and 'class="home nearly-full"' in disk
    # the API: the same, as JSON
    doc = json.loads((await site.get("api/gpus", "admin")).body)
    assert doc["disk"]["state"] == "fresh"
    (node,) = doc["disk"]["nodes"]
    assert (node["node"], node["state"], node["mechanism"], node["enforced"]) == (
        "gpu-host-1", "fresh", "btrfs", True)
    assert node["filesystem"] == {"path": "/srv/homes", "size": 100 * GiB,
                                  "used": 70 * GiB, "free": 25 * GiB, "reserved": 60 * GiB}
    assert node["homes"][0] == {"user": "alice", "name": "alice", "used": 19 * GiB,
                                "limit": 20 * GiB, "share": 0.95, "full": False,
                                "nearly_full": True}
    # the script's drawing carries it too
    drawn = (await site.get("api/gpus", "admin", headers={"Accept": "text/html"})).body
    assert disk_section(drawn.decode()) == disk


async def test_stale_figures_are_left_out_and_missing_ones_said(site):
    page = (await site.get("gpus", "admin")).body.decode()
    assert words(disk_section(page)) == (
        "Disk No figures of the users' homes from the watchdogs (the watchdogs' homes in "
        "the ledger's database: missing or unreadable). A watchdog reads the homes when it "
        "is given the hub's homes' root (c.QuotaWatchdog.home_root; docs/disk.md).")
    assert json.loads((await site.get("api/gpus", "admin")).body)["disk"] == {
        "state": "missing", "nodes": []}
    site.write(HOMES.file, homes_read(time.time() - 600))
    disk = disk_section((await site.get("gpus", "admin")).body.decode())
    assert "gpu-host-1: the watchdog's figures of the homes are 10m old, too old to trust " \
        "(more than 15s): the homes' use and the filesystem are left out" in words(disk)
    assert 'class="freshness stale"' in disk and "<table" not in disk
    node = json.loads((await site.get("api/gpus", "admin")).body)["disk"]["nodes"][0]
    assert (node["state"], node["filesystem"], node["homes"]) == ("stale", None, [])
    site.write(HOMES.file, "{half a document")
    assert json.loads((await site.get("api/gpus", "admin")).body)["disk"]["state"] == "missing"


async def test_a_hostile_user_name_is_text_isolated_in_its_line(site):
    site.write(HOMES.file, homes_read(time.time(), user=HOSTILE))
    disk = disk_section((await site.get("gpus", "admin")).body.decode())
    assert "<script>" not in disk
    assert f'<a href="{html.escape(user_link(PREFIX, HOSTILE))}" dir="auto">' in disk
    assert row(disk, "home:gpu-host-1:alice").startswith(f"{HOSTILE} alice 19 GiB")
    doc = json.loads((await site.get("api/gpus", "admin")).body)
    assert doc["disk"]["nodes"][0]["homes"][0]["user"] == HOSTILE  # JSON: the text as is


async def test_two_nodes_from_the_database_each_with_their_homes(tmp_path, monkeypatch):
    async with database_site(tmp_path, monkeypatch) as (site, rows):
        now = time.time()
        rows.write(HOMES, json.dumps(homes_read(now - 1, "gpu-b")), node="gpu-b")
        rows.write(HOMES, json.dumps(homes_read(now - 600, "gpu-a")), node="gpu-a")
        page = (await site.get("gpus", "admin")).body.decode()
        disk = disk_section(page)
        assert re.findall(r'<h3 dir="auto">([^<]*)</h3>', disk) == ["gpu-a", "gpu-b"]
        assert "gpu-a: the watchdog's figures of the homes are 10m old, too old" in words(disk)
        assert re.findall(r'<tr data-key="(home:[^"]*)"', disk) == [
            "home:gpu-b:alice", "home:gpu-b:bob", "home:gpu-b:carol"]
        doc = json.loads((await site.get("api/gpus", "admin")).body)
        assert doc["disk"]["state"] == "fresh"
        assert [(n["node"], n["state"]) for n in doc["disk"]["nodes"]] == [
            ("gpu-a", "stale"), ("gpu-b", "fresh")]
