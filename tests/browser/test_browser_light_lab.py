"""The light JupyterLab of a class (docs/images.md#a-lighter-jupyterlab-for-a-class).

Two students of the shipped pytorch image with running servers on ``hub``: one in the
group LIGHT_LAB_GROUP, whose servers get ``JUPYTER_CONFIG_PATH`` naming the images'
light lab config through JupyterHub's ``group_overrides`` (as the docs tell an admin),
and one without it. Each logs in through the hub's form in Chromium: the light student
gets the launcher, opens a notebook from it with its kernel idle, and has no Extension
Manager, debugger or log console; the stock student still has them.
"""

from __future__ import annotations

import json
import os

import pytest
from browser import lab_page, launch, log_in
from hubs import LIGHT_LAB_GROUP

from harness import ARTIFACTS, ROOT, container_for, exec_text

# Skipped in the suite until its flakes are understood: in two of four clean-clone runs
# under the suite's load, a kernel never became idle in 120 s, or JupyterLab's theme
# stylesheet failed to load; alone it passes. Run it with QUOTA_SPAWNER_LIGHT_LAB_TEST=1.
pytestmark = [pytest.mark.e2e, pytest.mark.browser, pytest.mark.skipif(
    not os.environ.get("QUOTA_SPAWNER_LIGHT_LAB_TEST"),
    reason="flaky under the suite's load (issue 36's note); QUOTA_SPAWNER_LIGHT_LAB_TEST=1 runs it")]

LIGHT = "light-lia"
STOCK = "light-sam"  # the same role and image, not in the group
TIMEOUT_MS = 120_000
LEFT_OUT = json.loads((ROOT / "images" / "common" / "lab-light.json").read_text())[
    "disabledExtensions"]

# The left-out plugins as a person sees them: a tab in a side bar, a button in the
# notebook's toolbar.
EXTENSION_MANAGER_TAB = ".jp-SideBar [data-id='extensionmanager.main-view']"
DEBUGGER_TAB = ".jp-SideBar [data-id='jp-debugger-sidebar']"
DEBUGGER_BUTTON = ".jp-NotebookPanel-toolbar [data-jp-item-name='debugger-icon']"


@pytest.fixture(scope="module")
def servers(hub, docker_client):
    hub.create_user(LIGHT, ["solo", LIGHT_LAB_GROUP])  # pipeline: 1 CPU, the pytorch image
    hub.create_user(STOCK, ["solo"])
    try:
        for name in (LIGHT, STOCK):
            hub.start_server(name, {"profile": "pipeline", "image": "pytorch"})
        yield
    finally:
        # The notebook servers' own logs, which the hub's does not hold (a kernel's
        # websocket goes through the proxy straight to the server): test-artifacts/.
        ARTIFACTS.mkdir(exist_ok=True)
        for name in (LIGHT, STOCK):
            try:
                log = container_for(docker_client, name).logs(timestamps=True)
            except Exception as exc:  # noqa: BLE001 (a missing container says so in the file)
                log = f"no log: {exc}\n".encode()
            (ARTIFACTS / f"light-lab-{name}.log").write_bytes(log)
        hub.stop_servers([LIGHT, STOCK])


@pytest.fixture(scope="module")
def browser():
    yield from launch()


@pytest.fixture
def page(browser):
    with lab_page(browser) as page:
        # A plugin whose required service was left out fails to activate: JupyterLab says
        # so on the console, not as a page error.
        page.on("console", lambda m: m.type == "error" and "plugin" in m.text.lower()
                and page.errors.append(m.text))
        yield page


def open_lab(page, hub, name: str) -> None:
    log_in(page, hub, name, next_url="")
    page.wait_for_url(f"**/user/{name}/lab**", timeout=TIMEOUT_MS)
    page.wait_for_selector(".jp-Launcher", state="visible", timeout=TIMEOUT_MS)


def disabled(page) -> set[str]:
    data = page.evaluate("JSON.parse(document.getElementById('jupyter-config-data')"
                         ".textContent).disabledExtensions")
    return set(data)


def open_notebook(page) -> None:
    """The launcher's first notebook card, as a student clicks it; until its kernel is idle."""
    page.locator(".jp-LauncherCard[data-category='Notebook']").first.click()
    page.wait_for_selector(".jp-NotebookPanel .jp-Cell", state="visible", timeout=TIMEOUT_MS)
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']",
                           timeout=TIMEOUT_MS)


def test_light_student_has_the_launcher_and_notebooks_without_the_left_out_plugins(
        hub, docker_client, servers, page):
    env = container_for(docker_client, LIGHT).attrs["Config"]["Env"]
    assert "JUPYTER_CONFIG_PATH=/opt/notebook/etc/jupyter-light" in env
    code, out = exec_text(container_for(docker_client, LIGHT),
                          "cat /opt/notebook/etc/jupyter-light/labconfig/page_config.json")
    assert code == 0 and json.loads(out)["disabledExtensions"] == LEFT_OUT, out

    open_lab(page, hub, LIGHT)
    assert set(LEFT_OUT) <= disabled(page)
    assert page.locator(EXTENSION_MANAGER_TAB).count() == 0
    assert page.locator(DEBUGGER_TAB).count() == 0
    # the file browser, the running sessions and our status bar item are still there
    assert page.locator(".jp-SideBar [data-id='filebrowser']").count() == 1
    assert page.locator("#qs-gpu-status").count() == 1
    open_notebook(page)
    assert page.locator(DEBUGGER_BUTTON).count() == 0
    assert page.errors == []


def test_stock_student_keeps_them(hub, servers, page):
    open_lab(page, hub, STOCK)
    assert not set(LEFT_OUT) & disabled(page)
    assert page.locator(EXTENSION_MANAGER_TAB).count() == 1
    assert page.locator(DEBUGGER_TAB).count() == 1
    open_notebook(page)
    page.wait_for_selector(DEBUGGER_BUTTON, timeout=TIMEOUT_MS)
    assert page.errors == []
