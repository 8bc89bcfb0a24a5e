"""The admins' host map in Chromium, reached through a real hub login, with real servers.

A real hub, proxy, dockerd (with the fake NVIDIA hook) and the real watchdog process;
only NVML is FAKE, at the host's boundary: the hub declares two fake GPUs, and the
watchdog reads them from tests/fake_nvml_container/pynvml.py, whose process list holds
the host PIDs of the real notebook containers. The hub and the watchdog share the state
folder, as in production, and write the two files the map merges.

The shared hub counts the host's CPUs and memory (host admission is on by default), so
the admin sees what its servers reserve of the notebooks' share of this machine, what
they use (the watchdog's cgroup figures), and each server's room; one GPU held
exclusively (idle: the fake GPU shows 0% utilisation) and one shared by two servers,
each holder's GPU memory; a GPU start waiting in the queue, and a CPU-only start waiting
for room on the host. The page follows a server's stop, the queue's end and a GPU coming
free without a reload, and keyboard focus stays where it was. Its disk section shows a
watchdog's homes document and follows a home filling up. An instructor and a plain
user are refused, on the page and at the API.
"""

from __future__ import annotations

import json
import re
import threading
import time

import pytest
from browser import BIDI_NAME, Visit, assert_reads_in_order, expect, launch
from browser import drawing as element_drawing
from hubs import GPU_HUB_GPUS, GPU_HUB_ID, on_hub, stop_every_server

from harness import Hub, WatchdogProcess, container_for, install_fake_nvml, write_fake_gpus
from spawner.host.admission import HostCapacity
from spawner.usage.documents import HOMES
from spawner.webapp.formatting import size
from spawner.webapp.gpus import ADMINS_ONLY, cpus_text

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

G0, G1 = GPU_HUB_GPUS  # the shared hub's two fake GPUs (tests/hubs.py)
GiB = 2**30
QUOTAS = """\
images:
  pytorch:
    display_name: PyTorch
    image: quota-spawner/pytorch:latest
roles:
  solo:
    description: One whole GPU
    cpus: 0.5
    memory: 512M
    gpus: 1
    queue_timeout: 5m
    images: [pytorch]
  pair:
    description: Half a GPU
    cpus: 0.5
    memory: 512M
    gpus: 1
    gpu_mode: shared
    gpu_share: 2
    gpu_memory: 4G
    images: [pytorch]
  hog:
    description: All of the notebooks' memory, CPU-only
    cpus: 0.5
    memory: {hog_memory}
    queue_timeout: 5m
    images: [pytorch]
assignments:
  default: [solo, pair]
  users:
    gm-hog: [hog]
"""
SOLO = {"profile": "solo"}
PAIR = {"profile": "pair"}
HOG = {"profile": "hog"}
WAIT = 60_000  # ms: what the page may take to show a change (a watchdog cycle, a poll)


def fake_gpus(processes: dict[str, list[list[int]]] | None = None) -> list[dict]:
    """What the host's fake NVML reports: G0 idle, G1 busy; their processes."""
    processes = processes or {}
    return [{"uuid": uuid, "name": "Fake GPU", "memory": 16 * GiB, "utilization": busy,
             "used": sum(p[1] for p in processes.get(uuid, [])),
             "processes": processes.get(uuid, [])}
            for uuid, busy in ((G0, 0), (G1, 40))]


def notebooks_share(docker_client) -> HostCapacity:
    """What the hub counts of this machine: the engine's, with the default reserve and
    ratios (the shared hub sets none)."""
    return HostCapacity.from_engine(docker_client.info())


@pytest.fixture(scope="module")
def setup(gpu_hub, tmp_path_factory, docker_client):
    """The session's 2-GPU hub with this module's table, and the watchdog beside it."""
    host_fake = install_fake_nvml(tmp_path_factory.mktemp("host-nvml"))
    write_fake_gpus(host_fake, fake_gpus())
    users = {name: [] for name in ("carol", "gm-solo", "gm-a", "gm-b", "gm-wait", "gm-hog")}
    # hog fits only on an empty host: beside any server it waits for room
    hog = f"{notebooks_share(docker_client).share.memory // 2**20}M"
    table = QUOTAS.replace("{hog_memory}", hog)
    with on_hub(gpu_hub, table, {"prof-ada": ["cs101-staff"], **users}) as hub:
        # the hub's state folder is the watchdog's too: its usage file lands where the
        # usage service reads it; a short idle hold so the idle GPU is marked in the test
        watchdog = WatchdogProcess(
            hub.workdir, host_fake, "c.WatchdogRules.idle_gpu_hold = 2.0\n", interval=1.0,
            env={"QUOTA_SPAWNER_HUB_ID": GPU_HUB_ID})
        watchdog.start()
        try:
            yield hub, watchdog, host_fake
        finally:
            watchdog.stop()


