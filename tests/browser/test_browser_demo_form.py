"""`make demo`'s spawn form in Chromium, on a hub counted as the machine the demo runs on
(``demo_hub``: 2 CPUs and 23.5 GiB, no GPUs; its notebooks may reserve 7.2 CPUs and
21.2 GiB). bob walks the shipped table's form as it comes (the default selection) to
JupyterLab; a role that can never start here cannot be picked, and a start of it ends
on a page that says why (docs/quota-table.md#the-spawn-form).
"""

from __future__ import annotations

import time

import pytest
from browser import expect, launch, visits, wait_for_lab
from hubs import SHIPPED_QUOTAS, TOO_BIG_MARK, TOO_BIG_QUOTAS, TOO_BIG_REFUSAL, on_hub

from harness import container_for, containers

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

GiB = 2**30
START = "form#spawn_form button[type=submit]"


@pytest.fixture(scope="module")
def browser():
    yield from launch()


@pytest.fixture
def visit(browser, demo_hub):
    yield from visits(browser, demo_hub)


def choice(page, key: str):
    return page.locator(f"input[name=choice][value='{key}']")


def test_bob_starts_the_shipped_forms_default_and_reaches_jupyterlab(demo_hub, visit,
                                                                     docker_client):
    with on_hub(demo_hub, SHIPPED_QUOTAS, {"bob": ["ml-platform"]}):
        v = visit()
        v.log_in("bob")
        v.page.click("#start")
        v.page.wait_for_url("**/hub/spawn**")
        page = v.page
        # as shipped: senior-engineer x 2 images, pipeline, gpu-training x 2
        assert page.locator(".quota-choice").count() == 5
        expect(page.locator("input[name=choice]:checked")).to_have_value(
            "senior-engineer/pytorch")
        for image in ("pytorch", "paddle"):
            expect(choice(page, f"gpu-training/{image}")).to_be_disabled()
        gpu = page.locator(".quota-choice[data-role=gpu-training][data-image=pytorch]")
        expect(gpu).to_contain_text("this hub has no GPUs")
        expect(gpu).to_contain_text("can never start here: one server's 32 GiB of memory")
        v.shot("demo-form-bob")
        started = time.monotonic()
        page.click(START)
        wait_for_lab(page, "demo-form-bob")
        print(f"bob: Start to JupyterLab's launcher in {time.monotonic() - started:.2f} s")
        c = container_for(docker_client, "bob")
        assert c.labels["quota-spawner.role"] == "senior-engineer"
        assert c.attrs["HostConfig"]["Memory"] == 16 * GiB


def test_a_role_that_can_never_start_cannot_be_picked_and_its_refusal_is_on_the_page(
        demo_hub, visit, docker_client):
    name = "nina"
    with on_hub(demo_hub, TOO_BIG_QUOTAS, {name: []}):
        v = visit()
        v.log_in(name)
        page = v.page
        page.goto(f"{demo_hub.url}/hub/spawn")
        workstation = choice(page, "workstation/pytorch")
        expect(workstation).to_be_disabled()
        expect(choice(page, "pipeline/pytorch")).to_be_checked()
        row = page.locator(".quota-choice[data-role=workstation]")
        expect(row.locator(".quota-host")).to_have_text(TOO_BIG_MARK)
        row.click(force=True)  # a person's click on the disabled row changes nothing
        expect(choice(page, "pipeline/pytorch")).to_be_checked()
        expect(workstation).not_to_be_checked()

        # a form that still offers it (opened before the host was counted smaller, or
        # edited by hand) is sent anyway: the form comes back with why
        workstation.evaluate("radio => { radio.disabled = false; radio.checked = true; }")
        page.click(START)
        page.wait_for_load_state()
        expect(page.locator(".spawn-error-msg")).to_have_text(f"Error: {TOO_BIG_REFUSAL}")
        expect(choice(page, "pipeline/pytorch")).to_be_checked()
        v.shot("demo-form-refused")
        assert containers(docker_client, name) == []

        # a start through the REST API: the page the hub sends the person to says why
        assert demo_hub.spawn(name, {"profile": "workstation"}).status_code == 503
        page.goto(f"{demo_hub.url}/hub/spawn-pending/{name}")
        expect(page.locator("h1")).to_have_text("Spawn failed")
        expect(page.get_by_text(TOO_BIG_REFUSAL)).to_be_visible()
        v.shot("demo-spawn-failed")
        assert containers(docker_client, name) == []
