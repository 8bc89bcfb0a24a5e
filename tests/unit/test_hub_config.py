"""The shipped hub config, hub image and compose file: no default passwords, loopback first."""

from __future__ import annotations

import pytest
import yaml
from shipped_config import GOOD_ADMIN, GOOD_USER, HUB_CONFIG, load_hub_config

from spawner.hubconfig.passwords import DEMO_ADMIN_PASSWORD, DEMO_PASSWORD, password_problems


@pytest.mark.parametrize("env, words", [
    ({}, "QUOTA_SPAWNER_DEMO_PASSWORD is not set"),
    ({"QUOTA_SPAWNER_DEMO_PASSWORD": GOOD_USER}, "QUOTA_SPAWNER_DEMO_ADMIN_PASSWORD is not set"),
    ({"QUOTA_SPAWNER_DEMO_PASSWORD": DEMO_PASSWORD,
      "QUOTA_SPAWNER_DEMO_ADMIN_PASSWORD": DEMO_ADMIN_PASSWORD}, "the published demo password"),
    ({"QUOTA_SPAWNER_DEMO_PASSWORD": GOOD_USER,
      "QUOTA_SPAWNER_DEMO_ADMIN_PASSWORD": "short"}, "fewer than 32 characters"),
    ({"QUOTA_SPAWNER_DEMO_PASSWORD": GOOD_ADMIN,
      "QUOTA_SPAWNER_DEMO_ADMIN_PASSWORD": GOOD_ADMIN}, "the same"),
])
def test_hub_refuses_to_start_without_real_passwords(tmp_path, monkeypatch, env, words):
    with pytest.raises(SystemExit) as info:
        load_hub_config(tmp_path, monkeypatch, **env)
    assert "Refusing to start" in str(info.value) and words in str(info.value)


def test_hub_starts_with_real_passwords(tmp_path, monkeypatch):
    c = load_hub_config(tmp_path, monkeypatch, QUOTA_SPAWNER_DEMO_PASSWORD=GOOD_USER,
                        QUOTA_SPAWNER_DEMO_ADMIN_PASSWORD=GOOD_ADMIN)
    assert c.SharedPasswordAuthenticator.user_password == GOOD_USER
    assert c.SharedPasswordAuthenticator.admin_password == GOOD_ADMIN
    assert c.JupyterHub.bind_url == "http://127.0.0.1:8000"


def test_demo_mode_uses_the_published_passwords(tmp_path, monkeypatch):
    c = load_hub_config(tmp_path, monkeypatch, QUOTA_SPAWNER_DEMO="1")
    assert c.SharedPasswordAuthenticator.user_password == DEMO_PASSWORD
    assert c.QuotaSpawner.network_name == "host" and c.JupyterHub.hub_ip == "127.0.0.1"


def test_hub_id_can_be_set_for_compose(tmp_path, monkeypatch):
    c = load_hub_config(tmp_path, monkeypatch, QUOTA_SPAWNER_DEMO="1",
                        QUOTA_SPAWNER_HUB_ID="lab-hub")
    assert c.QuotaSpawner.hub_id == "lab-hub"


def test_password_rules():
    assert password_problems(GOOD_USER, GOOD_ADMIN) == []
    assert password_problems("", "") == ["QUOTA_SPAWNER_DEMO_PASSWORD is not set",
                                         "QUOTA_SPAWNER_DEMO_ADMIN_PASSWORD is not set"]
    assert "fewer than 8" in password_problems("short", GOOD_ADMIN)[0]


def test_hub_image_has_no_default_passwords():
    dockerfile = (HUB_CONFIG / "Dockerfile.hub").read_text()
    assert "PASSWORD" not in dockerfile and "QUOTA_SPAWNER_DEMO" not in dockerfile
    assert DEMO_PASSWORD not in dockerfile and DEMO_ADMIN_PASSWORD not in dockerfile
    assert '"/src[postgresql]"' in dockerfile  # a ledger on PostgreSQL needs psycopg