@pytest.fixture(scope="module")
def browser():
    yield from launch()


@pytest.fixture
def visit(browser, setup):
    hub = setup[0]
    opened: list[Visit] = []

    def make() -> Visit:
        v = Visit(browser, hub)
        opened.append(v)
        return v

    yield make
    for v in opened:
        v.context.close()


def spawn_in_background(hub: Hub, name: str, options: dict) -> threading.Thread:
    """POST a start that waits in the GPU queue (it answers only later)."""
    thread = threading.Thread(target=hub.spawn, args=(name, options), daemon=True)
    thread.start()
    return thread


def gpu_row(page, uuid: str):
    return page.locator(f'#gpus tr[data-key="{uuid}"]')


def holder(row, user: str):
    """The holder's line (keyed by its container's name, which DockerSpawner escapes)."""
    return row.locator("ul.holders li").filter(has=row.page.locator("a", has_text=user))


def drawing(page) -> str:
    """#live as drawn (tests/browser.py's DRAWING)."""
    return element_drawing(page.locator("#live"))


def test_the_admin_sees_the_map_follow_the_servers(setup, visit, docker_client):
    hub, watchdog, host_fake = setup
    share = notebooks_share(docker_client).share
    hub.start_server("gm-solo", SOLO)
    hub.start_server("gm-a", PAIR)
    hub.start_server("gm-b", PAIR)
    pid = {u: container_for(docker_client, u).attrs["State"]["Pid"]
           for u in ("gm-solo", "gm-a", "gm-b")}
    write_fake_gpus(host_fake, fake_gpus({G0: [[pid["gm-solo"], 1 * GiB]],
                                          G1: [[pid["gm-a"], 2 * GiB], [pid["gm-b"], 3 * GiB]]}))
    waiting = spawn_in_background(hub, "gm-wait", SOLO)  # no GPU is free for it

    v = visit()
    v.log_in("admin")
    v.open_service_page("gpus")
    page = v.page
    queued = page.locator("#queue tbody tr").filter(has_text="gm-wait")
    expect(queued).to_contain_text("gm-wait", timeout=WAIT)
    # behind gm-wait: a start ahead of it waiting for room would hold gm-wait up too
    hogging = spawn_in_background(hub, "gm-hog", HOG)  # no room is free for it
    expect(page.locator("header nav a[aria-current=page]")).to_have_text("Host map")
    expect(page).to_have_title("Host map")
    # the host: the three servers' 0.5 CPUs and 512 MiB each, of the notebooks' share
    cpus, memory = page.locator('#host tr[data-key="cpus"]'), \
        page.locator('#host tr[data-key="memory"]')
    expect(cpus.locator("td.reserved")).to_have_text(f"1.5 of {cpus_text(share.cpus)}",
                                                     timeout=WAIT)
    expect(memory.locator("td.reserved")).to_have_text(f"1.5 GiB of {size(share.memory)}")
    expect(cpus.locator("td.share")).to_have_text(f"{cpus_text(share.cpus)} (4x)")
    expect(memory.locator("td.reserved meter")).to_have_attribute("value", str(3 * 2**29))
    servers = page.locator("#host-servers tbody tr")
    expect(servers.locator("td:first-child")).to_have_text(["gm-a", "gm-b", "gm-solo"])
    # what they use: the watchdog's cgroup figures, once it has measured twice
    expect(cpus.locator("td.used")).to_have_text(re.compile(r"^[0-9.]+$"), timeout=WAIT)
    expect(memory.locator("td.used")).to_have_text(re.compile(r"^[0-9.]+ [KMG]iB$"))
    expect(servers.filter(has_text="gm-solo")).to_contain_text(
        re.compile(r"0\.5 reserved · [0-9.]+ used"), timeout=WAIT)
    expect(page.locator("#host-summary")).to_have_text(
        "3 servers hold room on the host; 1 start waiting for room.", timeout=WAIT)
    # the CPU-only start waits for room, and says what is full
    hog_row = page.locator("#queue tbody tr").filter(has_text="gm-hog")
    expect(hog_row.locator("td").nth(3)).to_have_text("none", timeout=WAIT)
    expect(hog_row).to_contain_text("room on the host (the host's memory is fully reserved:")
    g0, g1 = gpu_row(page, G0), gpu_row(page, G1)
    expect(g0).to_contain_text("Exclusive")
    expect(g0.locator("ul.holders li")).to_have_count(1)
    expect(g0.locator("ul.holders li")).to_contain_text("gm-solo · solo · exclusive")
    expect(g1).to_contain_text("Shared · 2 of 2 places taken")
    expect(g1.locator("ul.holders a")).to_have_text(["gm-a", "gm-b"])
    # the watchdog's figures: utilisation, memory, each holder's own memory, idle marked
    expect(g0.locator("td.util")).to_have_text("0%", timeout=WAIT)
    expect(g1.locator("td.util")).to_have_text("40%", timeout=WAIT)
    expect(g1.locator("td.memory")).to_have_text("5 GiB of 16 GiB", timeout=WAIT)
    expect(holder(g1, "gm-b")).to_contain_text("3 GiB on this GPU",
                                                               timeout=WAIT)
    expect(g0.locator(".flag.idle")).to_contain_text("Idle", timeout=WAIT)
    expect(g0.locator(".flag.idle")).to_contain_text("held, no utilisation for")
    expect(g0).to_have_class("gpu exclusive idle")
    expect(g0.locator("li .badge.idle")).to_have_text("idle")
    expect(g1.locator(".flag.idle")).to_have_count(0)
    expect(page.locator("#freshness")).to_contain_text("The watchdog's figures are")
    expect(page.locator("#freshness")).to_have_class("freshness fresh")
    # the queue: gm-wait asks for a whole GPU
    expect(queued).to_contain_text("1 GPU, exclusive")
    expect(queued).to_contain_text("0.5 CPUs, 512 MiB")
    expect(page.locator("#summary")).to_contain_text(
        "2 GPUs in the hub's pool: 1 exclusive, 1 shared, 0 free; 1 idle; "
        "1 start waiting for a GPU.")
    v.shot("gpu-map-busy")
    # the service's drawing (the script blocked) reads as the script's, numbers aside
    server_drawn = v.context.new_page()
    server_drawn.route("**/static/gpus.js*", lambda route: route.abort())
    server_drawn.goto(f"{hub.url}/services/usage/gpus")
    assert drawing(server_drawn) == drawing(page)
    server_drawn.close()

    # live, without a reload: a marker on the window and on the row would not survive one
    page.evaluate("""(uuid) => { window.__sameVisit = true;
        document.querySelector(`#gpus tr[data-key="${uuid}"]`).__sameRow = true; }""", G1)
    focus = holder(g1, "gm-a").locator("a")
    focus.focus()
    hub.stop_server("gm-b")
    expect(g1.locator("ul.holders a")).to_have_text(["gm-a"], timeout=WAIT)
    expect(g1).to_contain_text("Shared · 1 of 2 places taken")
    expect(cpus.locator("td.reserved")).to_have_text(f"1 of {cpus_text(share.cpus)}",
                                                     timeout=WAIT)
    expect(servers.locator("td:first-child")).to_have_text(["gm-a", "gm-solo"])
    assert page.evaluate("() => window.__sameVisit === true")
    assert page.evaluate("""(uuid) => document.querySelector(
        `#gpus tr[data-key="${uuid}"]`).__sameRow === true""", G1)
    expect(focus).to_be_focused()  # the update kept the keyboard where it was

    hub.api("DELETE", "/users/gm-wait/server")  # leave the queue
    hub.api("DELETE", "/users/gm-hog/server")
    waiting.join(60)
    hogging.join(60)
    expect(page.locator("#queue-empty")).to_have_text(
        "Nobody is waiting for a GPU or for room on the host.", timeout=WAIT)
    hub.wait_stopped("gm-wait")
    hub.wait_stopped("gm-hog")
    hub.stop_server("gm-solo")
    expect(g0).to_contain_text("Free", timeout=WAIT)
    expect(g0).to_contain_text("nobody")
    expect(g0.locator(".flag.idle")).to_have_count(0)
    expect(page.locator("#summary")).to_contain_text("0 idle; 0 starts waiting")
    expect(focus).to_be_focused()
    assert page.evaluate("() => window.__sameVisit === true")
    v.shot("gpu-map-after")

    # the pause button, with the keyboard
    page.locator("#pause").focus()
    page.keyboard.press("Enter")
    expect(page.locator("#pause")).to_have_attribute("aria-pressed", "true")
    expect(page.locator("#updated")).to_contain_text("Paused")
    page.keyboard.press("Space")
    expect(page.locator("#pause")).to_have_attribute("aria-pressed", "false")
    expect(page.locator("#updated")).to_contain_text("Live", timeout=WAIT)
    v.check_stayed_home()
    hub.stop_server("gm-a")


