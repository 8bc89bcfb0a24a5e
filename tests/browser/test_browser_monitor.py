"""The GPU page ({base_url}gpu) in Chromium, on a real ``jupyter server`` with fake GPUs."""

from __future__ import annotations

import math
import re
import time

import pytest
from browser import CHROMIUM, CHROMIUM_ARGS
from playwright.sync_api import expect, sync_playwright

from harness import ARTIFACTS
from monitor_server import TOKEN, GiB, MonitorServer, gpu_state, start_servers

pytestmark = pytest.mark.browser

LIMIT = 8 * GiB
ARGS = ("--GpuMonitor.interval=0.2", "--GpuMonitor.busy_window=2")


def state(used: int, utilization: int = 40) -> dict:
    return {"gpus": [gpu_state(used, utilization, memory=16 * GiB, temperature=57,
                               power=210_000, processes=[[4321, GiB]])]}


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gpu-page")
    gpu = MonitorServer(tmp / "gpu", state(LIMIT // 2),
                        {"NVIDIA_VISIBLE_DEVICES": "GPU-a", "GPU_MEMORY_LIMIT": str(LIMIT)},
                        ARGS, base_url="/user/ana/")
    void = MonitorServer(tmp / "void", state(0), {"NVIDIA_VISIBLE_DEVICES": "void"}, ARGS,
                         base_url="/user/bo/")
    start_servers(gpu, void)
    yield {"gpu": gpu, "void": void}
    for server in (gpu, void):
        server.stop()


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


class Page:
    """A fresh page that records every request it makes and every script error."""

    def __init__(self, browser, server: MonitorServer):
        self.server = server
        self.context = browser.new_context(viewport={"width": 1100, "height": 800})
        self.page = self.context.new_page()
        self.requests: list[str] = []
        self.errors: list[str] = []
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("console", lambda m: self.errors.append(m.text)
                     if "Content Security Policy" in m.text else None)

    def open(self) -> None:
        self.page.goto(f"{self.server.url}gpu?token={TOKEN}")  # the token in the URL logs in

    def check_stayed_home(self) -> None:
        assert self.requests, "no requests recorded"
        outside = [u for u in self.requests if not u.startswith(self.server.origin + "/")]
        assert outside == [], f"requests that left the origin: {outside}"
        assert any("/api/gpu/metrics" in u for u in self.requests)
        assert self.errors == []


@pytest.fixture
def open_page(browser):
    pages = []

    def make(server: MonitorServer) -> Page:
        page = Page(browser, server)
        pages.append(page)
        page.open()
        return page

    yield make
    for page in pages:
        page.context.close()


def test_gpu_page_normal_then_warning(servers, open_page):
    server = servers["gpu"]
    server.write_state(state(LIMIT // 2))
    server.wait_for(lambda b: b["gpus"][0]["memory_used"] == LIMIT // 2)
    p = open_page(server)
    page = p.page
    card = page.locator("section.gpu[data-uuid=GPU-a]")
    expect(card).to_be_visible()
    fill = card.locator(".bar .fill")
    expect(fill).to_have_attribute("style", re.compile(r"width:\s*50%"))
    assert fill.evaluate("e => e.style.width") == "50%"
    expect(card.locator(".memory-text")).to_have_text(
        "Memory: 4.0 GiB of 8.0 GiB (your limit) · 50%")
    expect(card).to_contain_text("40%")  # utilization
    expect(card).to_contain_text("57 °C")
    expect(card).to_contain_text("210 / 700 W")
    banner = page.locator("#banner")
    expect(banner).to_be_hidden()
    expect(page.locator("#state")).to_be_hidden()
    # sparklines: a utilization and a memory line, with points once samples come in
    expect(card.locator("svg.spark polyline")).to_have_count(2)
    for kind in ("util", "mem"):
        line = card.locator(f"svg.spark.{kind} polyline")
        expect(line).to_have_attribute("points", re.compile(r"^[\d.]+,[\d.]+( [\d.]+,[\d.]+)+$"))
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "gpu-page-normal.png"), full_page=True)

    # memory reaches 93% of the limit while the page is open: the banner shows
    server.write_state(state(math.ceil(0.93 * LIMIT)))
    expect(banner).to_be_visible(timeout=2_000)
    expect(banner).to_have_text("GPU memory at 93% of your 8 GiB limit")
    expect(fill).to_have_attribute("style", re.compile(r"width:\s*93%"))
    expect(card).to_have_class(re.compile(r"\bwarning\b"))
    page.screenshot(path=str(ARTIFACTS / "gpu-page-warning.png"), full_page=True)

    # 89%: below the threshold, the banner goes away again
    server.write_state(state(math.floor(0.89 * LIMIT)))
    expect(banner).to_be_hidden(timeout=2_000)
    expect(fill).to_have_attribute("style", re.compile(r"width:\s*89%"))
    expect(card).not_to_have_class(re.compile(r"\bwarning\b"))
    p.check_stayed_home()


def test_gpu_page_without_a_gpu(servers, open_page):
    p = open_page(servers["void"])
    page = p.page
    expect(page.locator("#state")).to_have_text("No GPU assigned to this server.")
    expect(page.locator("#state")).to_be_visible()
    expect(page.locator("#banner")).to_be_hidden()
    expect(page.locator("#updated")).to_contain_text("Updated")
    assert page.locator("section.gpu").count() == 0
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "gpu-page-no-gpu.png"), full_page=True)
    p.check_stayed_home()


