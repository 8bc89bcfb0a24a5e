"""The culler's arbiter hook and service definition, and the role fields it reads."""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from spawner.hubconfig.culling import CULLER_SCOPES, culler_service, make_arbiter, owner
from spawner.quota.loader import parse_quota_table
from spawner.quota.model import QuotaTableError

ROOT = Path(__file__).resolve().parents[2]
TABLE = """\
images:
  pt: {image: quota-spawner/pytorch:latest}
roles:
  quick: {cpus: 1, memory: 1G, images: [pt], idle_timeout: 20m}
  long-run: {cpus: 1, memory: 1G, images: [pt], max_age: 72h}
  plain: {cpus: 1, memory: 1G, images: [pt]}
assignments:
  default: [plain]
"""


def server(profile: str | None, started_ago: float, name: str = "", user: str = "ada") -> dict:
    started = datetime.now(timezone.utc) - timedelta(seconds=started_ago)
    return {
        "name": name,
        "url": f"/user/{user}/{name + '/' if name else ''}",
        "started": started.isoformat().replace("+00:00", "Z"),
        "user_options": {"profile": profile} if profile else {},
    }


@pytest.fixture
def arbiter(tmp_path):
    path = tmp_path / "quotas.yaml"
    path.write_text(TABLE)
    log = logging.getLogger("test-culling")
    return make_arbiter(str(path), log=log), path


def decide(arbiter, srv: dict, idle: float, limit: int = 1800) -> bool:
    return asyncio.run(arbiter(inactive=timedelta(seconds=idle), inactive_limit=limit, server=srv))


def test_role_idle_timeout_wins_over_the_default(arbiter, caplog):
    hook, _ = arbiter
    caplog.set_level(logging.INFO, "test-culling")
    assert not decide(hook, server("quick", 3000), idle=19 * 60)
    assert decide(hook, server("quick", 3000), idle=20 * 60)  # 20m, not the default 30m
    assert "Culling ada (role quick): idle for 00:20:00, idle_timeout 00:20:00" in caplog.text


def test_default_timeout_for_roles_without_one(arbiter):
    hook, _ = arbiter
    assert not decide(hook, server("plain", 9000), idle=29 * 60)
    assert decide(hook, server("plain", 9000), idle=30 * 60)
    # no role recorded (a server started before the table had roles): the default
    assert decide(hook, server(None, 9000), idle=30 * 60)
    # a role that is gone from the table: the default
    assert not decide(hook, server("deleted-role", 9000), idle=10 * 60)


def test_max_age_culls_even_an_active_server(arbiter, caplog):
    hook, _ = arbiter
    caplog.set_level(logging.INFO, "test-culling")
    assert not decide(hook, server("long-run", 71 * 3600), idle=5)
    assert decide(hook, server("long-run", 72 * 3600 + 5, name="train"), idle=5)
    assert "Culling ada/train (role long-run): reached max_age 72:00:00" in caplog.text


def test_default_max_age(tmp_path):
    path = tmp_path / "quotas.yaml"
    path.write_text(TABLE)
    hook = make_arbiter(str(path), default_max_age=3600)
    assert decide(hook, server("plain", 3601), idle=1)
    assert not decide(hook, server("plain", 3500), idle=1)
    # a role's own max_age wins over the default
    assert not decide(hook, server("long-run", 7200), idle=1)


def test_bad_table_edit_keeps_the_last_good_limits(arbiter):
    hook, path = arbiter
    assert decide(hook, server("quick", 3000), idle=20 * 60)
    path.write_text(TABLE.replace("idle_timeout: 20m", "idle_timeout: soon"))
    assert decide(hook, server("quick", 3000), idle=20 * 60)  # the last good table


def test_no_table_at_all_falls_back_to_defaults(tmp_path):
    hook = make_arbiter(str(tmp_path / "missing.yaml"))
    assert decide(hook, server("quick", 3000), idle=30 * 60)
    assert not decide(hook, server("quick", 3000), idle=20 * 60)


def test_owner_from_escaped_url():
    assert owner({"name": "", "url": "/user/o%27brien/"}) == "o'brien"
    assert owner({"name": "gpu", "url": "/user/bob/gpu/"}) == "bob/gpu"


def test_service_has_the_fewest_scopes():
    service, role = culler_service("/q.yaml", timeout=1800, cull_every=60, max_age=0)
    assert role["scopes"] == CULLER_SCOPES
    assert set(CULLER_SCOPES) == {"list:users", "read:users:activity", "read:servers",
                                  "delete:servers"}
    assert role["services"] == [service["name"]] == ["idle-culler"]
    command = service["command"]
    assert command[1:3] == ["-m", "jupyterhub_idle_culler"]
    assert "--timeout=1800" in command and "--cull-every=60" in command
    config = next(a for a in command if a.startswith("--config="))
    assert Path(config.split("=", 1)[1]).exists()
    assert service["environment"]["QUOTA_SPAWNER_QUOTA_FILE"] == "/q.yaml"


def test_hub_config_runs_the_culler_with_30_minutes(tmp_path, monkeypatch):
    from shipped_config import load_hub_config

    c = load_hub_config(tmp_path, monkeypatch, QUOTA_SPAWNER_DEMO="1")
    culler, watchdog, usage = c.JupyterHub.services
    assert (culler["name"], watchdog["name"], usage["name"]) == \
        ("idle-culler", "gpu-watchdog", "usage")
    # the culler tells the ledger why it culls; the watchdog folds samples into it
    ledger = c.QuotaSpawner.usage_db
    assert ledger == f"sqlite:///{tmp_path / 'quota-spawner-usage.sqlite'}"
    assert culler["environment"]["QUOTA_SPAWNER_USAGE_DB"] == ledger
    assert watchdog["environment"]["QUOTA_SPAWNER_USAGE_DB"] == ledger
    assert "--timeout=1800" in culler["command"] and "--cull-every=60" in culler["command"]
    assert c.JupyterHub.last_activity_interval == 60
    assert c.Spawner.environment["JUPYTERHUB_ACTIVITY_INTERVAL"] == "60"
    assert any(r["name"] == "idle-culler" and r["scopes"] == CULLER_SCOPES
               for r in c.JupyterHub.load_roles)


@pytest.mark.parametrize("field, value, message", [
    ("idle_timeout", "0", "idle_timeout must be at least 1 second, not 0"),
    ("idle_timeout", "soon", "idle_timeout: cannot read 'soon' as a duration"),
    ("max_age", "3d", "max_age: unknown unit 'd'"),
    ("max_age", "true", "max_age: expected a duration, got a boolean"),
])
def test_role_lifetimes_are_validated_with_their_line(field, value, message):
    text = TABLE.replace("  plain: {cpus: 1, memory: 1G, images: [pt]}",
                         f"  plain: {{cpus: 1, memory: 1G, images: [pt], {field}: {value}}}")
    with pytest.raises(QuotaTableError) as e:
        parse_quota_table(text, "q.yaml")
    assert f"q.yaml:6: role 'plain': {message}" in str(e.value)


def test_role_lifetimes_parse():
    roles = parse_quota_table(TABLE, "q.yaml").roles
    assert roles["quick"].idle_timeout == 1200 and roles["quick"].max_age is None
    assert roles["long-run"].max_age == 72 * 3600 and roles["plain"].idle_timeout is None
