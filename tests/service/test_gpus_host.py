"""The host map's host section and its CPU-only waits, page and API, without a hub or a
browser: the hub's pool file with host admission on (or off) and the watchdog's usage
file with its host figures, written into a state folder as the hub and the watchdog
write them (tests/map_states.py builds both). The page's other parts are
test_gpus.py's; in a browser, live, test_browser_gpu_map.py."""

from __future__ import annotations

import json
import re
import time

import pytest
from map_site import HOSTILE, HOSTILE_ROLE, row_of, state_site, words
from map_states import G, busy_host, leave_all, pool
from map_states import host_watched as watched

from spawner.gpu.pool import Server
from spawner.gpu.queue import STRICT_FIFO
from spawner.gpu.snapshot import pool_snapshot
from spawner.quota.model import Role
from spawner.usage.documents import GPU_USAGE, GPUS
from spawner.watchdog.app import gpu_usage_snapshot
from spawner.watchdog.rules import IncidentBook
from spawner.webapp.gpus import ADMINS_ONLY


@pytest.fixture
async def site(tmp_path, monkeypatch):
    async with state_site(tmp_path, monkeypatch) as found:
        yield found


async def write_host(site, watchdog_age: float | None = 1.0, admission: bool = True,
                     hostile: bool = False) -> None:
    """alice (a GPU) and bob hold room; carol (CPU-only) and dave (a GPU) wait for memory
    (map_states.busy_host); or, with admission off, alice holds a GPU. The watchdog
    measured ``watchdog_age`` seconds ago (None: no file)."""
    now = time.time()
    if admission:
        p = await busy_host()
        if hostile:
            p.servers["quota-bob"] = Server(HOSTILE, HOSTILE_ROLE, now)
            p.queue.ticket("quota-carol").user = HOSTILE
    else:
        p = pool(admission=False)
    site.write(GPUS.file, pool_snapshot(p, now))
    leave_all(p)
    if watchdog_age is not None:
        site.write(GPU_USAGE.file,
                   gpu_usage_snapshot(watched(now - watchdog_age), IncidentBook(), 5.0))


def section(page: str) -> str:
    found = re.search(r'<section aria-labelledby="host-label">(.*?)</section>', page, re.S)
    assert found
    return found.group(1)


async def test_the_admin_sees_what_is_reserved_and_used_of_the_host(site):
    await write_host(site)
    r = await site.get("gpus", "admin")
    assert r.code == 200
    page = r.body.decode()
    assert "<title>Host map</title>" in page and "<h1>Host map</h1>" in page
    # the host comes first, then the GPUs, then the queue
    assert page.index('id="host-label"') < page.index('id="gpus-label"') \
        < page.index('id="queue-label"')
    host = words(section(page))
    assert host.startswith("Host 2 servers hold room on the host; 2 starts waiting for "
                           "room.")
    assert words(row_of(page, "cpus")) == "CPUs 0.75 of 60 0.25 60 (4x) 16 1"
    assert words(row_of(page, "memory")) == "Memory 59 GiB of 60 GiB 1.5 GiB 60 GiB (1x) " \
        "64 GiB 4 GiB"
    assert '<meter min="0" max="60" value="0.75"></meter>' in page
    assert f'<meter min="0" max="{60 * G}" value="{59 * G}"></meter>' in page
    # each server's room, with what it uses
    assert words(row_of(page, "quota-alice")) == \
        "alice solo 0.5 reserved · 0.25 used 2 GiB reserved · 1 GiB used"
    assert words(row_of(page, "quota-bob")) == \
        "bob big 0.25 reserved 57 GiB reserved · 512 MiB used"  # no CPU rate yet
    # the queue: a CPU-only start asks for no GPU, and says what it waits for
    carol = words(row_of(page, "quota-carol"))
    assert carol.startswith("1 carol small none 0.5 CPUs, 2 GiB 5 ")
    assert carol.endswith("room on the host (the host's memory is fully reserved: 61 GiB "
                          "of 60 GiB) –")
    dave = words(row_of(page, "quota-dave"))
    assert dave.startswith("2 dave solo 1 GPU, exclusive 0.5 CPUs, 2 GiB 0 ")
    assert "room on the host (the host's memory" in dave
    assert ("2 GPUs in the hub's pool: 1 exclusive, 0 shared, 1 free; 0 idle; 0 starts "
            "waiting for a GPU.") in words(page)
    assert "Reservations, holders and queue: the hub's pool as it last changed" \
        in words(page)