REASON = ("bob needs 1 GPU for the role 'urgent-debug' (priority 1000000), which outranks "
          "this server's role 'gpu-training' (priority 300000).")


def notice(deadline_in: float, **fields) -> dict:
    now = time.time()
    return {"version": 1, "by": "bob", "by_role": "urgent-debug", "role": "gpu-training",
            "gpus": ["GPU-a"], "reason": REASON, "signalled_at": now + deadline_in - 120,
            "deadline": now + deadline_in, "grace_period": 120.0, **fields}


def test_gpu_page_preemption_banner(servers, open_page):
    """The hub's notice: a banner with a live countdown; names and reason as text."""
    server = servers["gpu"]
    server.write_state(state(LIMIT // 2))
    server.write_notice(notice(113))
    try:
        p = open_page(server)
        page = p.page
        banner = page.locator("#preemption")
        expect(banner).to_be_visible()
        expect(banner).to_have_attribute("role", "alert")
        countdown = banner.locator(".preempt-countdown")
        expect(countdown).to_have_text(
            re.compile(r"^This server will be stopped in 1:5\d \(at .+\)\.$"))
        expect(banner.locator(".preempt-who")).to_have_text(
            "bob needs this server's GPU for the role urgent-debug.")
        expect(banner.locator(".preempt-reason")).to_have_text(REASON)
        expect(banner.locator(".preempt-todo")).to_have_text(
            "Save your work now; kernels that called on_preempt() are saving a checkpoint. "
            "Your home folder is kept.")
        # above the page's title, and the GPU card is still there
        assert banner.bounding_box()["y"] < page.locator("h1").bounding_box()["y"]
        expect(page.locator("section.gpu[data-uuid=GPU-a]")).to_be_visible()
        # live: it counts down between polls
        first = countdown.text_content()
        expect(countdown).not_to_have_text(first, timeout=3_000)
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "gpu-page-preemption.png"), full_page=True)

        # user and role names and the reason are text, never HTML
        server.write_notice(notice(113, by="eve<img src=x onerror=alert(1)>",
                                   by_role="<i>r</i>", reason="<b>not bold</b>"))
        expect(banner.locator(".preempt-reason")).to_have_text("<b>not bold</b>",
                                                               timeout=3_000)
        expect(banner.locator(".preempt-who")).to_have_text(
            "eve<img src=x onerror=alert(1)> needs this server's GPU for the role <i>r</i>.")
        assert banner.locator("b, i, img").count() == 0

        # the deadline has passed: the stop is under way
        server.write_notice(notice(-10))
        expect(countdown).to_have_text("This server is being stopped now.", timeout=3_000)

        # withdrawn: the hub deletes the notice, the banner goes
        server.clear_notice()
        expect(banner).to_be_hidden(timeout=3_000)
        p.check_stayed_home()
    finally:
        server.clear_notice()


def test_gpu_page_needs_login(servers, browser):
    server = servers["gpu"]
    context = browser.new_context()
    try:
        page = context.new_page()
        page.goto(f"{server.url}gpu")
        assert "/login" in page.url
        assert page.locator("section.gpu").count() == 0
    finally:
        context.close()