def test_compose_faces_only_loopback_and_needs_passwords():
    compose = yaml.safe_load((HUB_CONFIG / "compose.yaml").read_text())
    hub = compose["services"]["hub"]
    # the hub shares the host's network: the proxy binds where BIND_URL says
    # (loopback unless told), the hub's API binds on the notebook bridge's gateway
    assert hub["network_mode"] == "host" and "ports" not in hub
    env = hub["environment"]
    assert env["QUOTA_SPAWNER_BIND_URL"].startswith("${QUOTA_SPAWNER_BIND_URL:-http://127.0.0.1:")
    assert env["QUOTA_SPAWNER_NETWORK"] == "quota-spawner"
    assert ":?" in env["QUOTA_SPAWNER_DEMO_PASSWORD"]
    assert ":?" in env["QUOTA_SPAWNER_DEMO_ADMIN_PASSWORD"]
    assert "QUOTA_SPAWNER_HUB_ID" in env
    assert not any("HUB_IP" in key for key in env)  # the config binds the gateway


def test_the_hub_runs_the_watchdog_with_the_fewest_scopes(tmp_path, monkeypatch):
    from spawner.watchdog.service import WATCHDOG_SCOPES

    c = load_hub_config(tmp_path, monkeypatch, QUOTA_SPAWNER_DEMO="1")
    watchdog = next(s for s in c.JupyterHub.services if s["name"] == "gpu-watchdog")
    assert watchdog["command"][1:] == ["-m", "spawner.watchdog"]
    assert watchdog["environment"]["JUPYTERHUB_PUBLIC_URL"] == "http://127.0.0.1:8000"
    assert watchdog["environment"]["QUOTA_SPAWNER_WATCHDOG_CONFIG"].endswith(
        "hub_config/watchdog_config.py")
    role = next(r for r in c.JupyterHub.load_roles if r["name"] == "gpu-watchdog")
    assert role["scopes"] == WATCHDOG_SCOPES == ["list:users", "read:users:groups",
                                                 "read:servers"]
    off = load_hub_config(tmp_path, monkeypatch, QUOTA_SPAWNER_DEMO="1",
                          QUOTA_SPAWNER_WATCHDOG="0")
    assert "gpu-watchdog" not in [s["name"] for s in off.JupyterHub.services]


def test_an_external_watchdog_needs_a_real_token(tmp_path, monkeypatch):
    with pytest.raises(SystemExit, match="QUOTA_SPAWNER_WATCHDOG_TOKEN"):
        load_hub_config(tmp_path, monkeypatch, QUOTA_SPAWNER_DEMO="1",
                        QUOTA_SPAWNER_WATCHDOG="external", QUOTA_SPAWNER_WATCHDOG_TOKEN="short")
    token = "f" * 64
    c = load_hub_config(tmp_path, monkeypatch, QUOTA_SPAWNER_DEMO="1",
                        QUOTA_SPAWNER_WATCHDOG="external", QUOTA_SPAWNER_WATCHDOG_TOKEN=token)
    assert {"name": "gpu-watchdog", "api_token": token} in c.JupyterHub.services


def test_an_external_usage_service_is_registered_with_its_token_and_the_hubs_id(
        tmp_path, monkeypatch):
    """The hub does not start it (no command, no environment of the hub's): its URL, its
    token and its OAuth client are the managed service's; the hub's id the config sets
    reaches the services, which key their shared rows by it."""
    with pytest.raises(SystemExit, match="QUOTA_SPAWNER_USAGE_TOKEN"):
        load_hub_config(tmp_path, monkeypatch, QUOTA_SPAWNER_DEMO="1",
                        QUOTA_SPAWNER_USAGE="external", QUOTA_SPAWNER_USAGE_TOKEN="short")
    token = "e" * 64
    c = load_hub_config(tmp_path, monkeypatch, QUOTA_SPAWNER_DEMO="1",
                        QUOTA_SPAWNER_USAGE="external", QUOTA_SPAWNER_USAGE_TOKEN=token,
                        QUOTA_SPAWNER_USAGE_URL="http://usage.example.org:8182",
                        QUOTA_SPAWNER_HUB_ID="lab-hub")
    usage = next(s for s in c.JupyterHub.services if s["name"] == "usage")
    assert usage["api_token"] == token and usage["url"] == "http://usage.example.org:8182"
    assert "command" not in usage and "environment" not in usage
    assert usage["oauth_no_confirm"] and "custom:quota-spawner:usage" in \
        usage["oauth_client_allowed_scopes"]
    watchdog = next(s for s in c.JupyterHub.services if s["name"] == "gpu-watchdog")
    assert watchdog["environment"]["QUOTA_SPAWNER_HUB_ID"] == "lab-hub"


