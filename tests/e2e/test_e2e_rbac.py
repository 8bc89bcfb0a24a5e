"""Instructors manage the servers of their own class, and nobody else's."""

from __future__ import annotations

import html
import re

import pytest

from harness import containers

pytestmark = pytest.mark.e2e


def test_instructor_manages_own_class_only(hub, docker_client):
    # prof-x is instructor of lab1 (conftest: instructor_roles({'lab1': ['prof-x']}))
    hub.create_user("prof-x")
    hub.create_user("lab-student", ["lab1"])
    hub.create_user("outsider", ["other-class"])
    token = hub.user_token("prof-x")

    # list: only the class's members
    r = hub.api("GET", "/users", token=token)
    assert r.status_code == 200
    assert {u["name"] for u in r.json()} == {"lab-student"}
    assert hub.api("GET", "/users/outsider", token=token).status_code == 404

    # start a student's server, open it, stop it
    r = hub.spawn("lab-student", {}, token=token)
    assert r.status_code in (201, 202), r.text
    hub.wait_ready("lab-student")
    assert len(containers(docker_client, "lab-student", all=False)) == 1
    # Opening goes through the hub's OAuth, which resolves group scopes.
    # (A singleuser server cannot resolve a token's group filter itself.)
    browser = hub.login("prof-x")
    r = browser.get(f"{hub.url}/user/lab-student/lab", timeout=30)
    assert "/hub/api/oauth2/authorize" in r.url  # access to someone else's server: confirm
    fields = re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)"', r.text)
    r = browser.post(r.url, data=[(k, html.unescape(v)) for k, v in fields], timeout=30)
    assert r.status_code == 200 and r.url.startswith(f"{hub.url}/user/lab-student/lab"), r.url
    assert browser.get(f"{hub.url}/user/lab-student/api/status", timeout=10).status_code == 200

    # refused: anyone outside the class
    r = hub.spawn("outsider", {}, token=token)
    assert r.status_code in (403, 404), r.text
    assert containers(docker_client, "outsider") == []
    hub.start_server("outsider")
    r = browser.get(f"{hub.url}/user/outsider/lab", timeout=30)
    assert r.status_code == 403, (r.status_code, r.url)  # no confirm page: refused outright
    assert browser.get(f"{hub.url}/user/outsider/api/status", timeout=10).status_code == 403
    r = hub.api("DELETE", "/users/outsider/server", token=token)
    assert r.status_code in (403, 404)
    assert hub.user("outsider")["servers"][""]["ready"]

    r = hub.api("DELETE", "/users/lab-student/server", token=token)
    assert r.status_code in (202, 204), r.text
    hub.wait_stopped("lab-student")
    hub.stop_server("outsider")

    # a student token is no instructor token
    student = hub.user_token("lab-student")
    assert hub.spawn("outsider", {}, token=student).status_code in (403, 404)
