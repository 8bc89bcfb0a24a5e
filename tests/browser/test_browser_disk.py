"""What a user whose home is over its size sees in JupyterLab, and how they get out of it
(docs/disk.md#what-a-user-sees): a real hub with homes on a real btrfs filesystem on a loop
device, and the watchdog beside it that keeps each server's home.json current, as in a
deployment.

hd-ana fills 80 MiB of her 128 MiB home, then her role shrinks to 64 MiB (a table edit):
nothing is deleted, and her next server starts over its size. She logs in through the
hub's form in Chromium, reaches JupyterLab, sees the full home in the status bar and in a
notification, and on the GPU page; a save is refused; she deletes the big file in the
file browser (click, Delete, confirm), the bar and the notification say the home has
room again, and the save works.

Needs root (loop devices, mounts): skipped without it.
"""

from __future__ import annotations

import os
import re
import subprocess

import pytest
from browser import lab_page, launch, log_in
from home_hubs import MiB, homes_hub, homes_table, write_in
from loopfs import need_root
from playwright.sync_api import expect

from harness import (
    ARTIFACTS,
    WatchdogProcess,
    container_for,
    install_fake_nvml,
    write_fake_nvml_state,
)
from spawner.contract import HUB_LABEL

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

NAME = "hd-ana"
PREFIX = f"qshd{os.getpid()}"
BIG_FILE = "old-checkpoint.bin"
WAIT_MS = 120_000
ANA_BIG = f"    {NAME}: [big]\n"


def table(ana: str = "") -> str:
    return homes_table(ana)


@pytest.fixture(scope="module")
def setup(docker_client, tmp_path_factory):
    """(the hub, the homes' root): hd-ana's server running with her home over its size,
    and a watchdog that reads the homes each second."""
    need_root()
    work = tmp_path_factory.mktemp("browser-disk")
    with homes_hub(work / "hub", docker_client, "btrfs", name="browser-disk",
                   quota_text=table(ANA_BIG), prefix=PREFIX, users=(NAME,)) as (hub, root):
        hub.start_server(NAME, {"profile": "big", "image": "pytorch"})
        written = write_in(container_for(docker_client, NAME), f"/home/jovyan/{BIG_FILE}",
                           80 * MiB)
        assert written == (80 * MiB, ""), written
        hub.quota_file.write_text(table())  # the grant ends: 64 MiB
        hub.stop_server(NAME)
        hub.start_server(NAME, {"profile": "small", "image": "pytorch"})
        hub_id = container_for(docker_client, NAME).labels[HUB_LABEL]
        for folder in ("nvml", "watchdog"):
            (work / folder).mkdir()
        fake = install_fake_nvml(work / "nvml")
        write_fake_nvml_state(fake, {"gpus": []})
        watchdog = WatchdogProcess(work / "watchdog", fake, (
            f"c.QuotaWatchdog.home_root = {str(root)!r}\n"
            "c.QuotaWatchdog.home_mechanism = 'btrfs'\n"
            f"c.QuotaWatchdog.home_use_dir = {str(hub.workdir / 'home-use')!r}\n"),
            interval=1.0, env={"QUOTA_SPAWNER_HUB_ID": hub_id, "QUOTA_SPAWNER_USAGE_DB": ""})
        watchdog.start()
        try:
            yield hub, root
        finally:
            watchdog.stop()
            ARTIFACTS.mkdir(exist_ok=True)
            (ARTIFACTS / "watchdog-browser-disk.log").write_text(watchdog.log())


@pytest.fixture(scope="module")
def browser():
    yield from launch()


@pytest.fixture
def page(browser):
    with lab_page(browser) as page:
        yield page


# A save as JupyterLab makes it: the contents API with the browser's cookie and XSRF token.
SAVE = """async ([url, text]) => {
  const cookie = document.cookie.split('; ').find(c => c.startsWith('_xsrf='));
  const r = await fetch(url, {method: 'PUT', credentials: 'same-origin',
    headers: {'Content-Type': 'application/json',
              'X-XSRFToken': cookie ? decodeURIComponent(cookie.slice(6)) : ''},
    body: JSON.stringify({type: 'file', format: 'text', content: text})});
  return r.status;
}"""
NOTES = "notes\n" * 200_000  # 1.1 MiB


def save(page, hub) -> int:
    return page.evaluate(SAVE, [f"{hub.url}/user/{NAME}/api/contents/notes.txt", NOTES])


def test_a_full_home_is_shown_and_freed_in_jupyterlab(setup, page):
    hub, root = setup
    log_in(page, hub, NAME, next_url="")
    page.wait_for_url(f"**/user/{NAME}/lab**", timeout=WAIT_MS)

    # the status bar and the notification say it, with how to free room
    item = page.locator("#qs-home-status")
    expect(item).to_be_visible(timeout=WAIT_MS)
    expect(item).to_have_text(re.compile(r"^Home full 80(\.\d)?/64 MiB$"))
    assert "writes are refused until files are deleted" in item.get_attribute("title")
    assert "delete files in the file browser" in item.get_attribute("title")
    notice = page.get_by_text("Your home is full.")
    expect(notice).to_be_visible(timeout=WAIT_MS)
    expect(notice).to_contain_text("~/.cache/pip")
    expect(page.get_by_text("Your home is full.")).to_have_count(1)  # once
    assert page.locator("#qs-gpu-status").is_hidden()  # no GPU: no GPU item
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "browser-disk-full.png"))

    # the GPU page says it too
    usage = page.context.new_page()
    usage.goto(f"{hub.url}/user/{NAME}/gpu")
    home = usage.locator("#home")
    expect(home).to_be_visible(timeout=WAIT_MS)
    expect(home).to_contain_text(re.compile(r"Home: 80 MiB of 64 MiB · 12\d% · full"))
    expect(home).to_contain_text("nothing was deleted")
    expect(home).to_contain_text("Delete files you do not need")
    usage.close()

    assert save(page, hub) == 500  # full: JupyterLab's save is refused

    # the file browser (open at the start): click the file, Delete, confirm
    entry = page.locator(".jp-DirListing-content .jp-DirListing-item", has_text=BIG_FILE)
    expect(entry).to_be_visible(timeout=WAIT_MS)
    entry.click()
    page.keyboard.press("Delete")
    page.locator(".jp-Dialog").get_by_role("button", name="Delete").click()
    expect(entry).to_have_count(0, timeout=WAIT_MS)
    # btrfs counts the freed bytes at its next commit (30 s at most); commit now
    subprocess.run(["btrfs", "filesystem", "sync", str(root)], check=True, timeout=60)

    # the watchdog's next cycle: the bar and the notification follow, and saving works
    expect(item).to_have_text(re.compile(r"^Home \d+(\.\d)?/64 MiB$"), timeout=WAIT_MS)
    expect(page.get_by_text("Your home has room again: saving works.")).to_be_visible()
    assert save(page, hub) in (200, 201)  # 200: the refused save left part of it
    (saved,) = root.glob("*/notes.txt")  # her home, under its escaped name
    assert saved.read_text() == NOTES
    page.screenshot(path=str(ARTIFACTS / "browser-disk-freed.png"))
    assert page.errors == []