def test_a_hub_id_set_in_the_config_reaches_the_managed_services(tmp_path, monkeypatch):
    from spawner.watchdog.service import watchdog_service
    from spawner.webapp.app import webapp_service

    usage, _, _ = webapp_service("http://hub", "sqlite:///u.sqlite", "q.yaml", hub_id="h-1",
                                secret_file="/srv/secret", prefix="quota")
    watchdog, _ = watchdog_service("http://hub", hub_id="h-1", secret_file="/srv/secret")
    for env in (usage["environment"], watchdog["environment"]):
        assert env["QUOTA_SPAWNER_HUB_ID"] == "h-1"
        assert env["QUOTA_SPAWNER_HUB_SECRET_FILE"] == "/srv/secret"
    monkeypatch.setenv("JUPYTERHUB_COOKIE_SECRET", "ab" * 32)  # the id, never the secret
    usage, _, _ = webapp_service("http://hub", "sqlite:///u.sqlite", "q.yaml")
    assert usage["environment"]["QUOTA_SPAWNER_HUB_ID"].startswith("quota-")
    assert "ab" * 32 not in str(usage)


def test_compose_runs_the_watchdog_with_the_hosts_pids_and_cgroups():
    compose = yaml.safe_load((HUB_CONFIG / "compose.yaml").read_text())
    hub, watchdog = compose["services"]["hub"], compose["services"]["watchdog"]
    assert hub["environment"]["QUOTA_SPAWNER_WATCHDOG"] == "external"
    assert ":?" in hub["environment"]["QUOTA_SPAWNER_WATCHDOG_TOKEN"]
    assert watchdog["command"] == ["quota-spawner", "watchdog"]
    assert (watchdog["pid"], watchdog["cgroup"], watchdog["network_mode"]) == ("host",) * 3
    assert "/sys/fs/cgroup:/sys/fs/cgroup:ro" in watchdog["volumes"]
    devices = watchdog["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": "all", "capabilities": ["utility"]}]


def test_the_watchdog_derives_the_hubs_own_id(tmp_path, monkeypatch):
    from spawner.policy.config import hub_id_from_secret, hub_id_from_secret_file

    c = load_hub_config(tmp_path, monkeypatch, QUOTA_SPAWNER_DEMO="1")
    env = next(s for s in c.JupyterHub.services if s["name"] == "gpu-watchdog")["environment"]
    assert env["QUOTA_SPAWNER_HUB_SECRET_FILE"] == c.JupyterHub.cookie_secret_file
    assert env["QUOTA_SPAWNER_STATE_DIR"] == str(tmp_path)
    secret = bytes(range(32))
    (tmp_path / "secret").write_text(secret.hex() + "\n")  # as JupyterHub writes it
    assert hub_id_from_secret_file("quota", str(tmp_path / "secret")) == \
        hub_id_from_secret("quota", secret)
    assert hub_id_from_secret_file("quota", str(tmp_path / "missing")) is None


def test_a_secret_from_the_environment_becomes_the_watchdogs_hub_id(tmp_path, monkeypatch):
    from spawner.policy.config import hub_id_from_secret

    secret = "ab" * 32
    c = load_hub_config(tmp_path, monkeypatch, QUOTA_SPAWNER_DEMO="1",
                        JUPYTERHUB_COOKIE_SECRET=secret)
    env = next(s for s in c.JupyterHub.services if s["name"] == "gpu-watchdog")["environment"]
    assert env["QUOTA_SPAWNER_HUB_ID"] == hub_id_from_secret("quota", bytes.fromhex(secret))
    assert secret not in str(env)  # the id goes to the watchdog, never the secret


def test_the_usage_service_reads_the_hubs_users_with_its_own_role(tmp_path, monkeypatch):
    c = load_hub_config(tmp_path, monkeypatch, QUOTA_SPAWNER_DEMO="1")
    assert "usage" in [s["name"] for s in c.JupyterHub.services]
    role = next(r for r in c.JupyterHub.load_roles if r["name"] == "usage-service")
    assert role["services"] == ["usage"]
    assert role["scopes"] == ["list:users", "read:users:groups", "read:servers",
                              "servers!group=cs101"]  # the class dashboard's pre-warms
    assert "usage-viewer" in [r["name"] for r in c.JupyterHub.load_roles]
    off = load_hub_config(tmp_path, monkeypatch, QUOTA_SPAWNER_DEMO="1",
                          QUOTA_SPAWNER_USAGE_URL="0")
    assert "usage-service" not in [r["name"] for r in off.JupyterHub.load_roles]
