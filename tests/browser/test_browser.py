"""One real browser session: log in, pick a role and image, reach JupyterLab."""

from __future__ import annotations

import pytest
from browser import launch, log_in, wait_for_lab

from harness import ARTIFACTS, container_for

pytestmark = [pytest.mark.e2e, pytest.mark.browser]



@pytest.fixture(scope="module")
def browser():
    yield from launch()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    yield context.new_page()
    context.close()


def test_login_pick_role_and_image_reach_lab(hub, docker_client, page):
    name = "browser-bob"
    hub.create_user(name, ["ml-platform"])
    ARTIFACTS.mkdir(exist_ok=True)
    log_in(page, hub, name)
    page.click("#start")
    page.wait_for_url("**/hub/spawn**")

    # The form lists every (role, image) choice with its limits.
    choices = page.locator(".quota-choice")
    assert choices.count() == 3  # senior x {pytorch, paddle}, pipeline x pytorch
    pipeline = page.locator(".quota-choice[data-role=pipeline][data-image=pytorch]")
    assert "1 CPU · 2 GiB memory" in pipeline.inner_text()
    page.screenshot(path=str(ARTIFACTS / "spawn-form.png"))
    pipeline.click()
    page.click("form#spawn_form input[type=submit], form#spawn_form button[type=submit]")

    wait_for_lab(page, "first-start")
    page.screenshot(path=str(ARTIFACTS / "jupyterlab.png"))
    c = container_for(docker_client, name)
    assert c.labels["quota-spawner.role"] == "pipeline"
    assert c.attrs["HostConfig"]["Memory"] == 2 * 2**30
    hub.stop_server(name)


ADMIN_FORM = '''
c.QuotaSpawner.form_template = """
<div class="lab-form"><h3>Lab 3: pick one</h3>
{%- for c in choices %}
<label class="quota-choice"><input type="radio" name="{{ field }}" value="{{ c.key }}"
  {%- if c.checked %} checked{% endif %}> {{ c.role.title }} ({{ c.limits }})</label>
{%- endfor %}</div>
"""
'''


@pytest.mark.parametrize("template, shipped", [(ADMIN_FORM, False), (
    'c.QuotaSpawner.form_template = "{% for c in choices %}{{ c.role.title"', True)])
def test_an_admin_form_template_or_the_shipped_form_when_it_is_broken(
        docker_client, tmp_path, page, template, shipped):
    """What a person sees on the spawn page with the admin's template, and with a
    template that cannot be rendered: the shipped form, and the error in the log."""
    from harness import Hub, teardown

    hub = Hub(tmp_path, prefix=f"qsform{int(shipped)}", extra_config=template).start()
    try:
        hub.create_user("form-fay", ["ml-platform"])
        log_in(page, hub, "form-fay")
        page.goto(f"{hub.url}/hub/spawn")
        # ml-platform: senior-engineer x 2 images, pipeline, gpu-training x 2
        assert page.locator(".quota-choice").count() == 5
        if shipped:
            assert page.locator(".quota-spawner-form").count() == 1
            assert "QuotaSpawner.form_template cannot be rendered (line 1)" in hub.log()
        else:
            assert page.locator(".lab-form h3").inner_text() == "Lab 3: pick one"
            page.locator(".quota-choice", has_text="pipeline").click()
            page.click("form#spawn_form input[type=submit], "
                       "form#spawn_form button[type=submit]")
            wait_for_lab(page, "form-template")
            assert container_for(docker_client, "form-fay").labels[
                "quota-spawner.role"] == "pipeline"
    finally:
        teardown(hub, docker_client, f"form-{int(shipped)}")
