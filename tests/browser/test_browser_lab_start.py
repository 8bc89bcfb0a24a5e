"""What JupyterLab opens at the start, with the early-launcher plugin of our lab extension
(labextension/src/launcher.ts, docs/jupyterlab-status-bar.md#the-launcher-at-the-start).

One student of the shipped images with a running server (as after a class pre-warm), a
fresh Chromium context and an empty workspace per test: the login shows one launcher,
opened before JupyterLab's first workspace save (its own launcher comes only after that
save), also in a named workspace; a /lab/tree/<notebook> URL and a workspace with a tab
get no launcher; with the plugin disabled JupyterLab's own launcher still comes, once.
"""

from __future__ import annotations

import time
from urllib.parse import quote

import pytest
import requests
from browser import launch, log_in
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

from harness import ARTIFACTS, container_for, exec_text

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

NAME = "labstart-ana"
NOTEBOOK = "start here.ipynb"  # a space: the tree URL is encoded
PLUGIN = "@quota-spawner/gpu-status:early-launcher"
TIMEOUT_MS = 120_000
SETTLE_S = 3.0  # JupyterLab's first workspace save comes well within this
AFTER_SAVE_S = 1.0  # its own launcher, when it opens one, comes 0.1 s after that save

# In every document: the first frame with a launcher on screen and the first workspace
# save (a PUT to api/workspaces), on the page's clock.
INIT_SCRIPT = r"""
(() => {
  const T = window.__qsStart = {};
  const look = () => {
    const el = document.querySelector('.jp-Launcher');
    const box = el && el.getBoundingClientRect();
    if (box && box.width > 0 && box.height > 0) T.launcher = performance.now();
    else requestAnimationFrame(look);
  };
  requestAnimationFrame(look);
  const fetch0 = window.fetch;
  window.fetch = function (input, init) {
    const url = typeof input === 'string' ? input : (input && input.url) || '';
    const method = ((init && init.method) || (input && input.method) || 'GET').toUpperCase();
    if (T.save === undefined && method === 'PUT' && url.includes('/api/workspaces/')) {
      T.save = performance.now();
    }
    return fetch0.apply(this, arguments);
  };
})();
"""


@pytest.fixture(scope="module")
def server(hub):
    """NAME's running server; yields a session that calls it with NAME's token."""
    hub.create_user(NAME, ["solo"])  # pipeline: 1 CPU, the pytorch image
    hub.start_server(NAME, {"profile": "pipeline", "image": "pytorch"})
    session = requests.Session()
    session.headers["Authorization"] = f"token {hub.user_token(NAME)}"
    try:
        yield session
    finally:
        hub.api("DELETE", f"/users/{NAME}/server")


def api(hub, session, method: str, path: str, **kwargs):
    r = session.request(method, f"{hub.url}/user/{NAME}/{path}", timeout=30, **kwargs)
    assert r.status_code < 300, f"{method} {path}: {r.status_code} {r.text[:300]}"
    return r


@pytest.fixture
def empty_workspace(hub, server):
    """No saved workspace: JupyterLab starts as on a first login."""
    for space in api(hub, server, "GET", "lab/api/workspaces").json()["workspaces"]["ids"]:
        api(hub, server, "DELETE", f"lab/api/workspaces/{space}")
    return server


@pytest.fixture(scope="module")
def browser():
    yield from launch()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.add_init_script(INIT_SCRIPT)
    page = context.new_page()
    page.errors = []
    page.on("pageerror", lambda e: page.errors.append(str(e)))
    yield page
    context.close()


def main_tabs(page) -> list[str]:
    """The labels of the main area's tabs, in order."""
    return page.locator("#jp-main-dock-panel .lm-TabBar-tabLabel").all_inner_texts()


def settled_tabs(page) -> list[str]:
    """The main area's tabs once JupyterLab's start is over: its first workspace save (the
    route, and JupyterLab's own launcher, follow it) and AFTER_SAVE_S more; SETTLE_S when
    no save comes (the tests that need one say so)."""
    try:
        page.wait_for_function("() => window.__qsStart.save !== undefined",
                               timeout=SETTLE_S * 1000)
    except PlaywrightTimeoutError:
        pass
    time.sleep(AFTER_SAVE_S)
    return main_tabs(page)