def test_the_api_gives_the_admin_the_map(setup, visit, docker_client):
    v = visit()
    v.log_in("admin")
    v.open_service_page("gpus")
    r = v.api("GET", "api/gpus")
    assert r.status == 200, r.text()
    doc = r.json()
    assert [g["uuid"] for g in doc["gpus"]] == [G0, G1]
    assert doc["pool"]["state"] == "ok" and doc["watchdog"]["state"] == "fresh"
    assert abs(doc["generated_at"] - time.time()) < 30
    # the watchdog read the engine's size from docker info, as the hub did
    info = docker_client.info()
    assert doc["host"]["engine"] == {"cpus": info["NCPU"], "memory": info["MemTotal"]}
    assert doc["host"]["state"] == "on" and doc["host"]["usage"] == "fresh"
    assert doc["host"]["cpus"] == info["NCPU"]


@pytest.mark.parametrize("who", ["prof-ada", "carol"])
def test_instructors_and_users_are_refused(setup, visit, who):
    v = visit()
    v.log_in(who)
    v.open_service_page("gpus", status=403)
    expect(v.page.locator("#message")).to_have_text(ADMINS_ONLY)
    expect(v.page.locator("#gpus")).to_have_count(0)
    expect(v.page.locator("header nav")).not_to_contain_text("Host map")
    r = v.api("GET", "api/gpus")
    assert r.status == 403, r.text()
    assert r.json() == {"message": ADMINS_ONLY}
    v.check_stayed_home()


