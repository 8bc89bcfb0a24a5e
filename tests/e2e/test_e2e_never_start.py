"""End to end: a role that can never start on this host, on a hub counted as the machine
`make demo` runs on (``demo_hub``: its notebooks may reserve 7.2 CPUs and 21.2 GiB).

The spawn form shows it disabled with why and preselects a role that starts; a form sent
with it anyway comes back with the refusal's sentence, and nothing is created; a start of
it through the REST API is refused with the same sentence, which the pages the user then
lands on show too (docs/quota-table.md#the-spawn-form).
"""

from __future__ import annotations

import html
import json
import re

import pytest
from hubs import TOO_BIG_MARK, TOO_BIG_QUOTAS, TOO_BIG_REFUSAL, on_hub

from harness import containers

pytestmark = pytest.mark.e2e

NAME = "nora"


@pytest.fixture(scope="module")
def demo(demo_hub):
    with on_hub(demo_hub, TOO_BIG_QUOTAS, {NAME: []}) as hub:
        yield hub


def radios(page: str) -> dict[str, str]:
    """The form's radio buttons: their value -> the whole tag."""
    return {re.search(r'value="([^"]*)"', tag).group(1): tag
            for tag in re.findall(r'<input class="form-check-input[^>]*>', page)}


def error_on(page: str) -> str:
    """The spawn page's error line, as text."""
    found = re.search(r'<p class="spawn-error-msg[^"]*">(.*?)</p>', page, re.S)
    return html.unescape(found.group(1)).strip() if found else ""


def test_the_form_disables_it_says_why_and_preselects_a_role_that_starts(demo):
    page = demo.login(NAME).get(f"{demo.url}/hub/spawn", timeout=30)
    assert page.status_code == 200
    found = radios(page.text)
    assert " disabled" in found["workstation/pytorch"]
    assert " checked" not in found["workstation/pytorch"]
    assert " checked" in found["pipeline/pytorch"] and " disabled" not in found["pipeline/pytorch"]
    assert TOO_BIG_MARK in html.unescape(page.text)


def test_a_form_sent_with_it_comes_back_with_the_sentence_and_nothing_is_created(
        demo, docker_client):
    browser = demo.login(NAME)
    browser.get(f"{demo.url}/hub/spawn", timeout=30)
    sent = browser.post(f"{demo.url}/hub/spawn", timeout=60, data={
        "choice": "workstation/pytorch", "_xsrf": browser.cookies.get("_xsrf")})
    assert sent.status_code == 503
    assert error_on(sent.text) == f"Error: {TOO_BIG_REFUSAL}"
    assert "pipeline/pytorch" in radios(sent.text)  # the form again, to choose another
    assert containers(docker_client, NAME) == []
    assert demo.user(NAME)["servers"] == {}


def test_an_api_start_is_refused_and_the_page_the_user_lands_on_says_why(demo, docker_client):
    r = demo.spawn(NAME, {"profile": "workstation"})
    assert (r.status_code, r.json()["message"]) == (503, TOO_BIG_REFUSAL)
    assert containers(docker_client, NAME) == []
    browser = demo.login(NAME)
    # where the hub sends a person whose start failed: "Spawn failed", now with why
    landed = browser.get(f"{demo.url}/hub/spawn-pending/{NAME}", timeout=30)
    assert landed.status_code == 503
    assert "Spawn failed" in landed.text and TOO_BIG_REFUSAL in html.unescape(landed.text)
    progress = demo.api("GET", f"/users/{NAME}/server/progress", token=demo.user_token(NAME))
    events = [json.loads(line[len("data:"):]) for line in progress.text.splitlines()
              if line.startswith("data:")]
    assert events[-1]["failed"] and events[-1]["message"] == f"Spawn failed: {TOO_BIG_REFUSAL}"
    # a start that names no role takes the first that can start: pipeline
    demo.start_server(NAME, {})
    assert demo.user(NAME)["servers"][""]["user_options"]["profile"] == "pipeline"
    demo.stop_server(NAME)