def create_notebook(hub, server) -> None:
    api(hub, server, "PUT", f"api/contents/{quote(NOTEBOOK)}", json={
        "type": "notebook", "format": "json",
        "content": {"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}})


def log_in_to_lab(page, hub) -> None:
    """The hub's login form as a person types it; a running server: the hub sends the
    browser on to JupyterLab."""
    log_in(page, hub, NAME, next_url="")
    page.wait_for_url(f"**/user/{NAME}/lab**", timeout=TIMEOUT_MS)


def test_login_shows_one_launcher_opened_before_the_workspace_save(hub, empty_workspace,
                                                                   page):
    log_in_to_lab(page, hub)
    page.wait_for_selector(".jp-Launcher", state="visible", timeout=TIMEOUT_MS)
    assert settled_tabs(page) == ["Launcher"]
    assert page.locator(".jp-Launcher").count() == 1
    times = page.evaluate("window.__qsStart")
    # JupyterLab's own launcher waits for the route, which waits for this save.
    assert times.get("save") is not None, "no workspace save seen"
    assert times["launcher"] < times["save"], times
    assert page.errors == []
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "lab-start-launcher.png"))


def test_named_workspace_shows_one_launcher(hub, empty_workspace, page):
    """/lab/workspaces/<name>: no tree path, an empty main area."""
    log_in(page, hub, NAME, next_url=f"/user/{NAME}/lab/workspaces/lab2")
    page.wait_for_selector(".jp-Launcher", state="visible", timeout=TIMEOUT_MS)
    assert settled_tabs(page) == ["Launcher"]
    times = page.evaluate("window.__qsStart")
    assert times.get("save") is not None and times["launcher"] < times["save"], times
    assert page.errors == []


def test_tree_url_opens_the_notebook_and_no_launcher(hub, empty_workspace, page):
    create_notebook(hub, empty_workspace)
    log_in(page, hub, NAME, next_url=f"/user/{NAME}/lab/tree/{quote(NOTEBOOK)}")
    page.wait_for_selector(".jp-NotebookPanel", state="visible", timeout=TIMEOUT_MS)
    assert settled_tabs(page) == [NOTEBOOK]
    assert page.locator(".jp-Launcher").count() == 0
    assert page.errors == []


def test_workspace_with_a_tab_restores_it_and_no_launcher(hub, empty_workspace, page):
    create_notebook(hub, empty_workspace)
    log_in(page, hub, NAME, next_url=f"/user/{NAME}/lab/tree/{quote(NOTEBOOK)}")
    page.wait_for_selector(".jp-NotebookPanel", state="visible", timeout=TIMEOUT_MS)
    # until the workspace on the server holds the notebook's tab
    deadline = time.monotonic() + 30
    while f"notebook:{NOTEBOOK}" not in api(hub, empty_workspace, "GET",
                                            "lab/api/workspaces/default").text:
        assert time.monotonic() < deadline, "the notebook's tab was never saved"
        time.sleep(0.2)
    page.goto(f"{hub.url}/user/{NAME}/lab")
    page.wait_for_selector(".jp-NotebookPanel", state="visible", timeout=TIMEOUT_MS)
    assert settled_tabs(page) == [NOTEBOOK]
    assert page.locator(".jp-Launcher").count() == 0
    assert page.errors == []


def test_disabled_plugin_leaves_jupyterlabs_own_launcher(hub, docker_client, empty_workspace,
                                                         page):
    """The off switch in the docs: JupyterLab then opens its launcher, once, after the
    workspace save."""
    container = container_for(docker_client, NAME)
    command = f"jupyter labextension {{}} --level=user {PLUGIN}"
    code, out = exec_text(container, command.format("disable"))
    assert code == 0, out
    try:
        log_in_to_lab(page, hub)
        assert PLUGIN in page.evaluate(
            "JSON.parse(document.getElementById('jupyter-config-data').textContent)"
            ".disabledExtensions")
        page.wait_for_selector(".jp-Launcher", state="visible", timeout=TIMEOUT_MS)
        assert settled_tabs(page) == ["Launcher"]
        times = page.evaluate("window.__qsStart")
        assert times.get("save") is not None and times["launcher"] > times["save"], times
        assert page.locator("#qs-gpu-status").count() == 1  # the package's other plugin
    finally:
        code, out = exec_text(container, command.format("enable"))
        assert code == 0, out