def test_a_holder_named_with_a_bidi_override_reads_in_order(setup, browser, visit):
    """A user named with U+202E (RIGHT-TO-LEFT OVERRIDE) holds a GPU: in their holder's line
    the words after the name (" · pair · shared by up to 2 …") are drawn after it, not
    reversed into it, as the service draws the map (no script) and as the script redraws
    it live."""
    hub = setup[0]
    stop_every_server(hub)
    hub.create_user(BIDI_NAME)
    hub.start_server(BIDI_NAME, PAIR)
    drawn = Visit(browser, hub, java_script_enabled=False)
    live = visit()
    try:
        for v in (drawn, live):
            v.log_in("admin")
            v.open_service_page("gpus")
            line = v.page.locator("#gpus ul.holders li", has_text=BIDI_NAME)
            expect(line).to_contain_text(" · pair · shared by up to 2")
            if v is live:
                expect(v.page.locator("#updated")).to_contain_text("Live", timeout=WAIT)
            assert_reads_in_order(line)
        live.shot("gpu-map-bidi")
        live.check_stayed_home()
    finally:
        drawn.context.close()
        hub.stop_server(BIDI_NAME)


def homes_document(used: int) -> str:
    """A watchdog's homes, as one without home_root in this module does not write them:
    gm-disk's home holds ``used`` of 20 GiB, on a filesystem of 100 GiB that the homes'
    sizes reserve 60 GiB of (a long interval: fresh for minutes)."""
    return json.dumps({
        "version": 1, "node": "gpu-host-1", "at": time.time(), "interval": 60,
        "mechanism": "btrfs", "enforced": True,
        "sentence": "Homes are btrfs subvolumes under /srv/homes, each limited by a qgroup",
        "filesystem": {"path": "/srv/homes", "size": 100 * GiB, "used": 40 * GiB,
                       "free": 55 * GiB, "reserved": 60 * GiB},
        "homes": [{"user": "gm-disk", "name": "gm-disk", "used": used, "limit": 20 * GiB},
                  {"user": None, "name": "gm-old", "used": GiB, "limit": 40 * GiB}]})


def test_the_disk_shows_the_homes_and_follows_one_filling_up(setup, visit):
    hub = setup[0]
    path = hub.workdir / HOMES.file  # the state folder's, where the usage service reads it
    path.write_text(homes_document(5 * GiB))
    try:
        v = visit()
        v.log_in("admin")
        v.open_service_page("gpus")
        disk = v.page.locator('section[aria-labelledby="disk-label"]')
        expect(disk.locator("h2")).to_have_text("Disk")
        expect(disk.locator('tr[data-key="filesystem:gpu-host-1"]')).to_contain_text(
            "60 GiB (60% of the filesystem)")
        home = disk.locator('tr[data-key="home:gpu-host-1:gm-disk"]')
        expect(home).to_contain_text("5 GiB of 20 GiB (25%)")
        expect(home.locator("a")).to_have_text("gm-disk")
        expect(v.page.locator("#updated")).to_contain_text("Live", timeout=WAIT)
        path.write_text(homes_document(19 * GiB))  # filled up: patched in, no reload
        expect(home).to_contain_text("19 GiB of 20 GiB (95%)", timeout=WAIT)
        expect(home).to_contain_text("Nearly full")
        expect(disk).to_contain_text("1 nearly full (90% or more of its size)")
        v.shot("gpu-map-disk")
        v.check_stayed_home()
    finally:
        path.unlink(missing_ok=True)