async def test_the_api_gives_the_host_as_json(site):
    await write_host(site)
    r = await site.get("api/gpus", "admin")
    assert r.code == 200
    doc = json.loads(r.body)
    host = doc["host"]
    assert (host["state"], host["usage"]) == ("on", "fresh")
    assert host["reserved"] == {"cpus": 0.75, "memory": 59 * G}
    assert host["share"] == {"cpus": 60, "memory": 60 * G}
    assert host["used"] == {"cpus": 0.25, "memory": G + G // 2, "servers": 2}
    assert host["engine"] == {"cpus": 16, "memory": 64 * G}
    assert [s["owner"] for s in host["servers"]] == ["quota-alice", "quota-bob"]
    assert doc["summary"]["waiting_for_room"] == 2
    carol = doc["queue"][0]
    assert (carol["gpus"], carol["mode"], carol["cpus"], carol["memory"]) == (
        0, "", 0.5, 2 * G)
    assert carol["waiting_for"] == "the host's memory is fully reserved: 61 GiB of 60 GiB"


async def test_stale_figures_leave_out_what_is_used_not_what_is_reserved(site):
    await write_host(site, watchdog_age=60)
    page = (await site.get("gpus", "admin")).body.decode()
    assert words(row_of(page, "cpus")) == "CPUs 0.75 of 60 – 60 (4x) 16 1"
    assert words(row_of(page, "quota-alice")) == "alice solo 0.5 reserved 2 GiB reserved"
    doc = json.loads((await site.get("api/gpus", "admin")).body)
    assert doc["host"]["usage"] == "stale" and doc["host"]["used"] is None


async def test_with_admission_off_the_map_says_so_in_one_sentence(site):
    await write_host(site, admission=False)
    page = (await site.get("gpus", "admin")).body.decode()
    host = words(section(page))
    assert host.startswith("Host Host admission is off: the hub starts servers without "
                           "counting the host's CPUs and memory, so nothing is reserved; "
                           "what the servers use is the watchdog's.")
    # what is used, and what the engine has, still come from the watchdog
    assert words(row_of(page, "cpus")) == "CPUs – 0.25 – 16 –"
    assert words(row_of(page, "memory")) == "Memory – 1.5 GiB – 64 GiB –"
    assert "<meter" not in section(page), section(page)
    assert 'id="host-servers' not in page
    doc = json.loads((await site.get("api/gpus", "admin")).body)
    assert doc["host"]["state"] == "off" and doc["host"]["servers"] == []


async def test_hostile_names_in_the_host_section_are_escaped(site):
    await write_host(site, hostile=True)
    page = (await site.get("gpus", "admin")).body.decode()
    assert "<script>alert" not in page and "<img src=x" not in page
    assert words(row_of(page, "quota-bob")).startswith(f"{HOSTILE} {HOSTILE_ROLE} 0.25")
    assert words(row_of(page, "quota-carol")).startswith(f"1 {HOSTILE} small none")
    doc = json.loads((await site.get("api/gpus", "admin")).body)
    assert doc["host"]["servers"][1]["user"] == HOSTILE


async def test_the_wait_queue_says_its_strategy_and_why_each_start_waits(site):
    await write_host(site)  # BestEffortFIFO, the default
    page = (await site.get("gpus", "admin")).body.decode()
    assert words(re.search(r'<p id="queue-policy">(.*?)</p>', page).group(1)) == (
        "Queue: BestEffortFIFO, fair between users. Served by priority, then a user's "
        "first server before anyone's second, then arrival; a start that fits is not "
        "held up by an older one that does not.")
    # StrictFIFO: a start that fits, held behind an older one, is not given its figures
    p = pool(gpus=0)
    p.queue.strategy = STRICT_FIFO
    for user, memory in (("alice", 58), ("bob", 4), ("carol", 1)):
        p.join(f"quota-{user}", Server(user, "r", time.time()),
               Role("r", 1, memory * G, ("p",)))
    site.write(GPUS.file, pool_snapshot(p, time.time()))
    leave_all(p)
    page = (await site.get("gpus", "admin")).body.decode()
    assert words(re.search(r'<p id="queue-policy">(.*?)</p>', page).group(1)).startswith(
        "Queue: StrictFIFO, fair between users. Served by priority")
    assert words(row_of(page, "quota-bob")).endswith(
        "room on the host (the host's memory is fully reserved: 62 GiB of 60 GiB) –")
    assert words(row_of(page, "quota-carol")).endswith(
        "room on the host (this start would fit, but the queue is StrictFIFO and an older "
        "start waits ahead of it for room: bob's (role 'r'), for which the host's memory "
        "is fully reserved: 62 GiB of 60 GiB) –")
    doc = json.loads((await site.get("api/gpus", "admin")).body)
    assert (doc["queue_strategy"], doc["queue_fair"]) == ("StrictFIFO", True)


async def test_the_host_is_for_admins_only(site):
    await write_host(site)
    for who in ("prof-ada", "carol", "finance"):
        r = await site.get("gpus", who)
        assert r.code == 403 and ADMINS_ONLY in words(r.body.decode())
        assert "quota-bob" not in r.body.decode() and "reserved" not in r.body.decode()
        r = await site.get("api/gpus", who)
        assert r.code == 403 and json.loads(r.body) == {"message": ADMINS_ONLY}
